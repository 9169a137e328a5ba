"""Memories in Postgres: the durable half of idempotency and dedup.

Every memory query runs inside :func:`core.db.tenant`, so row-level security scopes it to one
org even when the connection is a superuser's. peewee errors are translated here and nowhere
else: connection trouble becomes :class:`~core.errors.DatabaseUnavailableError` (through
``core.db``), constraint violations become typed results.

A write is one round trip: ``SELECT * FROM ibex_memory.create_memory(...)`` in its own implicit
transaction (migration 000003), prepared once per connection. The function switches to the
tenant role and org itself, runs ``INSERT ... ON CONFLICT DO NOTHING`` (the unique constraints,
not a check before the insert, decide) and, when that inserts nothing, reads the row that won.
It is the hot path of the service, so it runs on the pooled psycopg2 connection directly,
without peewee's per-statement work; its errors are translated here the same way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee
import psycopg2
from psycopg2.extras import Json

from core.db import (
    BEGIN_ATTEMPTS,
    db_errors,
    is_prepared,
    is_unique_violation,
    mark_prepared,
    replace_broken_connection,
    tenant,
    transaction,
    uuid_column,
)
from core.errors import DatabaseUnavailableError
from memories.scope import AGENT_WIDE, ReadScope
from memories.vectors import vector_literal

COLUMNS = (
    "id, org_id, agent_id, session_id, turn_index, ordinal, content, content_hash, kind,"
    " metadata, created_at, idempotency_key, request_fingerprint"
    # Supersession (migration 000014): since when the fact holds, and what replaced it.
    ", valid_from, superseded_by, superseded_at"
    # Whose memory (migration 000012): None, agent-wide.
    ", user_id"
)

#: The write, with its 17 parameters in the order of :func:`create_params` (000014 added
#: supersedes, the skip-stale flag and the near-duplicate threshold; 000016 the vector and its
#: model, stored in the same statement).
CREATE_SQL = """
SELECT * FROM ibex_memory.create_memory(
    %s::uuid, %s::uuid, %s::uuid, %s::integer, %s::integer, %s::text, %s::text, %s::text,
    %s::jsonb, %s::text, %s::text, %s::uuid, %s::uuid[], %s::boolean, %s::real, %s::text,
    %s::real[])
"""

#: The same write as a prepared statement of the connection, prepared once per connection
#: (:class:`MemoryStore`): the server then skips parsing and planning the call on every POST,
#: about a fifth of the backend's CPU for the write.
PREPARED_NAME = "ibex_create_memory"
PREPARE_SQL = f"""
PREPARE {PREPARED_NAME} (uuid, uuid, uuid, integer, integer, text, text, text, jsonb, text, text,
                         uuid, uuid[], boolean, real, text, real[])
AS SELECT * FROM ibex_memory.create_memory($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                                           $13, $14, $15, $16, $17)
"""
_EXECUTE_PARAMS = (
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::uuid[], %s, %s, %s, %s::real[]"
)
EXECUTE_SQL = f"EXECUTE {PREPARED_NAME} ({_EXECUTE_PARAMS})"

BY_KEY_SQL = f"""
SELECT {COLUMNS} FROM ibex_memory.memories WHERE org_id = %s AND idempotency_key = %s
"""

# GET and DELETE by id: the trailing condition is the reader's user scope
# (memories.scope.ReadScope.condition), so another user's memory is not found.
GET_SQL = f"""
SELECT {COLUMNS} FROM ibex_memory.memories WHERE org_id = %s AND id = %s AND deleted_at IS NULL
   AND {{user_scope}}
"""

#: The chain of a memory, oldest first (``ibex_memory.memory_history``, migration 000014):
#: deleted memories are left out.
HISTORY_SQL = f"""
SELECT {COLUMNS} FROM ibex_memory.memories
 WHERE org_id = %s AND deleted_at IS NULL
   AND id IN (SELECT ibex_memory.memory_history(%s::uuid))
   AND {{user_scope}}
 ORDER BY valid_from, created_at, id
"""

DELETE_SQL = """
UPDATE ibex_memory.memories SET deleted_at = now()
 WHERE org_id = %s AND id = %s AND deleted_at IS NULL AND {user_scope}
