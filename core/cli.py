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
from core.errors import ConfigError, IbexError

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


#: name -> (how to add its parser, "module:function" that runs it)
COMMANDS: dict[str, tuple[Callable[[Any], None], str]] = {
    "migrate": (_add_migrate, "core.cli:run_migrate"),
    "import": (_add_import, "core.cli:run_import"),
}


def register(name: str, add_parser: Callable[[Any], None], target: str) -> None:
    """Add a command: ``add_parser(subparsers)`` and the ``module:function`` that runs it."""
    COMMANDS[name] = (add_parser, target)


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
        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(args, settings))
    except ConfigError as exc:
        print(f"ibex: configuration error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except IbexError as exc:
        print(f"ibex {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("ibex: interrupted", file=sys.stderr)
        return 130


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
    from core.progress import Progress
    from models.importer import import_lines
    from models.store import SessionStore

    store = SessionStore.from_url(settings.require_database_url())
    if args.file == "-":
        stream = sys.stdin
        close = False
    else:
        try:
            stream = open(args.file, encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            print(f"ibex import: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return EXIT_FAILURE
        close = True
    progress = Progress("importing")
    try:
        report = import_lines(
            store,
            stream,
            lambda r: progress.update(
                r.lines,
                f"{r.sessions_created + r.sessions_extended} sessions, "
                f"{r.turns_added} turns, {r.lines_rejected} rejected",
            ),
        )
    except UnicodeDecodeError as exc:
        progress.close()
        print(f"ibex import: the file is not UTF-8 text: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if close:
            stream.close()
    progress.close()
    for error in report.errors:
        print(f"ibex import: {error}", file=sys.stderr)
    print(report.summary())
    return EXIT_FAILURE if report.errors else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    # Run the imported module, not __main__: extensions register their commands on core.cli.
    from core.cli import main as _main

    sys.exit(_main())
