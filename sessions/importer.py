"""``ibex import``: sessions from JSON Lines, each line all or nothing.

A line is one session. Missing orgs and agents are created by slug, a missing user by the
application's key (``user``; ``user_id`` names an existing one); ``turns[i]`` becomes turn
i+1; a re-imported session gains only its new turns and keeps its extraction pointer; a stored
turn offered with different content is refused. Every line is checked on its own (size,
encoding, JSON, nesting, characters, fields): a bad line is reported with its number and the
rest of the file still imports. Losing the database is different: it stops the import at that
line with :class:`ImportStopped`, which carries the report of the lines before it (committed).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import peewee

from core.db import db_errors, enter_tenant
from core.errors import DatabaseUnavailableError, IbexError
from schema.imports import MAX_LINE_BYTES, parse_session_line
from sessions.store import SessionStore
from sessions.turns import TurnInput

#: SQLSTATEs that mean the schema is missing or older than this code: no line can succeed.
_SCHEMA_MISSING = {"3F000", "42P01", "42883", "42703"}

#: SQLSTATEs of a transaction that lost a race with a concurrent one (serialization failure,
#: deadlock): the line is tried again, up to this many times in all, before it stops the import.
_CONFLICT = {"40001", "40P01"}
LINE_ATTEMPTS = 3


@dataclass(frozen=True)
class OversizeLine:
    """A line longer than the limit, skipped unread; ``size`` is its length in bytes."""

    size: int
    limit: int


def read_lines(
    stream: BinaryIO, max_bytes: int = MAX_LINE_BYTES, chunk: int = 1 << 16
) -> Iterator[bytes | OversizeLine]:
    """The lines of ``stream`` without their ``\\n``; a line longer than ``max_bytes`` comes as
    an :class:`OversizeLine` and is skipped in ``chunk``-sized reads, never held whole."""
    while True:
        data = stream.readline(max_bytes + 1)
        if not data:
            return
        if data.endswith(b"\n"):
            yield data[:-1]
            continue
        if len(data) <= max_bytes:  # the last line, without a line ending
            yield data
            continue
        size = len(data)
        while True:
            more = stream.readline(chunk)
            if not more:
                break
            if more.endswith(b"\n"):
                size += len(more) - 1
                break
            size += len(more)
        yield OversizeLine(size, max_bytes)


@dataclass(frozen=True)
class LineError:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True)
class ImportedLine:
    """What one good line did: its session and whether it was created, extended or unchanged."""

    line: int
    org: str
    agent: str
    session: str
    session_id: uuid.UUID
    result: str
    turns_added: int

    def as_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "org": self.org,
            "agent": self.agent,
            "session": self.session,
            "session_id": str(self.session_id),
            "result": self.result,
            "turns_added": self.turns_added,
        }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass
class ImportReport:
    lines: int = 0
    sessions_created: int = 0
    sessions_extended: int = 0
    sessions_unchanged: int = 0
    turns_added: int = 0
    errors: list[LineError] = field(default_factory=list)
    #: One entry per imported line, kept only when asked for (``keep_lines=True``).
    imported: list[ImportedLine] = field(default_factory=list)

    @property
    def lines_rejected(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        return (
            f"{_count(self.sessions_created, 'session')} created, {self.sessions_extended}"
            f" extended, {self.sessions_unchanged} unchanged,"
            f" {_count(self.turns_added, 'turn')} added,"
            f" {_count(self.lines_rejected, 'line')} rejected"
        )

    def as_json(self) -> dict[str, Any]:
        """The stable JSON document of ``ibex import --json`` (without ``stopped``)."""
        return {
            "lines": self.lines,
            "sessions_created": self.sessions_created,
            "sessions_extended": self.sessions_extended,
            "sessions_unchanged": self.sessions_unchanged,
            "turns_added": self.turns_added,
            "lines_rejected": self.lines_rejected,
            "imported": [line.as_json() for line in self.imported],
            "rejected": [{"line": e.line, "error": e.message} for e in self.errors],
        }


class ImportStopped(DatabaseUnavailableError):
    """The database went away (or cannot take any line): the import stopped at ``line``.

    Lines before it were committed and are in ``report``; nothing of ``line`` was, unless the
    connection was lost during its commit. Re-running the import is safe either way: lines
    already imported come out unchanged."""

    def __init__(self, message: str, *, line: int, report: ImportReport) -> None:
        super().__init__(" ".join(message.split()))  # driver messages span lines: one line
        self.line = line
        self.report = report


def parse_line(raw: bytes | str, *, first: bool = False) -> dict[str, Any]:
    """One line of the file, validated; InvalidMessageError says what and where."""
    return parse_session_line(raw, first=first)


def import_session(store: SessionStore, record: dict[str, Any]) -> tuple[uuid.UUID, bool, int]:
    """Import one validated session in one transaction; return (session id, created, turns
    added)."""
    turns = [TurnInput.from_loaded(t) for t in record["turns"]]
    db = store.db
    with db_errors(), db.atomic():
        # The org is created by the owner role; everything else as the tenant, same transaction,
        # so a failure anywhere leaves nothing behind.
        org_id = store._ensure_org(record["org"])
        enter_tenant(db, org_id)
        agent_id = store._ensure_agent(org_id, record["agent"])
        user_id = None
        if record.get("user") is not None or record.get("user_id") is not None:
            user_id = store._resolve_user(
                org_id, external_id=record.get("user"), user_id=record.get("user_id")
            )
        session, created = store._upsert_session(
            org_id,
            agent_id,
            record["session"],
            record["status"],
            record["model"],
            record["provider"],
            user_id,
        )
        added = store.sync_turns(session, turns)
        if not created and session.status != record["status"]:
            store._set_status(session.id, record["status"])
    return uuid.UUID(str(session.id)), created, added


def _pgcode(exc: BaseException | None) -> str | None:
    """The SQLSTATE of the driver error under ``exc`` (peewee keeps it as ``orig``)."""
    while exc is not None:
        code = getattr(exc, "pgcode", None)
        if code is not None:
            return str(code)
        exc = getattr(exc, "orig", None) or exc.__cause__
    return None


def _import_with_retry(store: SessionStore, record: dict[str, Any]) -> tuple[uuid.UUID, bool, int]:
    for attempt in range(1, LINE_ATTEMPTS + 1):
        try:
            return import_session(store, record)
        except (DatabaseUnavailableError, peewee.DatabaseError) as exc:
            if attempt == LINE_ATTEMPTS or _pgcode(exc) not in _CONFLICT:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def import_lines(
    store: SessionStore,
    lines: Iterable[str | bytes | OversizeLine],
    progress: Callable[[ImportReport], None] | None = None,
    *,
    keep_lines: bool = False,
) -> ImportReport:
    """Import every good line; raise :class:`ImportStopped` if the database goes away."""
    report = ImportReport()
    for number, raw in enumerate(lines, start=1):
        report.lines = number
        if isinstance(raw, OversizeLine):
            report.errors.append(
                LineError(
                    number,
                    f"line is {raw.size} bytes, over the limit of {raw.limit} (--max-line-bytes)",
                )
            )
        elif raw and not raw.isspace():
            try:
                record = parse_line(raw, first=number == 1)
                session_id, created, added = _import_with_retry(store, record)
            except DatabaseUnavailableError as exc:
                raise ImportStopped(str(exc), line=number, report=report) from exc
            except IbexError as exc:
                report.errors.append(LineError(number, str(exc)))
            except (peewee.DataError, peewee.IntegrityError) as exc:
                report.errors.append(LineError(number, f"refused by the database: {exc}".strip()))
            except peewee.DatabaseError as exc:
                # Not about this line: every following line would fail the same way.
                hint = " (run `ibex migrate`)" if _pgcode(exc) in _SCHEMA_MISSING else ""
                raise ImportStopped(
                    f"the database refused the import{hint}: {exc}".strip(),
                    line=number,
                    report=report,
                ) from exc
            else:
                report.turns_added += added
                result = "created" if created else ("extended" if added else "unchanged")
                if created:
                    report.sessions_created += 1
                elif added:
                    report.sessions_extended += 1
                else:
                    report.sessions_unchanged += 1
                if keep_lines:
                    report.imported.append(
                        ImportedLine(
                            number,
                            record["org"],
                            record["agent"],
                            record["session"],
                            session_id,
                            result,
                            added,
                        )
                    )
        if progress is not None:
            progress(report)
    return report