"""

ORG_FK = "memories_org_id_fkey"
#: The source session must be one of the memory's org (migration 000005).
SESSION_FK = "memories_source_session_fkey"
#: The user must be one of the memory's org, and the source session's user if it has one
#: (migration 000012).
USER_FK = "memories_user_fkey"
USER_OF_SESSION = "memories_user_of_session"


@dataclass(frozen=True)
class NewMemory:
    """A validated write, with its normalised-content hash and request fingerprint."""

    agent_id: uuid.UUID
    content: str
    content_hash: str
    kind: str
    metadata: dict[str, Any]
    session_id: uuid.UUID | None
    turn_index: int | None
    ordinal: int | None
    idempotency_key: str | None
    fingerprint: str
    user_id: uuid.UUID | None = None
    #: Current memories of the same scope this one replaces (marked in the same transaction).
    supersedes: tuple[uuid.UUID, ...] = ()
    #: True: an id of ``supersedes`` no longer current is skipped, not refused (the pipeline).
    skip_stale: bool = False
    #: The memory's unit vector and the model that made it, stored with it (000016); None:
    #: the service embeds it after the insert, if it can. The vector is its components, or
    #: the ``real[]`` text of them (:func:`~memories.vectors.unit_literal`: the service's
    #: writes, which make the text in one pass).
    embedding_model: str | None = None
    embedding: tuple[float, ...] | str | None = None


@dataclass(frozen=True)
class MemoryRow:
    id: uuid.UUID
    org_id: uuid.UUID
    agent_id: uuid.UUID
    session_id: uuid.UUID | None
    turn_index: int | None
    ordinal: int | None
    content: str
    content_hash: str
    kind: str
    metadata: dict[str, Any]
    created_at: dt.datetime
    idempotency_key: str | None
    request_fingerprint: str | None
    valid_from: dt.datetime | None = None
    superseded_by: uuid.UUID | None = None
    superseded_at: dt.datetime | None = None
    #: Whose memory; None: agent-wide.
    user_id: uuid.UUID | None = None

    @classmethod
    def from_db(cls, row: Sequence[Any]) -> MemoryRow:
        """From :data:`COLUMNS`; ``create_memory``'s row (one column fewer, no user) has
        ``user_id`` None, which :meth:`MemoryStore.create` sets from the write."""
        user = row[16] if len(row) > 16 else None
        return cls(
            id=uuid_column(row[0]),
            org_id=uuid_column(row[1]),
            agent_id=uuid_column(row[2]),
            session_id=uuid_column(row[3]) if row[3] is not None else None,
            turn_index=row[4],
            ordinal=row[5],
            content=row[6],
            content_hash=row[7],
            kind=row[8],
            metadata=row[9],
            created_at=row[10],
            idempotency_key=row[11],
            request_fingerprint=row[12],
            valid_from=row[13],
            superseded_by=uuid_column(row[14]) if row[14] is not None else None,
            superseded_at=row[15],
            user_id=uuid_column(user) if user is not None else None,
        )

    def as_json(self, *, as_created: bool = False) -> dict[str, Any]:
        """The public representation (``schema.memory.MemorySchema``), JSON-ready."""
        source = None
        if self.session_id is not None:
            source = {
                "session_id": str(self.session_id),
                "turn_index": self.turn_index,
                "ordinal": self.ordinal,
            }
        return {
            "id": str(self.id),
            "org_id": str(self.org_id),
            "agent_id": str(self.agent_id),
            "content": self.content,
            "content_hash": self.content_hash,
            "kind": self.kind,
            "source": source,
            "metadata": self.metadata,
            "user_id": str(self.user_id) if self.user_id is not None else None,
            "created_at": self.created_at.astimezone(dt.UTC).isoformat(),
            # Supersession: a 201 (and its replay) shows the memory as it was created, so the
            # replay stays byte for byte the first answer even after a later supersession.
            "valid_from": (self.valid_from or self.created_at).astimezone(dt.UTC).isoformat(),
            "superseded_by": None
            if as_created or self.superseded_by is None
            else str(self.superseded_by),
            "superseded_at": None
            if as_created or self.superseded_at is None
            else self.superseded_at.astimezone(dt.UTC).isoformat(),
        }


class WriteOutcome(enum.Enum):
    """What a write did; :mod:`memories.service` decides what it answers."""

    CREATED = "created"
    #: A row with this key exists (compare fingerprints: a replay or a conflict).
    KEY_EXISTS = "key_exists"
    #: A live row of this org and agent holds the same normalised content.
    CONTENT_EXISTS = "content_exists"
    UNKNOWN_AGENT = "unknown_agent"
    UNKNOWN_ORG = "unknown_org"
    #: ``source.session_id`` names no session of this org.
    UNKNOWN_SESSION = "unknown_session"
    #: ``user_id`` names no user of this org.
    UNKNOWN_USER = "unknown_user"
    #: The source session has a user and ``user_id`` is not that user.
    NOT_THE_SESSIONS_USER = "not_the_sessions_user"
    #: A current memory of the scope is near-identical (trigram similarity, 000014).
    NEAR_DUPLICATE = "near_duplicate"
    #: An id of ``supersedes`` is not a current memory of the scope (``CreateResult.refused``).
    SUPERSEDES_INVALID = "supersedes_invalid"


#: What ``ibex_memory.create_memory`` says in its first column.
OUTCOMES = {
    "created": WriteOutcome.CREATED,
    "key_exists": WriteOutcome.KEY_EXISTS,
    "content_exists": WriteOutcome.CONTENT_EXISTS,
    "near_duplicate": WriteOutcome.NEAR_DUPLICATE,
    "supersedes_invalid": WriteOutcome.SUPERSEDES_INVALID,
}


@dataclass(frozen=True)
class CreateResult:
    outcome: WriteOutcome
    row: MemoryRow | None = None
    #: Created: the memories this write marked superseded.
    marked: tuple[uuid.UUID, ...] = ()
    #: SUPERSEDES_INVALID: the ids of ``supersedes`` refused.
    refused: tuple[uuid.UUID, ...] = ()


class MemoryStore:
    """Tenant-scoped reads and writes of ``ibex_memory.memories``."""

    def __init__(self, db: peewee.Database, near_duplicate_threshold: float = 0.0) -> None:
        self.db = db
        #: MEMORY_NEAR_DUPLICATE_THRESHOLD; 0: no near-duplicate check.
        self.near_duplicate_threshold = near_duplicate_threshold

    def create(self, org_id: uuid.UUID, new: NewMemory) -> CreateResult:
        attempt = 0
        while True:
            attempt += 1
            with db_errors():
                connection = self.db.connection()
            try:
                with connection.cursor() as cursor:
                    if not is_prepared(connection, PREPARED_NAME):
                        cursor.execute(PREPARE_SQL)
                        mark_prepared(connection, PREPARED_NAME)
                    cursor.execute(
                        EXECUTE_SQL, create_params(org_id, new, self.near_duplicate_threshold)
                    )
                    row = cursor.fetchone()
            except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
                # A pooled connection that died with its server (restart, failover) is
                # replaced and the write sent again: it is idempotent (ON CONFLICT, then the
                # row that won), so even a commit whose answer was lost is read back.
                if connection.closed and attempt < BEGIN_ATTEMPTS and not self.db.in_transaction():
                    replace_broken_connection(self.db)
                    continue
                raise DatabaseUnavailableError(f"database unavailable: {exc}".strip()) from exc
            except psycopg2.IntegrityError as exc:
                return CreateResult(_foreign_key_outcome(exc))
            break
        if row is None:
            raise DatabaseUnavailableError("memory insert kept conflicting with vanishing rows")
        outcome = OUTCOMES[row[0]]
        if outcome is WriteOutcome.SUPERSEDES_INVALID:
            return CreateResult(outcome, refused=tuple(uuid_column(i) for i in row[-1] or ()))
        marked = tuple(uuid_column(i) for i in row[-2] or ())
        # create_memory's row has no user column: a created row carries the write's user (the
        # insert trigger refuses any other), and so does a row holding the key whose
        # fingerprint matches (the user is part of the fingerprint when there is one); for any
        # other outcome only the row's id is used. Its last two columns are the marks.
        memory = dataclasses.replace(MemoryRow.from_db(row[1:-2]), user_id=new.user_id)
        return CreateResult(outcome, memory, marked=marked)

    def find_by_key(self, org_id: uuid.UUID, idempotency_key: str) -> MemoryRow | None:
        with tenant(self.db, org_id):
            row = self.db.execute_sql(BY_KEY_SQL, (str(org_id), idempotency_key)).fetchone()
        return MemoryRow.from_db(row) if row else None

    def get(
        self, org_id: uuid.UUID, memory_id: uuid.UUID, scope: ReadScope = AGENT_WIDE
    ) -> MemoryRow | None:
        """The live memory if it is in the reader's ``scope``."""
        condition, params = scope.condition()
        sql = GET_SQL.format(user_scope=condition)
        with tenant(self.db, org_id):
            row = self.db.execute_sql(sql, (str(org_id), str(memory_id), *params)).fetchone()
        return MemoryRow.from_db(row) if row else None

    def history(
        self, org_id: uuid.UUID, memory_id: uuid.UUID, scope: ReadScope = AGENT_WIDE
    ) -> list[MemoryRow]:
        """The supersession chain ``memory_id`` belongs to, oldest first; empty when the
        memory is unknown, deleted or not in the reader's ``scope`` (a chain never leaves
        its scope: supersedes names memories of the same agent and user only)."""
        condition, params = scope.condition()
        sql = HISTORY_SQL.format(user_scope=condition)
        with tenant(self.db, org_id):
            rows = self.db.execute_sql(sql, (str(org_id), str(memory_id), *params)).fetchall()
        return [MemoryRow.from_db(r) for r in rows]

    def list(
        self,
        org_id: uuid.UUID,
        *,
        agent_id: uuid.UUID | None,
        session_id: uuid.UUID | None,
        limit: int,
        after: tuple[dt.datetime, uuid.UUID] | None,
        include_superseded: bool = False,
        scope: ReadScope = AGENT_WIDE,
        kind: str | None = None,
    ) -> list[MemoryRow]:
        """Newest first; ``after`` is the (created_at, id) of the last row already seen.
        Current memories only unless ``include_superseded``; ``scope``: whose memories
        (idx_memories_agent_user serves one user's and the agent-wide ones of one agent);
        ``kind``: of that kind only."""
        where = ["org_id = %s", "deleted_at IS NULL"]
        params: list[Any] = [str(org_id)]
        # Supersession (000014): a superseded memory is listed only when asked for.
        if not include_superseded:
            where.append("superseded_by IS NULL")
        # Whose memories: the reader's user scope.
        user_condition, user_params = scope.condition()
        where.append(user_condition)
        params.extend(user_params)
        if agent_id is not None:
            where.append("agent_id = %s")
            params.append(str(agent_id))
        if session_id is not None:
            where.append("session_id = %s")
            params.append(str(session_id))
        if kind is not None:
            where.append("kind = %s")
            params.append(kind)
        if after is not None:
            where.append("(created_at, id) < (%s, %s::uuid)")
            params.extend([after[0], str(after[1])])
        params.append(limit)
        sql = (
            f"SELECT {COLUMNS} FROM ibex_memory.memories WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, id DESC LIMIT %s"
        )
        with tenant(self.db, org_id):
            rows = self.db.execute_sql(sql, params).fetchall()
        return [MemoryRow.from_db(r) for r in rows]

    def soft_delete(
        self, org_id: uuid.UUID, memory_id: uuid.UUID, scope: ReadScope | None = None
    ) -> bool:
        """Soft-delete the live memory; with ``scope``, only if it is in it."""
        condition, params = scope.condition() if scope is not None else ("true", [])
        sql = DELETE_SQL.format(user_scope=condition)
        with tenant(self.db, org_id):
            cursor = self.db.execute_sql(sql, (str(org_id), str(memory_id), *params))
            return bool(cursor.rowcount)

    def ping(self) -> None:
        with transaction(self.db):  # a dead pooled connection is replaced, not reported
            self.db.execute_sql("SELECT 1").fetchone()


