"""Where sessions stand: the listing with extraction progress, and the closing of idle ones.

:class:`SessionStatusStore` answers the sessions API's reads (``GET /v1/sessions``, one
session) and closes the sessions left ``active`` too long (the scheduler's step before each
scan). Storing sessions and their turns is :class:`sessions.store.SessionStore`'s; how far
extraction has got is counted by ``ibex_core.session_progress`` (migration 000008), the
schema's one read of the pipeline's per-turn state for code that may not import the pipeline.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import peewee

from core.config import Settings
from core.db import make_database, operator_scope, tenant
from models.sessions import SessionRow
from sessions.store import close_idle

#: What ``close_idle`` may do to an idle session, and the status it then has.
IDLE_ACTIONS = {"complete": "completed", "abandon": "abandoned"}


@dataclass(frozen=True)
class ExtractionProgress:
    """How far extraction has got with a session's turns: ``done`` and ``failed`` turns (their
    state in the pipeline), ``pending`` (every other turn: not yet scanned, queued, or in
    flight), and the pointer (``last_extracted_turn``)."""

    done: int
    pending: int
    failed: int
    pointer: int


@dataclass(frozen=True)
class SessionInfo:
    """A session with its extraction progress."""

    session: SessionRow
    progress: ExtractionProgress


class SessionStatusStore:
    """The listing and the idle closing, on ``db`` (whatever the models are bound to)."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def infos(
        self,
        org_id: uuid.UUID,
        *,
        session_id: uuid.UUID | None = None,
        agent_id: uuid.UUID | None = None,
        external_id: str | None = None,
        status: str | None = None,
        limit: int = 50,
        after: tuple[dt.datetime, uuid.UUID] | None = None,
        user_id: uuid.UUID | None = None,
    ) -> list[SessionInfo]:
        """Live sessions of the org, newest first, with their progress; ``after`` is the
        (created_at, id) of the last one already seen; ``user_id``: that user's only."""
        query = SessionRow.select().where(SessionRow.deleted_at.is_null())
        if session_id is not None:
            query = query.where(SessionRow.id == session_id)
        if agent_id is not None:
            query = query.where(SessionRow.agent_id == agent_id)
        if external_id is not None:
            query = query.where(SessionRow.external_id == external_id)
        if status is not None:
            query = query.where(SessionRow.status == status)
        if user_id is not None:
            query = query.where(SessionRow.user_id == user_id)
        if after is not None:
            query = query.where(
                peewee.Tuple(SessionRow.created_at, SessionRow.id)
                < peewee.Tuple(after[0], after[1])
            )
        query = query.order_by(SessionRow.created_at.desc(), SessionRow.id.desc()).limit(limit)
        with tenant(self.db, org_id):
            sessions = list(query.bind(self.db))
            progress = self._progress(sessions)
        return [SessionInfo(s, progress[s.id]) for s in sessions]

    def _progress(self, sessions: Sequence[SessionRow]) -> dict[uuid.UUID, ExtractionProgress]:
        """The progress of ``sessions``, in the caller's tenant transaction."""
        counts: dict[uuid.UUID, tuple[int, int]] = defaultdict(lambda: (0, 0))
        if sessions:
            rows = self.db.execute_sql(
                "SELECT session_id, done, failed FROM ibex_core.session_progress(%s::uuid[])",
                ([str(s.id) for s in sessions],),
            ).fetchall()
            for sid, done, failed in rows:
                counts[uuid.UUID(str(sid))] = (int(done), int(failed))
        result = {}
        for s in sessions:
            done, failed = counts[uuid.UUID(str(s.id))]
            pending = max(s.turn_count - done - failed, 0)
            result[s.id] = ExtractionProgress(done, pending, failed, s.last_extracted_turn)
        return result

    def close_idle(self, idle_seconds: int, action: str, *, batch: int = 500) -> int:
        """Complete (or abandon, per ``action``) every ``active`` session with no turn and no
        change for ``idle_seconds``; return how many were closed. Idle sessions are found
        across orgs by the operator role (read only), then closed org by org under row-level
        security, each re-checked in its UPDATE, so a turn appended meanwhile keeps its session
        open."""
        status = IDLE_ACTIONS[action]
        closed = 0
        while True:
            with operator_scope(self.db):
                rows = self.db.execute_sql(
                    "SELECT org_id, id FROM ibex_core.sessions"
                    " WHERE status = 'active' AND deleted_at IS NULL"
                    "   AND updated_at < now() - make_interval(secs => %s)"
                    " ORDER BY updated_at LIMIT %s",
                    (idle_seconds, batch),
                ).fetchall()
            by_org: dict[str, list[str]] = defaultdict(list)
            for org, sid in rows:
                by_org[str(org)].append(str(sid))
            closed_now = 0
            for org, ids in by_org.items():
                with tenant(self.db, org):
                    closed_now += close_idle(self.db, ids, status, idle_seconds)
            closed += closed_now
            if len(rows) < batch or not closed_now:
                return closed


@functools.cache
def _idle_store(url: str) -> SessionStatusStore:
    return SessionStatusStore(make_database(url))


def close_idle_sessions(settings: Settings) -> int:
    """Close the sessions idle for ``SESSION_IDLE_SECONDS`` with ``SESSION_IDLE_ACTION``
    (the scheduler's step before each scan); return how many were closed. One connection per
    process, kept between calls."""
    store = _idle_store(settings.require_database_url())
    return store.close_idle(settings.session_idle_seconds, settings.session_idle_action)


__all__ = [
    "IDLE_ACTIONS",
    "ExtractionProgress",
    "SessionInfo",
    "SessionStatusStore",
    "close_idle_sessions",
]
