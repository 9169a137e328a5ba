"""SessionStore: every statement that writes ``ibex_core.sessions``, always under row-level
security, and the flows of one session row (open by external id, give it its user, append its
turns, change its status, delete it).

Tenant operations open a :func:`core.db.tenant` transaction for the org they name. Each write
of a session takes the same session-row lock and shares its checks; the rows it names are their
owners': orgs and agents :mod:`sessions.orgs`, users :mod:`sessions.users`, the turns
:mod:`sessions.turns`. Writes other modules decide are here too, as functions: the pointer
(``last_extracted_turn``, which ``extraction.turns`` moves) and the idle closing (which
:mod:`sessions.status` runs). The scan's cross-org reads are ``extraction.scan_queries``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import peewee
from playhouse.postgres_ext import PostgresqlExtDatabase

from core.db import db_errors, make_database, operator_scope, tenant, transaction
from core.errors import (
    ConfigError,
    RowNotFoundError,
    SessionUserConflictError,
)
from models.base import bind
from models.sessions import SessionRow
from sessions import users
from sessions.orgs import select_org, upsert_agent, upsert_org
from sessions.turns import TurnInput, TurnRecord, check_stored, insert_turns, select_turns


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


class UnknownOrgError(RowNotFoundError):
    """The org a tenant operation names does not exist."""


#: The unique key of a session's external id: one per agent and user (migration 000019); the
#: agent-wide sessions (no user) are one namespace of their own.
_USER_KEY = "COALESCE(user_id, '00000000-0000-0000-0000-000000000000'::uuid)"


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
        return upsert_agent(self.db, org_id, slug)

    # -- users ----------------------------------------------------------------------------

    def resolve_user(
        self,
        org_id: uuid.UUID,
        *,
        external_id: str | None = None,
        user_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """The live user of the org named by the application's key (created when missing) or
        by id (:class:`UnknownUserError` unless it is a live user of the org): see
        :func:`sessions.users.resolve_user`."""
        with tenant(self.db, org_id):
            return self._resolve_user(org_id, external_id=external_id, user_id=user_id)

    def _resolve_user(
        self,
        org_id: uuid.UUID,
        *,
        external_id: str | None = None,
        user_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        return users.resolve_user(self.db, org_id, external_id=external_id, user_id=user_id)

    def find_user(self, org_id: uuid.UUID, external_id: str) -> uuid.UUID | None:
        """The live user of the org with the application's key ``external_id``, or None."""
        with tenant(self.db, org_id):
            return users.find_user(self.db, org_id, external_id)

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
    ) -> SessionRow:
        """Give a session its user (:meth:`resolve_user`); see :meth:`_apply_user`."""
        with tenant(self.db, org_id):
            session = self._get_session(session_id, for_update=True)
            self._apply_user(session, user_id)
            return session

    def _apply_user(self, session: SessionRow, user_id: uuid.UUID | None) -> None:
        """Set the (locked) session's user once: the same user again is a no-op, another one
        :class:`~core.errors.SessionUserConflictError`; None leaves the session as it is.

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
                raise SessionUserConflictError(
                    f"session {session.id} belongs to user {current}, not {user_id}",
                    session_id=session.id,
                    user_id=uuid.UUID(str(current)),
                    requested=user_id,
                )
            return
        # The memories drawn from the session take the user in the same statement's trigger
        # (ibex_core.session_given_user, migration 000021).
        self.db.execute_sql(
            "UPDATE ibex_core.sessions SET user_id = %s WHERE id = %s",
            (str(user_id), str(session.id)),
        )
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

    def get_session(self, org_id: uuid.UUID, session_id: uuid.UUID) -> SessionRow:
        with tenant(self.db, org_id):
            return self._get_session(session_id)

    def _get_session(self, session_id: uuid.UUID, *, for_update: bool = False) -> SessionRow:
        query = SessionRow.select().where(SessionRow.id == session_id).bind(self.db)
        if for_update:
            query = query.for_update()
        session: SessionRow | None = query.first()
        if session is None:
            raise RowNotFoundError(f"session {session_id} not found")
        return session

    def find_session(
        self, org_id: uuid.UUID, agent_id: uuid.UUID, external_id: str
    ) -> SessionRow | None:
        with tenant(self.db, org_id):
            found: SessionRow | None = (
                SessionRow.select()
                .where(
                    SessionRow.org_id == org_id,
                    SessionRow.agent_id == agent_id,
                    SessionRow.external_id == external_id,
                )
                .bind(self.db)
                .first()
            )
        return found

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
    ) -> SessionRow:
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
    ) -> tuple[SessionRow, bool]:
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
    ) -> SessionRow | None:
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
    ) -> SessionRow | None:
        query = SessionRow.select().where(
            SessionRow.agent_id == agent_id, SessionRow.external_id == external_id
        )
        if any_user:
            query = query.order_by(SessionRow.created_at, SessionRow.id)
        elif user_id is None:
            query = query.where(SessionRow.user_id.is_null())
        else:
            query = query.where(SessionRow.user_id == user_id)
        found: SessionRow | None = query.for_update().bind(self.db).first()
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
            raise RowNotFoundError(f"session {session_id} not found")

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
            raise RowNotFoundError(f"session {session_id} not found")

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
    ) -> tuple[SessionRow, bool]:
        """The session of (org, agent, user, ``external_id``), created ``active`` when missing
        (always created without an external id); return it and whether it was created. The
        agent is named by slug (created when missing) or by id (:class:`RowNotFoundError` unless
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
                        raise RowNotFoundError(f"agent {agent_id} not found")
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
                raise RowNotFoundError(f"session {session_id} not found")
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

    def sync_turns(self, session: SessionRow, turns: Sequence[TurnInput], first: int = 1) -> int:
        """Make the locked ``session`` hold ``turns`` as its turns ``first``, ``first`` + 1, ...;
        return how many were added. The one way turns are stored (``ibex import`` and the
        sessions API): stored turns must match exactly (checkpoints are immutable, so the same
        turns again are a no-op and other content is an :class:`ImmutableTurnError`), and no
        turn may be skipped (:class:`TurnIndexGapError` names the next index)."""
        stored = session.turn_count
        check_stored(self.db, session.id, stored, turns, first)
        last = first + len(turns) - 1
        if last <= stored:
            return 0
        return self._insert_turns(session, turns[stored + 1 - first :], stored + 1)

    def _insert_turns(self, session: SessionRow, turns: Sequence[TurnInput], first: int) -> int:
        """Append the turns and move the session's counters with them."""
        if not turns:
            return 0
        insert_turns(self.db, session.org_id, session.id, turns, first)
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
    ) -> list[TurnRecord]:
        """Turns ``first..last`` (inclusive) with their content, in order."""
        with tenant(self.db, org_id):
            return select_turns(session_id, first, last)

    def read_turn(self, org_id: uuid.UUID, session_id: uuid.UUID, turn_index: int) -> TurnRecord:
        turns = self.read_turns(org_id, session_id, turn_index, turn_index)
        if not turns:
            raise RowNotFoundError(f"turn {turn_index} of session {session_id} not found")
        return turns[0]


