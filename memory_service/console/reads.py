"""The console's reads that no API route makes: an agent's people with their memory counts, a
person's memories of one kind, the superseded versions behind a page of memories, the memories
and the recorded content of a range of turns. Read only, each one statement in the org's tenant
transaction (row-level security applies), keyset-paged, each served by an index
(``idx_memories_agent_user``, ``idx_memories_superseded_by``, ``idx_memories_session``, the
users' unique key, the checkpoints' (session, turn) key)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import peewee

from core.db import tenant
from memories.scope import ReadScope
from memories.store import COLUMNS, MemoryRow, MemoryStore
from sessions.turns import TurnRecord

PERSON_COLUMNS = ", ".join(f"m.{c.strip()}" for c in COLUMNS.split(","))


def agents(db: peewee.Database, org_id: uuid.UUID) -> list[tuple[uuid.UUID, str]]:
    with tenant(db, org_id):
        rows = db.execute_sql("SELECT id, slug FROM ibex_core.agents ORDER BY slug").fetchall()
    return [(uuid.UUID(str(r[0])), str(r[1])) for r in rows]


def people(
    db: peewee.Database,
    org_id: uuid.UUID,
    agent_id: uuid.UUID,
    *,
    after: str | None,
    limit: int,
    only: uuid.UUID | None = None,
) -> list[tuple[uuid.UUID, str, int]]:
    """The org's live users by key after ``after``, each with their current memories of the
    agent; ``only``: that user alone (a user-bound token)."""
    where = ["u.deleted_at IS NULL"]
    params: list[Any] = [str(agent_id)]
    if after is not None:
        where.append("u.external_id > %s")
        params.append(after)
    if only is not None:
        where.append("u.id = %s")
        params.append(str(only))
    params.append(limit)
    sql = (
        "SELECT u.id, u.external_id,"
        " (SELECT count(*) FROM ibex_memory.memories m WHERE m.org_id = u.org_id"
        "   AND m.agent_id = %s AND m.user_id = u.id AND m.deleted_at IS NULL"
        "   AND m.superseded_by IS NULL)"
        f" FROM ibex_core.users u WHERE {' AND '.join(where)}"
        " ORDER BY u.external_id LIMIT %s"
    )
    with tenant(db, org_id):
        rows = db.execute_sql(sql, params).fetchall()
    return [(uuid.UUID(str(r[0])), str(r[1]), int(r[2])) for r in rows]


def kind_counts(
    db: peewee.Database, org_id: uuid.UUID, agent_id: uuid.UUID, scope: ReadScope
) -> dict[str, int]:
    condition, params = scope.condition("m.user_id")
    sql = (
        "SELECT m.kind, count(*) FROM ibex_memory.memories m WHERE m.org_id = %s"
        " AND m.agent_id = %s AND m.deleted_at IS NULL AND m.superseded_by IS NULL"
        f" AND {condition} GROUP BY m.kind ORDER BY m.kind"
    )
    with tenant(db, org_id):
        rows = db.execute_sql(sql, [str(org_id), str(agent_id), *params]).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def memories(
    db: peewee.Database,
    org_id: uuid.UUID,
    agent_id: uuid.UUID,
    scope: ReadScope,
    *,
    kind: str | None,
    after: tuple[dt.datetime, uuid.UUID] | None,
    limit: int,
) -> list[MemoryRow]:
    """Current memories of the scope, newest first, after the (created_at, id) given."""
    return MemoryStore(db).list(
        org_id, agent_id=agent_id, session_id=None, limit=limit, after=after, scope=scope, kind=kind
    )


HISTORY_SQL = f"""
WITH RECURSIVE chain AS (
    SELECT {PERSON_COLUMNS}, m.superseded_by AS head, 1 AS depth
      FROM ibex_memory.memories m
     WHERE m.superseded_by = ANY(%s::uuid[]) AND m.deleted_at IS NULL
    UNION ALL
    SELECT {PERSON_COLUMNS}, c.head, c.depth + 1
      FROM ibex_memory.memories m JOIN chain c ON m.superseded_by = c.id
     WHERE m.deleted_at IS NULL AND c.depth < 50
)
SELECT * FROM chain ORDER BY head, created_at, id
"""


def superseded(
    db: peewee.Database, org_id: uuid.UUID, current: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[MemoryRow]]:
    """For each current memory, the versions it replaced (directly or through others), oldest
    first. A chain never leaves its scope (supersedes names memories of the same agent and
    user only), so it needs no user condition of its own."""
    if not current:
        return {}
    with tenant(db, org_id):
        rows = db.execute_sql(HISTORY_SQL, ([str(i) for i in current],)).fetchall()
    out: dict[uuid.UUID, list[MemoryRow]] = defaultdict(list)
    for row in rows:
        out[uuid.UUID(str(row[17]))].append(MemoryRow.from_db(row[:17]))
    return dict(out)


def turn_memories(
    db: peewee.Database, org_id: uuid.UUID, session_id: uuid.UUID, first: int, last: int
) -> dict[int, list[MemoryRow]]:
    """The live memories whose source is one of the session's turns ``first..last``, current
    or superseded, by turn and ordinal."""
    sql = (
        f"SELECT {PERSON_COLUMNS} FROM ibex_memory.memories m WHERE m.org_id = %s"
        " AND m.session_id = %s AND m.turn_index BETWEEN %s AND %s AND m.deleted_at IS NULL"
        " ORDER BY m.turn_index, m.ordinal, m.created_at"
    )
    with tenant(db, org_id):
        rows = db.execute_sql(sql, (str(org_id), str(session_id), first, last)).fetchall()
    out: dict[int, list[MemoryRow]] = defaultdict(list)
    for row in rows:
        memory = MemoryRow.from_db(row)
        out[int(memory.turn_index or 0)].append(memory)
    return dict(out)


TURNS_SQL = """
SELECT c.turn_index, c.prompt_tokens, c.completion_tokens, c.latency_ms, p.messages, p.completion
  FROM ibex_core.checkpoints c
  JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id
 WHERE c.org_id = %s AND c.session_id = %s AND c.turn_index BETWEEN %s AND %s
 ORDER BY c.turn_index
"""


def turns(
    db: peewee.Database, org_id: uuid.UUID, session_id: uuid.UUID, first: int, last: int
) -> list[TurnRecord]:
    """Turns ``first..last`` of a session as recorded (the unique (session, turn) key)."""
    with tenant(db, org_id):
        rows = db.execute_sql(TURNS_SQL, (str(org_id), str(session_id), first, last)).fetchall()
    return [
        TurnRecord(session_id, int(ti), msgs, comp, int(pt), int(ct), int(lat))
        for ti, pt, ct, lat, msgs, comp in rows
    ]
