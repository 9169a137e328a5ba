"""The sessions API: how an application feeds conversations to the pipeline over HTTP.

``POST /v1/sessions`` opens (or finds, by external id) a session; ``POST .../turns`` appends
turns through the same function as ``ibex import`` (:meth:`models.store.SessionStore.sync_turns`:
same hashes, same payload archive, same immutability rule), so a retried request is a replay,
never a second copy; ``complete`` makes the session a scan candidate, ``abandon`` keeps it out
of extraction; ``DELETE`` soft-deletes the session and its memories in one transaction. Every
route runs under row-level security for the caller's org: another org's session is a 404.
Scopes: ``sessions:write`` for changes, ``sessions:read`` for reads; ``DELETE`` also needs
``memory:write``, since it deletes memories too.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, cast

import falcon
import peewee
from playhouse.postgres_ext import PostgresqlExtDatabase

from core.db import tenant
from core.errors import ImmutableTurnError, NotFoundError, TurnGapError
from memory_service.cursor import encode_cursor
from memory_service.errors import ApiError, dumps
from memory_service.resources import (
    Api,
    authenticate,
    cursor_param,
    load,
    parse_json,
    read_body,
    validation_error,
)
from models.session_status import SessionInfo, SessionStatusStore
from models.store import SessionStore, TurnInput, UnknownOrgError
from schema.sessions import (
    MAX_EXTERNAL_ID_CHARS,
    SessionCreateSchema,
    SessionListQuerySchema,
    TurnsAppendSchema,
)

SESSIONS_READ, SESSIONS_WRITE = "sessions:read", "sessions:write"
MEMORY_WRITE = "memory:write"
SESSION_HEADER = "X-IBEX-Session-ID"
REPLAYED_HEADER = "Idempotent-Replayed"

CREATE_SCHEMA = SessionCreateSchema()
TURNS_SCHEMA = TurnsAppendSchema()
LIST_QUERY_SCHEMA = SessionListQuerySchema()


def _iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).isoformat() if value is not None else None


def session_json(info: SessionInfo) -> dict[str, Any]:
    """The public representation (``schema.sessions.SessionSchema``), JSON-ready."""
    s, p = info.session, info.progress
    return {
        "id": str(s.id),
        "org_id": str(s.org_id),
        "agent_id": str(s.agent_id),
        "external_id": s.external_id,
        "status": s.status,
        "model": s.model,
        "provider": s.provider,
        "turn_count": s.turn_count,
        "last_extracted_turn": s.last_extracted_turn,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "progress": {
            "done": p.done,
            "pending": p.pending,
            "failed": p.failed,
            "pointer": p.pointer,
        },
        "created_at": _iso(s.created_at),
        "updated_at": _iso(s.updated_at),
        "completed_at": _iso(s.completed_at),
    }


def _not_found() -> ApiError:
    return ApiError(404, "NOT_FOUND", "no such session")


def _external_id_header(req: falcon.Request) -> str | None:
    value = req.get_header(SESSION_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not 0 < len(value) <= MAX_EXTERNAL_ID_CHARS or not value.isprintable():
        raise ApiError(
            400,
            "INVALID_HEADER",
            f"{SESSION_HEADER} must be 1-{MAX_EXTERNAL_ID_CHARS} printable characters",
        )
    return value


def session_cursor(info: SessionInfo) -> str:
    """The list cursor after ``info``: the same codec as the memories list."""
    return encode_cursor(info.session.created_at, info.session.id)


class SessionsResource:
    """``/v1/sessions`` and ``/v1/sessions/{session_id}`` with its ``turns``, ``complete`` and
    ``abandon`` suffixes (Falcon suffixed responders)."""

    def __init__(self, api: Api, db: peewee.Database) -> None:
        self.api = api
        self.db = db
        # The service's pool; the models stay bound to whatever the process bound them to.
        self.sessions = SessionStore(cast(PostgresqlExtDatabase, db), bind_models=False)
        self.status = SessionStatusStore(db)
        self.memories = api.store

    def _info(self, org_id: uuid.UUID, session_id: uuid.UUID) -> SessionInfo:
        infos = self.status.infos(org_id, session_id=session_id, limit=1)
        if not infos:
            raise _not_found()
        return infos[0]

    @staticmethod
    def _answer(resp: falcon.Response, status: int, body: dict[str, Any]) -> None:
        resp.status = status
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps(body)

    # -- /v1/sessions ----------------------------------------------------------------------

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        named = _external_id_header(req)
        body = load(CREATE_SCHEMA, parse_json(read_body(req, self.api.max_body_bytes)))
        external_id = body["external_id"]
        if named is not None:
            if external_id is not None and external_id != named:
                raise validation_error(
                    {"external_id": [f"differs from the {SESSION_HEADER} header"]}
                )
            external_id = named
        try:
            session, created = self.sessions.open_session(
                org_id,
                agent_slug=body.get("agent"),
                agent_id=body.get("agent_id"),
                external_id=external_id,
                model=body["model"],
                provider=body["provider"],
            )
        except UnknownOrgError:
            raise ApiError(403, "FORBIDDEN_ORG", "no such org") from None
        except NotFoundError:
            raise validation_error({"agent_id": ["unknown agent for this org"]}) from None
        if session.deleted_at is not None:
            raise ApiError(
                409,
                "SESSION_DELETED",
                "the session with this external id was deleted; use another external id",
            )
        info = self._info(org_id, session.id)
        resp.location = f"/v1/sessions/{session.id}"
        self._answer(resp, 201 if created else 200, session_json(info))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _, org_id = authenticate(self.api, req, SESSIONS_READ)
        # The cursor first: a malformed one is a 400 of its own, whatever else is wrong.
        after = cursor_param(req)
        query = load(LIST_QUERY_SCHEMA, dict(req.params))
        limit = query["limit"]
        infos = self.status.infos(
            org_id,
            agent_id=query.get("agent_id"),
            external_id=query.get("external_id"),
            status=query.get("status"),
            limit=limit + 1,
            after=after,
        )
        next_cursor = session_cursor(infos[limit - 1]) if len(infos) > limit else None
        self._answer(
            resp,
            200,
            {"items": [session_json(i) for i in infos[:limit]], "next_cursor": next_cursor},
        )

    # -- /v1/sessions/{session_id} ---------------------------------------------------------

    def on_get_one(self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID) -> None:
        _, org_id = authenticate(self.api, req, SESSIONS_READ)
        self._answer(resp, 200, session_json(self._info(org_id, session_id)))

    def on_delete_one(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        """The session and every memory whose source it is, in one transaction: a reader sees
        both or neither. Deleting memories needs ``memory:write`` too, as
        ``DELETE /v1/memories/{id}`` does."""
        principal, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        if MEMORY_WRITE not in principal.scopes:
            raise ApiError(403, "INSUFFICIENT_SCOPE", f"this token lacks the {MEMORY_WRITE} scope")
        with tenant(self.db, org_id):
            if not self.sessions.delete_live_session(org_id, session_id):
                raise _not_found()
            self.memories.soft_delete_session_memories(org_id, session_id)
        resp.status = 204

    def on_post_turns(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        _, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        body = load(TURNS_SCHEMA, parse_json(read_body(req, self.api.max_body_bytes)))
        turns = [TurnInput.from_loaded(t) for t in body["turns"]]
        try:
            result = self.sessions.append_turns_at(
                org_id, session_id, body["turns"][0]["turn_index"], turns
            )
        except NotFoundError:
            raise _not_found() from None
        except TurnGapError as exc:
            raise ApiError(
                409, "TURN_GAP", str(exc), expected_turn_index=exc.expected_turn_index
            ) from None
        except ImmutableTurnError as exc:
            raise ApiError(409, "TURN_CONFLICT", str(exc), turn_index=exc.turn_index) from None
        info = self._info(org_id, session_id)
        if not result.turns_added:
            resp.set_header(REPLAYED_HEADER, "true")
        self._answer(
            resp,
            201 if result.turns_added else 200,
            {"session": session_json(info), "turns_added": result.turns_added},
        )

    def _status(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID, status: str
    ) -> None:
        _, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        try:
            self.sessions.set_status(org_id, session_id, status)
        except NotFoundError:
            raise _not_found() from None
        self._answer(resp, 200, session_json(self._info(org_id, session_id)))

    def on_post_complete(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        self._status(req, resp, session_id, "completed")

    def on_post_abandon(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        self._status(req, resp, session_id, "abandoned")


def add_routes(app: falcon.App, api: Api, db: peewee.Database) -> None:
    """Serve the sessions API on ``app``."""
    resource = SessionsResource(api, db)
    one = "/v1/sessions/{session_id:uuid}"
    app.add_route("/v1/sessions", resource)
    app.add_route(one, resource, suffix="one")
    for action in ("turns", "complete", "abandon"):
        app.add_route(f"{one}/{action}", resource, suffix=action)
