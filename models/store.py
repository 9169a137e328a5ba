"""SessionStore: typed access to sessions and their turns, always under row-level security.

Tenant operations open a :func:`core.db.tenant` transaction for the org they name. Extraction
progress is not here: the pointer (``sessions.last_extracted_turn``) is moved by
``extraction.turns``, and the scan's cross-org reads are ``extraction.scan_queries``; the
listing with progress and the idle closing are :mod:`models.session_status`.

Over 400 lines but one idea: storing one session aggregate (its org, agent, session row and
append-only turns), whose writes all take the same session-row lock and share its checks.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import peewee
from playhouse.postgres_ext import PostgresqlExtDatabase

from core.canonical import canonical_json
from core.db import db_errors, make_database, operator_scope, tenant, transaction
from core.errors import (
    ConfigError,
    ImmutableTurnError,
    NotFoundError,
    TurnGapError,
    UserConflictError,
)
from models.base import bind
from models.sessions import Checkpoint, CheckpointPayload, Session


def content_digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TurnInput:
    """One turn to append: what the harness recorded for one LLM call."""

    messages: list[dict[str, Any]]
    completion: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0
    is_streaming: bool = False
    is_complete: bool = True

    @classmethod
    def from_loaded(cls, turn: Mapping[str, Any]) -> TurnInput:
        """A turn as the import line and the sessions API load it (their schemas share these
        field names); a field a schema does not have keeps its default."""
        fields = {
            name: turn[name]
            for name in (
                "messages",
                "completion",
                "prompt_tokens",
                "completion_tokens",
                "latency_ms",
                "is_streaming",
                "is_complete",
            )
            if name in turn
        }
        return cls(**fields)

    @property
    def messages_hash(self) -> str:
        return content_digest(self.messages)

    @property
    def completion_hash(self) -> str:
        return content_digest(self.completion)


@dataclass(frozen=True)
class Turn:
    """One stored turn with its content."""

    session_id: uuid.UUID
    turn_index: int
    messages: list[dict[str, Any]]
    completion: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int


@dataclass(frozen=True)
class SessionName:
    """A session's id with the names a person knows it by."""

    session_id: uuid.UUID
    org: str
    agent: str
    external_id: str | None

    def __str__(self) -> str:
        return f"{self.org}/{self.agent}/{self.external_id or self.session_id}"


@dataclass(frozen=True)
class AppendResult:
    session_id: uuid.UUID
    created: bool
    turns_added: int
    turn_count: int


class UnknownOrgError(NotFoundError):
    """The org a tenant operation names does not exist."""


class UnknownUserError(NotFoundError):
    """A user named by id is not a live user of the org (unknown, of another org, or
    forgotten)."""


#: How many times a user's key is looked up again when the row that won its insert vanished
#: (forgotten in between): the key is then free, and the next insert takes it.
_USER_ATTEMPTS = 3

#: The unique key of a session's external id: one per agent and user (migration 000019); the
#: agent-wide sessions (no user) are one namespace of their own.
_USER_KEY = "COALESCE(user_id, '00000000-0000-0000-0000-000000000000'::uuid)"

#: Memories of a session that had no user, when it gets one: they are about that user. One
#: that would repeat a live memory of the user (same agent and content) is a duplicate and is
#: soft-deleted; the others take the user.
_SESSION_MEMORIES_DUPLICATE = """
UPDATE ibex_memory.memories m SET deleted_at = now()
 WHERE m.org_id = %(org)s AND m.session_id = %(session)s AND m.user_id IS NULL
   AND m.deleted_at IS NULL
   AND EXISTS (SELECT 1 FROM ibex_memory.memories d
                WHERE d.org_id = m.org_id AND d.agent_id = m.agent_id AND d.user_id = %(user)s
                  AND d.content_hash = m.content_hash AND d.deleted_at IS NULL)
"""
_SESSION_MEMORIES_TO_USER = """
UPDATE ibex_memory.memories m SET user_id = %(user)s
 WHERE m.org_id = %(org)s AND m.session_id = %(session)s AND m.user_id IS NULL
"""


