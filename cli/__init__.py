"""``ibex``: the operators' command line, the top layer (it may import every package below,
``actors`` included, each command inside the function that runs it; nothing imports it).

Exit status 0 on success, 1 on failure, 2 on usage errors. Every command is a module of this
package, listed in :data:`COMMANDS`: ``add_parser(subparsers)``, ``run(args, settings) -> int``
and ``DATABASE`` (whether the migrated database is checked before it runs). A command module
imports only the standard library, :mod:`core` and :mod:`schema` at import time, and what it
operates inside ``run``, so ``ibex migrate`` and ``ibex import`` never load Dramatiq or build
a broker.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import Sequence

from cli import (
    budget,
    demo,
    dlq,
    extract,
    imports,
    mcp,
    migrate,
    prune,
    reembed,
    scan,
    scheduler,
    search,
    session,
    status,
    tokens,
    up,
    usage,
    user,
)
from cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Command
from core.config import Settings
from core.errors import ConfigError, DatabaseUnavailableError, IbexError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


#: The commands, in the order ``ibex --help`` lists them.
COMMANDS: dict[str, Command] = {
    "migrate": migrate,
    "import": imports,
    "token": tokens,
    "user": user,
    "search": search,
    "session": session,
    "usage": usage,
    "budget": budget,
    "scan": scan,
    "extract": extract,
    "scheduler": scheduler,
    "status": status,
    "dlq": dlq,
    "prune": prune,
    "reembed": reembed,
    "demo": demo,
    "up": up,
    "mcp": mcp,
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ibex", description="IBEX extraction pipeline")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    command = COMMANDS[args.command]
    try:
        settings = Settings.from_env()
        if command.DATABASE:
            from core.migrate import check_schema

            check_schema(settings.require_database_url())
        return int(command.run(args, settings))
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


def entry() -> int:
    """The ``ibex`` console script and ``python -m cli``: :func:`main`, in a process that ends
    when it returns. Before it ends, every object is frozen out of the garbage collector: the
    interpreter's last collections would otherwise walk all the objects the command's imports
    made (Dramatiq, the Redis and Postgres clients, the schemas), only to free memory the exit
    frees anyway; that is about 80 ms of a short command such as ``ibex scan`` on an idle
    2-core machine, and more on a busy one. Atexit handlers (the traces' flush among them) and
    the modules' teardown still run. Not for :func:`main`'s in-process callers (tests):
    frozen objects are never collected."""
    status = main()
    gc.freeze()
    return status


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


__all__ = [
    "COMMANDS",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "database_error_line",
    "main",
]
