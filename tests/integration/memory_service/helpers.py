"""Builders and end-state probes for the memory service tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from core.db import tenant
from memories.canonical import content_hash
from memories.idempotency import FINGERPRINT_BYTES, record_key
from memories.store import NewMemory
from memories.tokens import TokenStore

BASE_URL = "http://memory.test"


@dataclass(frozen=True)
class Tenant:
    org_id: uuid.UUID
    agent_id: uuid.UUID
    writer: str  # memory:read + memory:write
    reader: str  # memory:read only
    writer_id: uuid.UUID
    #: The session that :func:`memory_body` names as the source of this agent's memories.
    session_id: uuid.UUID

    def headers(
        self, token: str | None = None, *, key: str | None = None, org: object = None
    ) -> dict[str, str]:
        """Authorization (the writer token by default), and the key and org headers if given."""
        headers = {"Authorization": f"Bearer {token or self.writer}"}
        if key is not None:
            headers["X-Idempotency-Key"] = key
        if org is not None:
            headers["X-IBEX-Org-ID"] = str(org)
        return headers


def make_token(db: Any, org_id: uuid.UUID | None, scopes: list[str]) -> tuple[str, uuid.UUID]:
    row, token = TokenStore(db).issue(org_id=org_id, name="test", scopes=scopes)
    return token, row.id


def source_session_of(agent_id: uuid.UUID) -> uuid.UUID:
    """The id :func:`memory_body` gives the source session of ``agent_id``'s memories."""
    return uuid.uuid5(agent_id, "source-session")


def make_source_session(store: Any, org_id: uuid.UUID, agent_id: uuid.UUID) -> uuid.UUID:
    """Create the session :func:`memory_body` names for ``agent_id`` (a memory's source session
    must exist in its org); idempotent."""
    session_id = source_session_of(agent_id)
    with tenant(store.db, org_id):
        store.db.execute_sql(
            "INSERT INTO ibex_core.sessions (id, org_id, agent_id, external_id, status)"
            " VALUES (%s, %s, %s, %s, 'completed') ON CONFLICT DO NOTHING",
            (str(session_id), str(org_id), str(agent_id), f"source-{session_id}"),
        )
    return session_id


def make_tenant(store: Any, slug: str) -> Tenant:
    org_id = store.ensure_org(slug)
    agent_id = store.ensure_agent(org_id, "bot")
    session_id = make_source_session(store, org_id, agent_id)
    writer, writer_id = make_token(store.db, org_id, ["memory:read", "memory:write"])
    reader, _ = make_token(store.db, org_id, ["memory:read"])
    return Tenant(org_id, agent_id, writer, reader, writer_id, session_id)


def memory_body(agent_id: uuid.UUID, content: str = "Dana is allergic to peanuts.", **extra: Any):
    """A valid body whose source is the session of :func:`make_source_session`."""
    body: dict[str, Any] = {
        "agent_id": str(agent_id),
        "content": content,
        "kind": "fact",
        "source": {
            "session_id": str(source_session_of(agent_id)),
            "turn_index": 3,
            "ordinal": 0,
        },
        "metadata": {},
    }
    body.update(extra)
    return body


def new_fact(agent_id: uuid.UUID, content: str, **fields: Any) -> NewMemory:
    """A store-level write of a fact with no source, key or metadata; ``fields`` override any
    other field (a user, a vector and its model, ...)."""
    return NewMemory(
        **{
            "agent_id": agent_id,
            "content": content,
            "content_hash": content_hash(content),
            "kind": "fact",
            "metadata": {},
            "session_id": None,
            "turn_index": None,
            "ordinal": None,
            "idempotency_key": None,
            "fingerprint": "f" * 64,
            **fields,
        }
    )


def memory_count(db: Any, org_id: uuid.UUID | None = None) -> int:
    """Rows as the owner sees them (no RLS): the ground truth of a test's end state."""
    sql = "SELECT count(*) FROM ibex_memory.memories"
    params: tuple[Any, ...] = ()
    if org_id is not None:
        sql += " WHERE org_id = %s"
        params = (str(org_id),)
    return int(db.execute_sql(sql, params).fetchone()[0])


def memory_ids(db: Any) -> list[uuid.UUID]:
    rows = db.execute_sql("SELECT id FROM ibex_memory.memories ORDER BY created_at").fetchall()
    return [uuid.UUID(str(r[0])) for r in rows]


def idempotency_record(client: Any, org_id: uuid.UUID, key: str) -> dict[str, bytes]:
    """The fields of a key's idempotency record: ``state`` (``running`` or ``done``), and
    ``owner`` while running, ``id`` and ``answer`` once done; {} when there is none."""
    raw = client.get(record_key(org_id, key))
    if raw is None:
        return {}
    state, rest = raw[FINGERPRINT_BYTES : FINGERPRINT_BYTES + 1], raw[FINGERPRINT_BYTES + 1 :]
    if state == b"R":
        return {"state": b"running", "owner": rest}
    return {"state": b"done", "id": rest[:16], "answer": rest[16:]}