def select_turns(session_id: uuid.UUID, first: int, last: int) -> list[Turn]:
    """Turns ``first..last`` (inclusive) of a session with their content, in order, in the
    current transaction (the caller has set the tenant)."""
    rows: Any = (
        Checkpoint.select(
            Checkpoint.turn_index,
            Checkpoint.prompt_tokens,
            Checkpoint.completion_tokens,
            Checkpoint.latency_ms,
            CheckpointPayload.messages,
            CheckpointPayload.completion,
        )
        .join(CheckpointPayload, on=(CheckpointPayload.checkpoint_id == Checkpoint.id))
        .where(
            Checkpoint.session_id == session_id,
            Checkpoint.turn_index.between(max(first, 1), last),
        )
        .order_by(Checkpoint.turn_index)
        .tuples()
    )
    return [Turn(session_id, ti, msgs, comp, pt, ct, lat) for ti, pt, ct, lat, msgs, comp in rows]


def upsert_org(db: peewee.Database, slug: str) -> uuid.UUID:
    """The id of the org with ``slug``, inserted when missing, in the current transaction."""
    row = db.execute_sql(
        "INSERT INTO ibex_core.orgs (slug) VALUES (%s) ON CONFLICT (slug) DO NOTHING RETURNING id",
        (slug,),
    ).fetchone()
    if row is None:
        row = db.execute_sql("SELECT id FROM ibex_core.orgs WHERE slug = %s", (slug,)).fetchone()
    return uuid.UUID(str(row[0]))


def select_org(db: peewee.Database, slug: str) -> uuid.UUID | None:
    """The id of the org with ``slug``, or None: never creates one."""
    row = db.execute_sql("SELECT id FROM ibex_core.orgs WHERE slug = %s", (slug,)).fetchone()
    return uuid.UUID(str(row[0])) if row else None