# -- writes other modules decide: the pointer, idle closing ----------------------------------


def advance_pointer(db: peewee.Database, session_id: str, turn: int) -> int | None:
    """Move the session's ``last_extracted_turn`` up to ``turn`` (never past its turn count,
    never backwards: ``GREATEST``), in the caller's transaction; the pointer after, or None
    when there is no such session. The pipeline's turn store decides when
    (:meth:`extraction.turns.TurnStore.advance_pointer`), under the session row's lock."""
    row = db.execute_sql(
        "UPDATE ibex_core.sessions"
        " SET last_extracted_turn = GREATEST(last_extracted_turn, LEAST(%s, turn_count))"
        " WHERE id = %s RETURNING last_extracted_turn",
        (turn, session_id),
    ).fetchone()
    return None if row is None else int(row[0])


def close_idle(db: peewee.Database, ids: Sequence[str], status: str, idle_seconds: int) -> int:
    """Move these sessions of the current tenant to ``status`` if they are still active and
    idle (each re-checked here, so a turn appended meanwhile keeps its session open); how
    many moved."""
    return int(
        db.execute_sql(
            "UPDATE ibex_core.sessions SET status = %s,"
            " completed_at = CASE WHEN %s = 'completed'"
            "   THEN COALESCE(completed_at, now()) ELSE completed_at END"
            " WHERE id = ANY(%s::uuid[]) AND status = 'active'"
            "   AND deleted_at IS NULL"
            "   AND updated_at < now() - make_interval(secs => %s)",
            (status, status, list(ids), idle_seconds),
        ).rowcount
    )


# -- erasure (``ibex prune --deleted-older-than``): the owner role, across orgs ---------------


def deleted_sessions(db: peewee.Database, cutoff: dt.datetime, after: str, limit: int) -> list[str]:
    """The next ``limit`` sessions soft-deleted before ``cutoff``, by id after ``after``,
    locked (ones another transaction holds are skipped: a later prune takes them)."""
    rows = db.execute_sql(
        "SELECT s.id::text FROM ibex_core.sessions s"
        " WHERE s.deleted_at < %s AND s.id > %s::uuid ORDER BY s.id LIMIT %s"
        " FOR UPDATE SKIP LOCKED",
        (cutoff, after, limit),
    ).fetchall()
    return [r[0] for r in rows]


def erase_sessions(db: peewee.Database, ids: Sequence[str]) -> int:
    """Hard-delete these sessions; every other owner's rows that name them must be gone first
    (their turns, extraction state, memories, dead letters)."""
    return int(
        db.execute_sql(
            "DELETE FROM ibex_core.sessions WHERE id = ANY(%s::uuid[])", (list(ids),)
        ).rowcount
    )


def count_erasable_sessions(db: peewee.Database, cutoff: dt.datetime) -> int:
    """The sessions an erasure would delete: those deleted before ``cutoff``."""
    row = db.execute_sql(
        "SELECT count(*) FROM ibex_core.sessions WHERE deleted_at < %s", (cutoff,)
    ).fetchone()
    return int(row[0])
