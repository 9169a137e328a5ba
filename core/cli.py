"""``ibex``: the operators' command line (DESIGN section 8).

Exit status 0 on success, 1 on failure, 2 on usage errors. Each command imports what it needs
when it runs, so ``ibex migrate`` does not load the worker and the broker.

Commands are listed in :data:`COMMANDS`; a command's implementation lives beside the part of
the system it operates (``memory_service.cli``, ``actors.cli``, ...) and is called as
``run(args, settings) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from core.config import Settings
from core.errors import ConfigError, DatabaseUnavailableError, IbexError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _add_migrate(sub: Any) -> None:
    sub.add_parser("migrate", help="apply the SQL migrations (idempotent)")


def _add_import(sub: Any) -> None:
    p = sub.add_parser("import", help="import sessions from a JSON Lines file ('-' for stdin)")
    p.add_argument("file", help="path of the .jsonl file, or - for standard input")
    p.add_argument(
        "--max-line-bytes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="reject lines longer than N bytes (default 16777216, 16 MiB)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a stable JSON document: counts, each imported and each rejected line",
    )


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return number


#: name -> (how to add its parser, "module:function" that runs it)
COMMANDS: dict[str, tuple[Callable[[Any], None], str]] = {
    "migrate": (_add_migrate, "core.cli:run_migrate"),
    "import": (_add_import, "core.cli:run_import"),
}


#: Commands that run without a migrated database; every other one checks the schema first.
NO_DATABASE: set[str] = {"migrate"}


def register(
    name: str, add_parser: Callable[[Any], None], target: str, *, database: bool = True
) -> None:
    """Add a command: ``add_parser(subparsers)`` and the ``module:function`` that runs it.
    ``database=False`` for a command that does not need the migrated database."""
    COMMANDS[name] = (add_parser, target)
    if not database:
        NO_DATABASE.add(name)
    else:
        NO_DATABASE.discard(name)


def build_parser() -> argparse.ArgumentParser:
    _load_extensions()
    parser = _Parser(prog="ibex", description="IBEX extraction pipeline")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add_parser, _ in COMMANDS.values():
        add_parser(sub)
    return parser


#: Modules that register further commands when present (each calls :func:`register`).
EXTENSIONS = (
    "memory_service.commands",
    "memory_service.search_commands",
    "actors.commands",
    "extraction.commands",
)


def _load_extensions() -> None:
    for name in EXTENSIONS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _, target = COMMANDS[args.command]
    module_name, _, func_name = target.partition(":")
    try:
        settings = Settings.from_env()
        if args.command not in NO_DATABASE:
            from core.migrate import check_schema

            check_schema(settings.require_database_url())
        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(args, settings))
    except ConfigError as exc:
        print(f"ibex: configuration error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except DatabaseUnavailableError as exc:
        # Lost mid-command (the check above passed): psycopg2's text runs to several lines.
        print(f"ibex {args.command}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except IbexError as exc:
        print(f"ibex {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("ibex: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        line = database_error_line(exc)
        if line is None:
            raise
        logging.getLogger("ibex").debug("%s failed", args.command, exc_info=True)  # with -v
        print(f"ibex {args.command}: {line}", file=sys.stderr)
        return EXIT_FAILURE


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


#: SQLSTATEs that mean the schema is older than the code: undefined table, column, function,
#: object (a role), schema.
_SCHEMA_STATES = {"42P01", "42703", "42883", "42704", "3F000"}


def database_error_line(exc: BaseException) -> str | None:
    """One line for a database error that escaped a command (peewee or psycopg2), or None when
    ``exc`` is not one: the boundary where the command line translates them."""
    import peewee
    import psycopg2

    if not isinstance(exc, peewee.DatabaseError | peewee.InterfaceError | psycopg2.Error):
        return None
    cause = exc if isinstance(exc, psycopg2.Error) else (exc.__cause__ or exc)
    detail = " ".join(str(cause).split()).split(" LINE ")[0].split(" CONTEXT: ")[0]
    detail = detail or type(cause).__name__
    if getattr(cause, "pgcode", None) in _SCHEMA_STATES:
        return f"the database schema is not current ({detail}): run `ibex migrate`"
    if isinstance(cause, psycopg2.OperationalError | peewee.OperationalError):
        return f"database unavailable: {detail}"
    return f"database error: {detail}"


def run_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from core.migrate import migrate

    applied = migrate(settings.require_database_url())
    if applied:
        for name in applied:
            print(f"applied {name}")
    else:
        print("database is up to date")
    return EXIT_OK


def run_import(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from core.progress import Progress
    from models.importer import MAX_LINE_BYTES, ImportStopped, import_lines, read_lines
    from models.store import SessionStore

    store = SessionStore.from_url(settings.require_database_url())
    if args.file == "-":
        stream = sys.stdin.buffer
        close = False
    else:
        try:
            stream = open(args.file, "rb")  # noqa: SIM115
        except OSError as exc:
            print(f"ibex import: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return EXIT_FAILURE
        close = True
    progress = Progress("importing")
    stopped: ImportStopped | None = None
    try:
        report = import_lines(
            store,
            read_lines(stream, args.max_line_bytes or MAX_LINE_BYTES),
            lambda r: progress.update(
                r.lines,
                f"{r.sessions_created + r.sessions_extended} sessions, "
                f"{r.turns_added} turns, {r.lines_rejected} rejected",
            ),
            keep_lines=args.json,
        )
    except ImportStopped as exc:
        stopped, report = exc, exc.report
    except OSError as exc:
        print(f"ibex import: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        progress.close()
        if close:
            stream.close()
    if args.json:
        document = report.as_json()
        document["stopped"] = (
            {"line": stopped.line, "error": str(stopped)} if stopped is not None else None
        )
        print(json.dumps(document, sort_keys=True))
    else:
        for error in report.errors:
            print(f"ibex import: {error}", file=sys.stderr)
        print(report.summary())
    if stopped is not None:
        print(_stopped_message(stopped.line, str(stopped)), file=sys.stderr)
    return EXIT_FAILURE if report.errors or stopped is not None else EXIT_OK


def _stopped_message(line: int, reason: str) -> str:
    if line <= 1:
        return f"ibex import: stopped at line 1, nothing was imported: {reason}"
    done = "line 1" if line == 2 else f"lines 1-{line - 1}"
    return (
        f"ibex import: stopped at line {line}; what {done} imported is committed,"
        f" re-run the import to finish: {reason}"
    )


if __name__ == "__main__":  # pragma: no cover
    # Run the imported module, not __main__: extensions register their commands on core.cli.
    from core.cli import main as _main

    sys.exit(_main())
