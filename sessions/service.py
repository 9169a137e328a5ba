"""The sessions flows: open, list, read, append turns, change status, delete. No HTTP.

Sessions, agents and turns are owned by :class:`sessions.store.SessionStore` (the same
``sync_turns`` as ``ibex import``: same hashes, same payload archive, same immutability rule)
and read with their progress by :class:`sessions.status.SessionStatusStore`. A deleted
session's memories go with it by the database's rule (a trigger, migration 000021), so this
module writes sessions only. It raises the domain's refusals (:mod:`sessions.errors`,
:class:`~core.errors.TurnIndexGapError`, :class:`~core.errors.ImmutableTurnError`), which the web
door maps onto HTTP in one place.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import cast

import peewee
from playhouse.postgres_ext import PostgresqlExtDatabase

from core.errors import RowNotFoundError
from core.prices import PriceTable
from sessions.agents import AgentResolver
from sessions.errors import (
    AgentNotFoundError,
    NoSuchOrgError,
    SessionDeletedError,
    SessionNotFoundError,
)
from sessions.readback import RecordedTurn, TurnReader
from sessions.status import SessionInfo, SessionStatusStore
from sessions.store import SessionStore, UnknownOrgError
from sessions.turns import TurnInput


class SessionService:
    """Each call takes ``owner``: a user-bound token's user, whose sessions alone it reaches
    (another user's session, or an agent-wide one, is not found, as another org's is); None
    reaches every session of the org."""

    def __init__(self, db: peewee.Database, prices: PriceTable | None = None) -> None:
        self.db = db
        # The service's pool; the models stay bound to whatever the process bound them to.
        self.sessions = SessionStore(cast(PostgresqlExtDatabase, db), bind_models=False)
        self.status = SessionStatusStore(db)
        self.agents = AgentResolver(db)
        self.reader = TurnReader(db, prices)

    def info(
        self, org_id: uuid.UUID, session_id: uuid.UUID, owner: uuid.UUID | None = None
    ) -> SessionInfo:
        """The live session with its progress."""
        infos = self.status.infos(org_id, session_id=session_id, limit=1, user_id=owner)
        if not infos:
            raise SessionNotFoundError()
        return infos[0]

    def turns(
        self,
        org_id: uuid.UUID,
        session_id: uuid.UUID,
        *,
        after: int,
        limit: int,
        owner: uuid.UUID | None = None,
    ) -> list[RecordedTurn]:
        """The live session's turns after ``after`` (at most ``limit``) with their state and
        usage; a session the caller may not reach is not found, as an unknown one."""
        self.info(org_id, session_id, owner)
        return self.reader.turns(org_id, session_id, after=after, limit=limit)

    def _reachable(self, org_id: uuid.UUID, session_id: uuid.UUID, owner: uuid.UUID | None) -> None:
        """A user-bound token's check before a change: the session must be its user's."""
        if owner is not None:
            self.info(org_id, session_id, owner)

    def open(
        self,
        org_id: uuid.UUID,
        *,
        agent_slug: str | None,
        agent_id: uuid.UUID | None,
        external_id: str | None,
        model: str | None,
        provider: str | None,
        create_agent: bool = False,
        user_id: uuid.UUID | None = None,
        owner: uuid.UUID | None = None,
    ) -> tuple[SessionInfo, bool]:
        """The session of (org, agent, user, external id), opened when missing; whether it was.
        An agent slug the org does not have is :class:`AgentNotFoundError` unless
        ``create_agent``: a typo does not make a second agent (``ibex import`` keeps creating
        the agents its files name; that is its contract). ``user_id`` is its user. An
        external id names a session per user, so a user-bound token (``owner``) gets its own
        user's session or a new one, never another person's nor an agent-wide one; only an
        org-level caller gives an agent-wide session its user."""
        if agent_slug is not None and not create_agent:
            agent_id, agent_slug = self.agents.resolve(org_id, slug=agent_slug), None
        try:
            session, created = self.sessions.open_session(
                org_id,
                agent_slug=agent_slug,
                agent_id=agent_id,
                external_id=external_id,
                model=model,
                provider=provider,
                user_id=user_id,
                claim_shared=owner is None,
            )
        except UnknownOrgError:
            raise NoSuchOrgError() from None
        except RowNotFoundError:
            raise AgentNotFoundError(str(agent_id)) from None
        if session.deleted_at is not None:
            raise SessionDeletedError()
        return self.info(org_id, session.id), created

    def list(
        self,
        org_id: uuid.UUID,
        *,
        agent_id: uuid.UUID | None,
        external_id: str | None,
        status: str | None,
        limit: int,
        after: tuple[dt.datetime, uuid.UUID] | None,
        owner: uuid.UUID | None = None,
    ) -> list[SessionInfo]:
        return self.status.infos(
            org_id,
            agent_id=agent_id,
            external_id=external_id,
            status=status,
            limit=limit,
            after=after,
            user_id=owner,
        )

    def delete(
        self, org_id: uuid.UUID, session_id: uuid.UUID, owner: uuid.UUID | None = None
    ) -> None:
        """The session and every memory whose source it is, in one transaction: a reader sees
        both or neither."""
        self._reachable(org_id, session_id, owner)
        # Its memories are soft-deleted by the same statement's trigger (ibex_core.
        # session_deleted, migration 000021), in the same transaction.
        if not self.sessions.delete_live_session(org_id, session_id):
            raise SessionNotFoundError()

    def append_turns(
        self,
        org_id: uuid.UUID,
        session_id: uuid.UUID,
        first: int,
        turns: Sequence[TurnInput],
        owner: uuid.UUID | None = None,
    ) -> tuple[SessionInfo, int]:
        """Store ``turns`` from turn index ``first``; the session after, and how many were new
        (0 on a replay)."""
        self._reachable(org_id, session_id, owner)
        try:
            result = self.sessions.append_turns_at(org_id, session_id, first, turns)
        except RowNotFoundError:
            raise SessionNotFoundError() from None
        return self.info(org_id, session_id), result.turns_added

    def set_status(
        self, org_id: uuid.UUID, session_id: uuid.UUID, status: str, owner: uuid.UUID | None = None
    ) -> SessionInfo:
        self._reachable(org_id, session_id, owner)
        try:
            self.sessions.set_status(org_id, session_id, status)
        except RowNotFoundError:
            raise SessionNotFoundError() from None
        return self.info(org_id, session_id)
