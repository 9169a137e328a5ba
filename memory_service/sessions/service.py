"""The sessions flows: open, list, read, append turns, change status, delete. No HTTP.

The SQL is the pipeline's own: sessions, agents and turns are owned by
:class:`models.store.SessionStore` (the same ``sync_turns`` as ``ibex import``: same hashes,
same payload archive, same immutability rule) and read with their progress by
:class:`models.session_status.SessionStatusStore`; a session's memories by
:class:`~memory_service.memories.store.MemoryStore`. This module decides what each call does
across them (a delete spans two stores in one transaction) and raises the domain's refusals
(:mod:`memory_service.domain_errors`, :class:`~core.errors.TurnGapError`,
:class:`~core.errors.ImmutableTurnError`), which the app maps onto HTTP in one place.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import cast

import peewee
from playhouse.postgres_ext import PostgresqlExtDatabase

from core.db import tenant
from core.errors import NotFoundError
from memory_service.agents import AgentResolver
from memory_service.domain_errors import (
    AgentNotFoundError,
    NoSuchOrgError,
    SessionDeletedError,
    SessionNotFoundError,
)
from memory_service.memories.store import MemoryStore
from models.session_status import SessionInfo, SessionStatusStore
from models.store import SessionStore, TurnInput, UnknownOrgError


class SessionService:
    """Each call takes ``owner``: a user-bound token's user, whose sessions alone it reaches
    (another user's session, or an agent-wide one, is not found, as another org's is); None
    reaches every session of the org."""

    def __init__(self, db: peewee.Database, memories: MemoryStore) -> None:
        self.db = db
        # The service's pool; the models stay bound to whatever the process bound them to.
        self.sessions = SessionStore(cast(PostgresqlExtDatabase, db), bind_models=False)
        self.status = SessionStatusStore(db)
        self.memories = memories
        self.agents = AgentResolver(db)

    def info(
        self, org_id: uuid.UUID, session_id: uuid.UUID, owner: uuid.UUID | None = None
    ) -> SessionInfo:
        """The live session with its progress."""
        infos = self.status.infos(org_id, session_id=session_id, limit=1, user_id=owner)
        if not infos:
            raise SessionNotFoundError()
        return infos[0]

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
        except NotFoundError:
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
        with tenant(self.db, org_id):
            if not self.sessions.delete_live_session(org_id, session_id):
                raise SessionNotFoundError()
            self.memories.soft_delete_session_memories(org_id, session_id)

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
        except NotFoundError:
            raise SessionNotFoundError() from None
        return self.info(org_id, session_id), result.turns_added

    def set_status(
        self, org_id: uuid.UUID, session_id: uuid.UUID, status: str, owner: uuid.UUID | None = None
    ) -> SessionInfo:
        self._reachable(org_id, session_id, owner)
        try:
            self.sessions.set_status(org_id, session_id, status)
        except NotFoundError:
            raise SessionNotFoundError() from None
        return self.info(org_id, session_id)