# -- erasure (``ibex prune --deleted-older-than``): the owner role, across orgs ---------------


def erase_of_sessions(db: peewee.Database, session_ids: Sequence[str]) -> int:
    """Hard-delete every memory drawn from these (erased) sessions (their vectors go with
    them: the foreign key cascades)."""
    return int(
        db.execute_sql(
            "DELETE FROM ibex_memory.memories WHERE session_id = ANY(%s::uuid[])",
            (list(session_ids),),
        ).rowcount
    )


def deleted_memories(db: peewee.Database, cutoff: dt.datetime, after: str, limit: int) -> list[str]:
    """The next ``limit`` memories soft-deleted before ``cutoff``, by id after ``after``,
    locked (ones another transaction holds are skipped)."""
    rows = db.execute_sql(
        "SELECT m.id::text FROM ibex_memory.memories m"
        " WHERE m.deleted_at < %s AND m.id > %s::uuid ORDER BY m.id LIMIT %s"
        " FOR UPDATE SKIP LOCKED",
        (cutoff, after, limit),
    ).fetchall()
    return [r[0] for r in rows]


def erase_memories(db: peewee.Database, ids: Sequence[str]) -> int:
    return int(
        db.execute_sql(
            "DELETE FROM ibex_memory.memories WHERE id = ANY(%s::uuid[])", (list(ids),)
        ).rowcount
    )


