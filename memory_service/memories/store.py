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
import threading
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee
import psycopg2
from psycopg2.extras import Json

from core.db import (
    BEGIN_ATTEMPTS,
    db_errors,
    is_unique_violation,
    replace_broken_connection,
    tenant,
    transaction,
    uuid_column,
)
from core.errors import ConfigError, DatabaseUnavailableError
from memory_service.scope import AGENT_WIDE, ReadScope

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
#: The connections that hold the prepared write, whichever store prepared it (a connection
#: that is closed and dropped is forgotten with it).
_PREPARED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_PREPARED_LOCK = threading.Lock()

BY_KEY_SQL = f"""
SELECT {COLUMNS} FROM ibex_memory.memories WHERE org_id = %s AND idempotency_key = %s
"""

# GET and DELETE by id: the trailing condition is the reader's user scope
# (memory_service.scope.ReadScope.condition), so another user's memory is not found.
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
    #: the service embeds it after the insert, if it can.
    embedding_model: str | None = None
    embedding: tuple[float, ...] | None = None


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
    """What a write did; :mod:`memory_service.memories.service` decides what it answers."""

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
                    if connection not in _PREPARED:
                        cursor.execute(PREPARE_SQL)
                        with _PREPARED_LOCK:
                            _PREPARED[connection] = True
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
    ) -> list[MemoryRow]:
        """Newest first; ``after`` is the (created_at, id) of the last row already seen.
        Current memories only unless ``include_superseded``; ``scope``: whose memories
        (idx_memories_agent_user serves one user's and the agent-wide ones of one agent)."""
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

    def soft_delete_session_memories(self, org_id: uuid.UUID, session_id: uuid.UUID) -> int:
        """Soft-delete every live memory whose source is the session; how many. Joins the
        caller's transaction when there is one."""
        with tenant(self.db, org_id):
            cursor = self.db.execute_sql(
                "UPDATE ibex_memory.memories SET deleted_at = now()"
                " WHERE org_id = %s AND session_id = %s AND deleted_at IS NULL",
                (str(org_id), str(session_id)),
            )
            return int(cursor.rowcount)

    def ping(self) -> None:
        with transaction(self.db):  # a dead pooled connection is replaced, not reported
            self.db.execute_sql("SELECT 1").fetchone()


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
        list(new.embedding) if new.embedding else None,
    )


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


#: Live memories of the transaction's org lacking a vector of a model, in id order after a
#: given id (keyset pages: a rerun or a resumed run continues where it stopped). The scope
#: filters are optional (NULL: every agent).
MISSING_EMBEDDINGS_SQL = """
SELECT m.id, m.content FROM ibex_memory.memories m
 WHERE m.org_id = %(org_id)s AND m.deleted_at IS NULL
   AND (%(agent_id)s::uuid IS NULL OR m.agent_id = %(agent_id)s::uuid)
   AND m.id > %(after)s::uuid
   AND (%(replace)s OR NOT EXISTS (
        SELECT 1 FROM ibex_memory.memory_embeddings e
         WHERE e.memory_id = m.id AND e.agent_id = m.agent_id AND e.model = %(model)s))
 ORDER BY m.id
 LIMIT %(limit)s
"""

COUNT_MISSING_SQL = """
SELECT count(*) FROM ibex_memory.memories m
 WHERE m.org_id = %(org_id)s AND m.deleted_at IS NULL
   AND (%(agent_id)s::uuid IS NULL OR m.agent_id = %(agent_id)s::uuid)
   AND (%(replace)s OR NOT EXISTS (
        SELECT 1 FROM ibex_memory.memory_embeddings e
         WHERE e.memory_id = m.id AND e.agent_id = m.agent_id AND e.model = %(model)s))
"""

PUT_EMBEDDINGS_SQL = (
    "SELECT ibex_memory.put_embeddings(%s::uuid[], %s::text, %s::integer, %s::jsonb)"
)

