"""``ibex import``: sessions from JSON Lines (DESIGN section 4), each line all or nothing.

A line is one session. Missing orgs and agents are created by slug; ``turns[i]`` becomes turn
i+1; a re-imported session gains only its new turns and keeps its extraction pointer; a stored
turn offered with different content is refused. A bad line is reported with its number and
field and the rest of the file still imports.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import peewee

from core.db import db_errors, enter_tenant
from core.errors import IbexError, InvalidMessageError
from models.store import SessionStore, TurnInput
from schema import load
from schema.imports import SessionLineSchema

_LINE_SCHEMA = SessionLineSchema()


@dataclass
class LineError:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class ImportReport:
    lines: int = 0
    sessions_created: int = 0
    sessions_extended: int = 0
    sessions_unchanged: int = 0
    turns_added: int = 0
    errors: list[LineError] = field(default_factory=list)

    @property
    def lines_rejected(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        return (
            f"{self.sessions_created} sessions created, {self.sessions_extended} extended,"
            f" {self.sessions_unchanged} unchanged, {self.turns_added} turns added,"
            f" {self.lines_rejected} lines rejected"
        )


def parse_line(text: str) -> dict:
    """One line of the file, validated; InvalidMessageError names the bad field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidMessageError(f"malformed JSON: {exc.msg} at column {exc.colno}") from exc
    if not isinstance(data, dict):
        raise InvalidMessageError("a line must be a JSON object (one session)")
    record: dict = load(_LINE_SCHEMA, data, what="session")
    return record


def import_session(store: SessionStore, record: dict) -> tuple[bool, int]:
    """Import one validated session in one transaction; return (created, turns added)."""
    turns = [
        TurnInput(
            messages=t["messages"],
            completion=t["completion"],
            prompt_tokens=t["prompt_tokens"],
            completion_tokens=t["completion_tokens"],
            latency_ms=t["latency_ms"],
            is_streaming=t["is_streaming"],
        )
        for t in record["turns"]
    ]
    db = store.db
    with db_errors(), db.atomic():
        # The org is created by the owner role; everything else as the tenant, same transaction,
        # so a failure anywhere leaves nothing behind.
        org_id = store._ensure_org(record["org"])
        enter_tenant(db, org_id)
        agent_id = store._ensure_agent(org_id, record["agent"])
        session, created = store._upsert_session(
            org_id,
            agent_id,
            record["session"],
            record["status"],
            record["model"],
            record["provider"],
        )
        added = store.sync_turns(session, turns)
        if not created and session.status != record["status"]:
            store._set_status(session.id, record["status"])
    return created, added


def import_lines(
    store: SessionStore,
    lines: Iterable[str],
    progress: Callable[[ImportReport], None] | None = None,
) -> ImportReport:
    report = ImportReport()
    for number, text in enumerate(lines, start=1):
        report.lines = number
        if not text.strip():
            continue
        try:
            created, added = import_session(store, parse_line(text))
        except IbexError as exc:
            report.errors.append(LineError(number, str(exc)))
        except peewee.DatabaseError as exc:
            report.errors.append(LineError(number, f"refused by the database: {exc}".strip()))
        else:
            report.turns_added += added
            if created:
                report.sessions_created += 1
            elif added:
                report.sessions_extended += 1
            else:
                report.sessions_unchanged += 1
        if progress is not None:
            progress(report)
    return report