def count_erasable_memories(db: peewee.Database, cutoff: dt.datetime) -> int:
    """Memories an erasure would delete: those of sessions deleted before ``cutoff``, and
    those deleted before it."""
    row = db.execute_sql(
        "SELECT count(*) FROM ibex_memory.memories m"
        " WHERE m.deleted_at < %(cutoff)s OR m.session_id IN"
        " (SELECT s.id FROM ibex_core.sessions s WHERE s.deleted_at < %(cutoff)s)",
        {"cutoff": cutoff},
    ).fetchone()
    return int(row[0])


def users_named(db: peewee.Database, user_ids: Sequence[str]) -> set[str]:
    """Which of these users a memory still names (an erasure keeps those users)."""
    rows = db.execute_sql(
        "SELECT DISTINCT user_id::text FROM ibex_memory.memories WHERE user_id = ANY(%s::uuid[])",
        (list(user_ids),),
    ).fetchall()
    return {r[0] for r in rows}


def create_params(
    org_id: uuid.UUID, new: NewMemory, near_duplicate_threshold: float = 0.0
) -> tuple[Any, ...]:
    """The parameters of :data:`CREATE_SQL`."""
    return (
        str(org_id),
        str(new.agent_id),
        str(new.session_id) if new.session_id else None,
        new.turn_index,
        new.ordinal,
        new.content,
        new.content_hash,
        new.kind,
        Json(new.metadata),
        new.idempotency_key,
        new.fingerprint if new.idempotency_key is not None else None,
        str(new.user_id) if new.user_id else None,
        [str(i) for i in new.supersedes] if new.supersedes else None,
        new.skip_stale,
        near_duplicate_threshold or None,
        new.embedding_model if new.embedding else None,
        _vector_text(new.embedding),
    )