#: The dimension a model's vectors were stored with (000016's registry: not tenant data).
MODEL_DIMENSION_SQL = "SELECT dimension FROM ibex_memory.embedding_models WHERE model = %s"
#: Register a model with its dimension (migration 000019: the owner's statement; the tenant
#: role may not write the registry, so no tenant's request decides a model's dimension).
REGISTER_MODEL_SQL = (
    "INSERT INTO ibex_memory.embedding_models (model, dimension) VALUES (%s, %s)"
    " ON CONFLICT DO NOTHING"
)
VECTOR_INDEX_SQL = "SELECT ibex_memory.ensure_vector_index(%s)"
#: Whether pgvector serves the model's dimension (the HNSW index of 000016 exists).
HAS_VECTOR_INDEX_SQL = (
    "SELECT to_regclass('ibex_memory.idx_memory_embeddings_hnsw_' || %s::text) IS NOT NULL"
)
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class EmbeddingStore:
    """The vectors of ``ibex_memory.memory_embeddings`` (migration 000016): the backfill and
    ``ibex reembed`` reads and writes, and the model registry. (The write of a memory with its
    vector is ``create_memory``'s, :class:`MemoryStore`.)"""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def missing(
        self,
        org_id: uuid.UUID,
        model: str,
        *,
        agent_id: uuid.UUID | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
        replace: bool = False,
    ) -> list[tuple[uuid.UUID, str]]:
        """Live memories (id, content) lacking a vector of ``model`` (every one with
        ``replace``), in id order after ``after``."""
        params = {
            "org_id": str(org_id),
            "agent_id": str(agent_id) if agent_id else None,
            "after": str(after) if after else ZERO_UUID,
            "model": model,
            "limit": limit,
            "replace": replace,
        }
        with tenant(self.db, org_id):
            rows = self.db.execute_sql(MISSING_EMBEDDINGS_SQL, params).fetchall()
        return [(uuid_column(r[0]), r[1]) for r in rows]

    def count_missing(
        self,
        org_id: uuid.UUID,
        model: str,
        *,
        agent_id: uuid.UUID | None = None,
        replace: bool = False,
    ) -> int:
        params = {
            "org_id": str(org_id),
            "agent_id": str(agent_id) if agent_id else None,
            "model": model,
            "replace": replace,
        }
        with tenant(self.db, org_id):
            row = self.db.execute_sql(COUNT_MISSING_SQL, params).fetchone()
        return int(row[0])

    def put(
        self,
        org_id: uuid.UUID,
        model: str,
        dimension: int,
        vectors: Sequence[tuple[uuid.UUID, Sequence[float]]],
    ) -> int:
        """Store (replace) the vectors of existing memories; returns how many were stored
        (a memory deleted meanwhile is skipped). A model registered with another dimension
        stores nothing and raises :class:`EmbeddingDimensionError`."""
        if not vectors:
            return 0
        ids = [str(memory_id) for memory_id, _ in vectors]
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                PUT_EMBEDDINGS_SQL, (ids, model, dimension, Json([list(v) for _, v in vectors]))
            ).fetchone()
        stored = int(row[0])
        if stored < 0:
            raise EmbeddingDimensionError(model, dimension, self.model_dimension(model))
        return stored

    def model_dimension(self, model: str) -> int | None:
        """The dimension ``model``'s vectors were stored with; None: none stored yet."""
        try:
            with db_errors():
                row = self.db.execute_sql(MODEL_DIMENSION_SQL, (model,)).fetchone()
        except peewee.ProgrammingError:
            return None  # not migrated yet: /readyz and the schema gate say so
        return int(row[0]) if row else None

    def register(self, model: str, dimension: int) -> bool:
        """Register the model a process is configured with (as the owner, outside any
        tenant): vectors of a model are stored only once it is registered with their
        dimension. False when the schema is not migrated yet (the schema gate says so).
        Raises :class:`EmbeddingDimensionError` when the model is registered with another
        dimension (a misconfigured ``EMBEDDINGS_DIMENSION``)."""
        try:
            with db_errors(), transaction(self.db):
                self.db.execute_sql(REGISTER_MODEL_SQL, (model, dimension))
        except peewee.ProgrammingError:
            return False
        self.check_dimension(model, dimension)
        return True

    def check_dimension(self, model: str, dimension: int) -> None:
        """Raise :class:`EmbeddingDimensionError` when ``model`` has vectors of another
        dimension stored (a misconfigured ``EMBEDDINGS_DIMENSION``)."""
        stored = self.model_dimension(model)
        if stored is not None and stored != dimension:
            raise EmbeddingDimensionError(model, dimension, stored)

    def ensure_index(self, dimension: int) -> bool:
        """Create the HNSW index of ``dimension`` where pgvector is installed (as the table's
        owner); True when the index exists."""
        with db_errors(), self.db.atomic():
            row = self.db.execute_sql(VECTOR_INDEX_SQL, (dimension,)).fetchone()
        return bool(row[0])

    def has_index(self, dimension: int) -> bool:
        with db_errors():
            row = self.db.execute_sql(HAS_VECTOR_INDEX_SQL, (dimension,)).fetchone()
        return bool(row[0])


class EmbeddingDimensionError(ConfigError):
    """The configured embedder's dimension is not the one its model's vectors were stored
    with: a start-up error (web, worker) and not ready in ``/readyz``."""

    def __init__(self, model: str, configured: int, stored: int | None) -> None:
        super().__init__(
            f"EMBEDDINGS_DIMENSION: model {model!r} is configured with {configured} dimensions"
            f" but its stored vectors have {stored}; fix the setting, or use another model and"
            " run `ibex reembed`",
            variable="EMBEDDINGS_DIMENSION",
        )
        self.model = model
        self.configured = configured
        self.stored = stored