class SessionStore:
    """Sessions and turns in Postgres. Needs a database: without one it refuses to exist.

    Its own queries run on ``db`` whatever the models are bound to, so a process may hold
    stores on two databases (the web app's pool beside a test's connection); ``bind_models``
    also points the models at ``db`` for the code that queries them directly."""

    def __init__(self, db: PostgresqlExtDatabase | None, *, bind_models: bool = True) -> None:
        if db is None:
            raise ConfigError(
                "DATABASE_URL is not set: the session store is required", variable="DATABASE_URL"
            )
        self.db = bind(db) if bind_models else db

    @classmethod
    def from_url(cls, url: str | None) -> SessionStore:
        return cls(make_database(url))

    # -- orgs and agents -------------------------------------------------------------------

    def ensure_org(self, slug: str) -> uuid.UUID:
        """The org with ``slug``, created when missing (an operator action, outside RLS)."""
        with transaction(self.db):
            return self._ensure_org(slug)

    def _ensure_org(self, slug: str) -> uuid.UUID:
        return upsert_org(self.db, slug)

    def find_org(self, slug: str) -> uuid.UUID | None:
        with db_errors():
            return select_org(self.db, slug)

    def ensure_agent(self, org_id: uuid.UUID, slug: str) -> uuid.UUID:
        with tenant(self.db, org_id):
            return self._ensure_agent(org_id, slug)

    def _ensure_agent(self, org_id: uuid.UUID, slug: str) -> uuid.UUID:
        row = self.db.execute_sql(
            "INSERT INTO ibex_core.agents (org_id, slug) VALUES (%s, %s)"
            " ON CONFLICT (org_id, slug) DO NOTHING RETURNING id",
            (str(org_id), slug),
        ).fetchone()
        if row is None:
            row = self.db.execute_sql(
                "SELECT id FROM ibex_core.agents WHERE org_id = %s AND slug = %s",
                (str(org_id), slug),
            ).fetchone()
        return uuid.UUID(str(row[0]))

    # -- users ----------------------------------------------------------------------------

    def resolve_user(
        self,
        org_id: uuid.UUID,
        *,
        external_id: str | None = None,
        user_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """The live user of the org named by the application's key (created when missing) or
        by id (:class:`UnknownUserError` unless it is a live user of the org). Exactly one of
        the two must be given."""
        with tenant(self.db, org_id):
            return self._resolve_user(org_id, external_id=external_id, user_id=user_id)

    def _resolve_user(
        self,
        org_id: uuid.UUID,
        *,
        external_id: str | None = None,
        user_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        if (external_id is None) == (user_id is None):
            raise ValueError("name a user by its external id or by its id, not both or neither")
        if user_id is not None:
            row = self.db.execute_sql(
                "SELECT id FROM ibex_core.users WHERE id = %s AND org_id = %s"
                " AND deleted_at IS NULL",
                (str(user_id), str(org_id)),
            ).fetchone()
            if row is None:
                raise UnknownUserError(f"user {user_id} not found")
            return uuid.UUID(str(row[0]))
        for _ in range(_USER_ATTEMPTS):
            row = self.db.execute_sql(
                "INSERT INTO ibex_core.users (org_id, external_id) VALUES (%s, %s)"
                " ON CONFLICT (org_id, external_id) WHERE deleted_at IS NULL"
                " DO NOTHING RETURNING id",
                (str(org_id), external_id),
            ).fetchone()
            if row is None:
                row = self.db.execute_sql(
                    "SELECT id FROM ibex_core.users WHERE org_id = %s AND external_id = %s"
                    " AND deleted_at IS NULL",
                    (str(org_id), external_id),
                ).fetchone()
            if row is not None:
                return uuid.UUID(str(row[0]))
        raise UnknownUserError(f"user {external_id!r} kept being forgotten while it was named")

    def find_user(self, org_id: uuid.UUID, external_id: str) -> uuid.UUID | None:
        """The live user of the org with the application's key ``external_id``, or None."""
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT id FROM ibex_core.users WHERE org_id = %s AND external_id = %s"
                " AND deleted_at IS NULL",
                (str(org_id), external_id),
            ).fetchone()
        return uuid.UUID(str(row[0])) if row else None

    def session_user(
        self, org_id: uuid.UUID, session_id: uuid.UUID
    ) -> tuple[bool, uuid.UUID | None]:
        """Whether the org has a live session with this id, and its user (None: agent-wide)."""
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT user_id FROM ibex_core.sessions WHERE id = %s AND deleted_at IS NULL",
                (str(session_id),),
            ).fetchone()
        if row is None:
            return False, None
        return True, uuid.UUID(str(row[0])) if row[0] is not None else None

    def set_session_user(
        self, org_id: uuid.UUID, session_id: uuid.UUID, user_id: uuid.UUID
    ) -> Session:
        """Give a session its user (:meth:`resolve_user`); see :meth:`_apply_user`."""
        with tenant(self.db, org_id):
            session = self._get_session(session_id, for_update=True)
            self._apply_user(session, user_id)
            return session

    def _apply_user(self, session: Session, user_id: uuid.UUID | None) -> None:
        """Set the (locked) session's user once: the same user again is a no-op, another one
        :class:`~core.errors.UserConflictError`; None leaves the session as it is.

        The memories already drawn from the session were about that person too: they take the
        user (one that repeats a live memory of the user is soft-deleted as its duplicate). The
        session row is locked FOR UPDATE, which a memory insert's share lock on it conflicts
        with (migration 000012): a memory written concurrently is committed before this and
        takes the user here, or comes after and must carry the user itself."""
        if user_id is None:
            return
        current = session.user_id
        if current is not None:
            if uuid.UUID(str(current)) != user_id:
                raise UserConflictError(
                    f"session {session.id} belongs to user {current}, not {user_id}",
                    session_id=session.id,
                    user_id=uuid.UUID(str(current)),
                    requested=user_id,
                )
            return
        self.db.execute_sql(
            "UPDATE ibex_core.sessions SET user_id = %s WHERE id = %s",
            (str(user_id), str(session.id)),
        )
        params = {"org": str(session.org_id), "session": str(session.id), "user": str(user_id)}
        self.db.execute_sql(_SESSION_MEMORIES_DUPLICATE, params)
        self.db.execute_sql(_SESSION_MEMORIES_TO_USER, params)
        session.user_id = user_id

    # -- sessions --------------------------------------------------------------------------

    def find_sessions(
        self, ident: str, *, org: str | None = None, agent: str | None = None, limit: int = 10
    ) -> list[SessionName]:
        """Sessions across orgs (an operator read) whose id is ``ident`` or, when none is,
        whose external id is ``ident``, narrowed to the org and agent slugs given."""
        try:
            as_uuid: str | None = str(uuid.UUID(ident))
        except ValueError:
            as_uuid = None
        with operator_scope(self.db):
            rows = self.db.execute_sql(
                "SELECT s.id, o.slug, a.slug, s.external_id, s.id = %(id)s::uuid AS exact"
                "  FROM ibex_core.sessions s"
                "  JOIN ibex_core.orgs o ON o.id = s.org_id"
                "  JOIN ibex_core.agents a ON a.id = s.agent_id"
                " WHERE (s.id = %(id)s::uuid OR s.external_id = %(ext)s)"
                "   AND (%(org)s::text IS NULL OR o.slug = %(org)s)"
                "   AND (%(agent)s::text IS NULL OR a.slug = %(agent)s)"
                " ORDER BY exact DESC, o.slug, a.slug, s.id LIMIT %(limit)s",
                {"id": as_uuid, "ext": ident, "org": org, "agent": agent, "limit": limit},
            ).fetchall()
        if rows and rows[0][4]:
            rows = rows[:1]  # the session's own id wins over an external id that looks like one
        return [SessionName(uuid.UUID(str(r[0])), r[1], r[2], r[3]) for r in rows]

    def get_session(self, org_id: uuid.UUID, session_id: uuid.UUID) -> Session:
        with tenant(self.db, org_id):
            return self._get_session(session_id)

    def _get_session(self, session_id: uuid.UUID, *, for_update: bool = False) -> Session:
        query = Session.select().where(Session.id == session_id).bind(self.db)
        if for_update:
            query = query.for_update()
        session = query.first()
        if session is None:
            raise NotFoundError(f"session {session_id} not found")
        return session

    def find_session(
        self, org_id: uuid.UUID, agent_id: uuid.UUID, external_id: str
    ) -> Session | None:
        with tenant(self.db, org_id):
            return (
                Session.select()
                .where(
                    Session.org_id == org_id,
                    Session.agent_id == agent_id,
                    Session.external_id == external_id,
                )
                .bind(self.db)
                .first()
            )

    def create_session(
        self,
        org_id: uuid.UUID,
        agent_id: uuid.UUID,
        external_id: str | None = None,
        *,
        status: str = "active",
        model: str | None = None,
        provider: str | None = None,
        user_id: uuid.UUID | None = None,
    ) -> Session:
        """The session (created when missing); ``user_id`` (:meth:`resolve_user`) sets its
        user as :meth:`_apply_user` does."""
        with tenant(self.db, org_id):
            session, _ = self._upsert_session(
                org_id, agent_id, external_id, status, model, provider, user_id
            )
            return session

    def _upsert_session(
        self,
        org_id: uuid.UUID,
        agent_id: uuid.UUID,
        external_id: str | None,
        status: str,
        model: str | None,
        provider: str | None,
        user_id: uuid.UUID | None = None,
        *,
        claim_shared: bool = True,
    ) -> tuple[Session, bool]:
        """The session of (agent, user, ``external_id``), locked, created when missing; and
        whether it was created. An external id names a session per user: the same id for
        another user is another session (:meth:`_find_named`).

        ``claim_shared``: the caller acts for the org (an org token, ``ibex import``), so an
        agent-wide session with this external id is given ``user_id`` (:meth:`_apply_user`)
        rather than a new session opened beside it. A user-bound token's request passes False:
        it can neither see nor claim an agent-wide session, so it gets a session of its own."""
        if external_id is not None:
            found = self._find_named(agent_id, external_id, user_id, claim_shared=claim_shared)
            if found is not None:
                return found, False
        completed = "now()" if status == "completed" else "NULL"
        row = self.db.execute_sql(
            "INSERT INTO ibex_core.sessions"
            " (org_id, agent_id, external_id, status, model, provider, completed_at, user_id)"
            f" VALUES (%s, %s, %s, %s, %s, %s, {completed}, %s)"
            f" ON CONFLICT (org_id, agent_id, {_USER_KEY}, external_id)"
            " WHERE external_id IS NOT NULL DO NOTHING RETURNING id",
            (
                str(org_id),
                str(agent_id),
                external_id,
                status,
                model,
                provider,
                str(user_id) if user_id else None,
            ),
        ).fetchone()
        if row is not None:
            return self._get_session(uuid.UUID(str(row[0])), for_update=True), True
        # Created by a concurrent request since the lookup: that one is ours too.
        assert external_id is not None
        session = self._find_named(agent_id, external_id, user_id, claim_shared=False)
        assert session is not None
        return session, False

    def _find_named(
        self,
        agent_id: uuid.UUID,
        external_id: str,
        user_id: uuid.UUID | None,
        *,
        claim_shared: bool,
    ) -> Session | None:
        """The live or deleted session this (agent, user, external id) names, locked:

        - with a user: that user's session; else, for an org-level caller
          (``claim_shared``), the agent-wide one, which is given the user (late assignment);
        - without a user: the agent-wide session; else, for an org-level caller, the oldest
          session of any user with this external id (an org token that names no user reaches
          what the org has, as it always could).

        A session claimed by another user in the meantime is not taken: None then."""
        mine = self._select_named(agent_id, external_id, user_id)
        if mine is not None or not claim_shared:
            return mine
        if user_id is None:
            return self._select_named(agent_id, external_id, None, any_user=True)
        shared = self._select_named(agent_id, external_id, None)
        if shared is None:
            return None
        if shared.user_id is not None:  # claimed by someone else between lookup and lock
            return None
        self._apply_user(shared, user_id)
        return shared

    def _select_named(
        self,
        agent_id: uuid.UUID,
        external_id: str,
        user_id: uuid.UUID | None,
        *,
        any_user: bool = False,
    ) -> Session | None:
        query = Session.select().where(
            Session.agent_id == agent_id, Session.external_id == external_id
        )
        if any_user:
            query = query.order_by(Session.created_at, Session.id)
        elif user_id is None:
            query = query.where(Session.user_id.is_null())
        else:
            query = query.where(Session.user_id == user_id)
        found: Session | None = query.for_update().bind(self.db).first()
        return found

    def set_status(self, org_id: uuid.UUID, session_id: uuid.UUID, status: str) -> None:
        """Move a session to ``status``; completing it stamps completed_at once."""
        with tenant(self.db, org_id):
            self._set_status(session_id, status)

    def _set_status(self, session_id: uuid.UUID, status: str) -> None:
        # A session already in ``status`` is left untouched (updated_at included): repeating a
        # status change is a no-op.
        updated = self.db.execute_sql(
            "UPDATE ibex_core.sessions SET status = %s,"
            " completed_at = CASE WHEN %s = 'completed' THEN COALESCE(completed_at, now())"
            "                     ELSE completed_at END"
            " WHERE id = %s AND deleted_at IS NULL"
            "   AND status IS DISTINCT FROM %s::ibex_core.session_status",
            (status, status, str(session_id), status),
        ).rowcount
        if updated:
            return
        exists = self.db.execute_sql(
            "SELECT 1 FROM ibex_core.sessions WHERE id = %s AND deleted_at IS NULL",
            (str(session_id),),
        ).fetchone()
        if exists is None:
            raise NotFoundError(f"session {session_id} not found")

    def complete_session(self, org_id: uuid.UUID, session_id: uuid.UUID) -> None:
        self.set_status(org_id, session_id, "completed")

    def abandon_session(self, org_id: uuid.UUID, session_id: uuid.UUID) -> None:
        self.set_status(org_id, session_id, "abandoned")

    def soft_delete_session(self, org_id: uuid.UUID, session_id: uuid.UUID) -> None:
        with tenant(self.db, org_id):
            updated = self.db.execute_sql(
                "UPDATE ibex_core.sessions SET deleted_at = COALESCE(deleted_at, now())"
                " WHERE id = %s",
                (str(session_id),),
            ).rowcount
        if not updated:
            raise NotFoundError(f"session {session_id} not found")

    # -- the sessions API ------------------------------------------------------------------

    def open_session(
        self,
        org_id: uuid.UUID,
        *,
        agent_slug: str | None = None,
        agent_id: uuid.UUID | None = None,
        external_id: str | None = None,
        model: str | None = None,
        provider: str | None = None,
        user_id: uuid.UUID | None = None,
        claim_shared: bool = True,
    ) -> tuple[Session, bool]:
        """The session of (org, agent, user, ``external_id``), created ``active`` when missing
        (always created without an external id); return it and whether it was created. The
        agent is named by slug (created when missing) or by id (:class:`NotFoundError` unless
        it is one of the org's). ``user_id`` (:meth:`resolve_user`) is the session's user;
        ``claim_shared`` as :meth:`_upsert_session`. A soft-deleted session is returned as it
        is: the caller decides."""
        try:
            with tenant(self.db, org_id):
                if agent_slug is not None:
                    agent = self._ensure_agent(org_id, agent_slug)
                else:
                    found = self.db.execute_sql(
                        "SELECT id FROM ibex_core.agents WHERE id = %s", (str(agent_id),)
                    ).fetchone()
                    if found is None:
                        raise NotFoundError(f"agent {agent_id} not found")
                    agent = uuid.UUID(str(found[0]))
                return self._upsert_session(
                    org_id,
                    agent,
                    external_id,
                    "active",
                    model,
                    provider,
                    user_id,
                    claim_shared=claim_shared,
                )
        except peewee.IntegrityError as exc:
            # Only the org's foreign key can fail here: the agent is the org's or was just made.
            if getattr(getattr(exc, "orig", None), "pgcode", None) == "23503":
                raise UnknownOrgError(f"org {org_id} not found") from exc
            raise

    def append_turns_at(
        self, org_id: uuid.UUID, session_id: uuid.UUID, first: int, turns: Sequence[TurnInput]
    ) -> AppendResult:
        """Store ``turns`` as turns ``first``, ``first`` + 1, ... of a live session, in one
        transaction, through :meth:`sync_turns` (turns already stored are compared, not
        written again). The session row is locked, so concurrent appends run one at a time."""
        with tenant(self.db, org_id):
            session = self._get_session(session_id, for_update=True)
            if session.deleted_at is not None:
                raise NotFoundError(f"session {session_id} not found")
            added = self.sync_turns(session, turns, first)
            return AppendResult(session.id, False, added, session.turn_count + added)

    def delete_live_session(self, org_id: uuid.UUID, session_id: uuid.UUID) -> bool:
        """Soft-delete a session that is not deleted yet; whether one was. Joins the caller's
        transaction when there is one (the memories of the session go in the same one).

        The row is locked FOR UPDATE, which a memory insert's share lock on it conflicts with
        (migration 000007): a memory written concurrently is either committed before this
        transaction goes on, and deleted with the others, or stored deleted after it."""
        with tenant(self.db, org_id):
            locked = self.db.execute_sql(
                "SELECT 1 FROM ibex_core.sessions WHERE id = %s AND deleted_at IS NULL FOR UPDATE",
                (str(session_id),),
            ).fetchone()
            if locked is None:
                return False
            self.db.execute_sql(
                "UPDATE ibex_core.sessions SET deleted_at = now() WHERE id = %s",
                (str(session_id),),
            )
        return True

    # -- turns -----------------------------------------------------------------------------

    def append_turns(
        self, org_id: uuid.UUID, session_id: uuid.UUID, turns: Sequence[TurnInput]
    ) -> AppendResult:
        """Append ``turns`` as the session's next turn indexes."""
        with tenant(self.db, org_id):
            session = self._get_session(session_id, for_update=True)
            added = self._insert_turns(session, turns, session.turn_count + 1)
            return AppendResult(session.id, False, added, session.turn_count + added)

    def sync_turns(self, session: Session, turns: Sequence[TurnInput], first: int = 1) -> int:
        """Make the locked ``session`` hold ``turns`` as its turns ``first``, ``first`` + 1, ...;
        return how many were added. The one way turns are stored (``ibex import`` and the
        sessions API): stored turns must match exactly (checkpoints are immutable, so the same
        turns again are a no-op and other content is an :class:`ImmutableTurnError`), and no
        turn may be skipped (:class:`TurnGapError` names the next index)."""
        stored = session.turn_count
        if first < 1:
            raise ValueError("turn indexes start at 1")
        if first > stored + 1:
            raise TurnGapError(
                f"turn {first} would skip turns: the next turn of this session is {stored + 1}",
                expected_turn_index=stored + 1,
            )
        last = first + len(turns) - 1
        if first <= stored and turns:
            rows: Any = (
                Checkpoint.select(
                    Checkpoint.turn_index, Checkpoint.messages_hash, Checkpoint.completion_hash
                )
                .where(
                    Checkpoint.session_id == session.id,
                    Checkpoint.turn_index.between(first, min(stored, last)),
                )
                .order_by(Checkpoint.turn_index)
                .tuples()
                .bind(self.db)
            )
            for turn_index, messages_hash, completion_hash in rows:
                incoming = turns[turn_index - first]
                if (incoming.messages_hash, incoming.completion_hash) != (
                    messages_hash,
                    completion_hash,
                ):
                    raise ImmutableTurnError(
                        f"turn {turn_index} differs from the stored turn:"
                        " checkpoints are immutable",
                        turn_index=turn_index,
                    )
        if last <= stored:
            return 0
        return self._insert_turns(session, turns[stored + 1 - first :], stored + 1)

    def _insert_turns(self, session: Session, turns: Sequence[TurnInput], first: int) -> int:
        if not turns:
            return 0
        checkpoint_rows = []
        payload_rows = []
        for offset, turn in enumerate(turns):
            checkpoint_id = uuid.uuid4()
            turn_index = first + offset
            checkpoint_rows.append(
                {
                    "id": checkpoint_id,
                    "org_id": session.org_id,
                    "session_id": session.id,
                    "turn_index": turn_index,
                    "messages_hash": turn.messages_hash,
                    "completion_hash": turn.completion_hash,
                    "prompt_tokens": turn.prompt_tokens,
                    "completion_tokens": turn.completion_tokens,
                    "latency_ms": turn.latency_ms,
                    "is_streaming": turn.is_streaming,
                    "is_complete": turn.is_complete,
                }
            )
            payload_rows.append(
                {
                    "checkpoint_id": checkpoint_id,
                    "org_id": session.org_id,
                    "session_id": session.id,
                    "turn_index": turn_index,
                    "messages": turn.messages,
                    "completion": turn.completion,
                }
            )
        Checkpoint.insert_many(checkpoint_rows).execute(self.db)
        CheckpointPayload.insert_many(payload_rows).execute(self.db)
        self.db.execute_sql(
            "UPDATE ibex_core.sessions SET turn_count = %s,"
            " prompt_tokens = prompt_tokens + %s, completion_tokens = completion_tokens + %s,"
            " total_latency_ms = total_latency_ms + %s WHERE id = %s",
            (
                first + len(turns) - 1,
                sum(t.prompt_tokens for t in turns),
                sum(t.completion_tokens for t in turns),
                sum(t.latency_ms for t in turns),
                str(session.id),
            ),
        )
        return len(turns)

    def read_turns(
        self, org_id: uuid.UUID, session_id: uuid.UUID, first: int, last: int
    ) -> list[Turn]:
        """Turns ``first..last`` (inclusive) with their content, in order."""
        with tenant(self.db, org_id):
            return select_turns(session_id, first, last)

    def read_turn(self, org_id: uuid.UUID, session_id: uuid.UUID, turn_index: int) -> Turn:
        turns = self.read_turns(org_id, session_id, turn_index, turn_index)
        if not turns:
            raise NotFoundError(f"turn {turn_index} of session {session_id} not found")
        return turns[0]


__all__ = [
    "AppendResult",
    "SessionName",
    "SessionStore",
    "Turn",
    "TurnInput",
    "UnknownOrgError",
    "canonical_json",
    "content_digest",
]
