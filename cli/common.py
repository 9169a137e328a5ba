"""What several commands share: exit codes, argument types, the ``--session`` options.

Nothing here imports more than the standard library and :mod:`core`, so every command module
can import it without loading the broker or the database drivers.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from core.config import Settings
from core.errors import RowNotFoundError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

T = TypeVar("T")


class Command(Protocol):
    """What a command module of this package provides."""

    #: Whether the migrated database is checked before ``run``.
    DATABASE: bool

    def add_parser(self, sub: Any) -> None:
        """Add the command's parser to the ``ibex`` subparsers ``sub``."""

    def run(self, args: argparse.Namespace, settings: Settings) -> int:
        """Run the command; return its exit status."""


def positive_int(value: str) -> int:
    """argparse type of a count: a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return number


def add_session_args(p: Any) -> None:
    """``--session ID`` (the session's external id or its UUID) and the ``--org`` and
    ``--agent`` slugs that pick one when an external id is used in several places."""
    p.add_argument(
        "--session", metavar="ID", type=session_id_arg, help="only this session (id or UUID)"
    )
    p.add_argument("--org", metavar="SLUG", help="the session's org, when --session is ambiguous")
    p.add_argument("--agent", metavar="SLUG", help="the session's agent, when ambiguous")


def session_id_arg(value: str) -> str:
    """argparse type of ``--session``: an empty or overlong id is a usage error (status 2)."""
    value = value.strip()
    if not value or len(value) > 512:
        raise argparse.ArgumentTypeError(f"not a session id: {value!r}")
    return value


def resolve_session(store: Any, args: argparse.Namespace) -> uuid.UUID | None:
    """The session ``--session`` names (with ``--org``/``--agent``), or None without it.
    Raises :class:`~core.errors.RowNotFoundError` when it names none or several."""
    if args.session is None:
        if args.org or args.agent:
            raise RowNotFoundError("--org and --agent narrow --session: give --session too")
        return None
    found = store.find_sessions(args.session, org=args.org, agent=args.agent)
    narrowed = "".join(
        f" {flag} {value}"
        for flag, value in (("--org", args.org), ("--agent", args.agent))
        if value
    )
    if not found:
        raise RowNotFoundError(f"no session {args.session!r}{narrowed}")
    if len(found) > 1:
        raise RowNotFoundError(
            f"session {args.session!r}{narrowed} is ambiguous: "
            + ", ".join(str(name) for name in found)
            + "; add --org and/or --agent"
        )
    return uuid.UUID(str(found[0].session_id))


__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "Command",
    "add_session_args",
    "positive_int",
    "resolve_session",
    "session_id_arg",
]


def print_json_or_empty(
    rows: Sequence[T], *, as_json: bool, to_json: Callable[[T], Any], empty: str
) -> bool:
    """The two answers a listing command gives before its table: every row as a JSON array
    (with ``--json``), or ``empty`` when there is no row. True when it printed one of them."""
    if as_json:
        print(json.dumps([to_json(row) for row in rows], indent=2, sort_keys=True))
        return True
    if not rows:
        print(empty)
        return True
    return False