def _vector_text(embedding: Sequence[float] | str | None) -> str | None:
    """The ``real[]`` text of a write's vector: given as such (the service's own, made in one
    pass by :func:`~memories.vectors.unit_literal`) or written from its components."""
    if not embedding:
        return None
    if isinstance(embedding, str):
        return embedding
    return vector_literal(embedding)


def _foreign_key_outcome(exc: Exception) -> WriteOutcome:
    """Which reference a failed insert named: the org (403), the agent or the source session
    (422). The org's key was declared first, so an unknown org is reported as such."""
    orig = getattr(exc, "orig", None) or exc.__cause__ or exc
    constraint = getattr(getattr(orig, "diag", None), "constraint_name", None)
    if constraint == USER_OF_SESSION:
        return WriteOutcome.NOT_THE_SESSIONS_USER
    if getattr(orig, "pgcode", None) != "23503":
        if is_unique_violation(exc):  # cannot happen with ON CONFLICT DO NOTHING
            raise DatabaseUnavailableError("unexpected unique violation") from exc
        raise exc
    if constraint == ORG_FK:
        return WriteOutcome.UNKNOWN_ORG
    if constraint == SESSION_FK:
        return WriteOutcome.UNKNOWN_SESSION
    if constraint == USER_FK:
        return WriteOutcome.UNKNOWN_USER
    return WriteOutcome.UNKNOWN_AGENT
