"""The sessions API: how an application feeds conversations to the pipeline over HTTP.

``POST /v1/sessions`` opens (or finds, by external id) a session; ``POST .../turns`` appends
turns through the same function as ``ibex import`` (see
:class:`~sessions.service.SessionService`), so a retried request is a replay,
never a second copy; ``complete`` makes the session a scan candidate, ``abandon`` keeps it out
of extraction; ``DELETE`` soft-deletes the session and its memories in one transaction. Every
route runs under row-level security for the caller's org: another org's session is a 404.
Scopes: ``sessions:write`` for changes, ``sessions:read`` for reads; ``DELETE`` also needs
``memory:write``, since it deletes memories too.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import falcon
import peewee

from core.prices import PriceTable
from memories.scope import USER_HEADER, UserRef
from memories.users import UserService
from memory_service.cursor import (
    InvalidCursorError,
    decode_turn_cursor,
    encode_cursor,
    encode_turn_cursor,
)
from memory_service.errors import ErrorAnswer, validation_error
from memory_service.http import (
    Api,
    authenticate,
    cursor_error,
    json_body,
    list_request,
    load_or_422,
    query_params,
    respond_json,
)
from schema.sessions import (
    MAX_EXTERNAL_ID_CHARS,
    SessionCreateSchema,
    SessionListQuerySchema,
    TurnListQuerySchema,
    TurnsAppendSchema,
)
from schema.users import MAX_USER_KEY_CHARS
from sessions.readback import RecordedTurn
from sessions.service import SessionService
from sessions.status import SessionInfo
from sessions.turns import TurnInput

SESSIONS_READ, SESSIONS_WRITE = "sessions:read", "sessions:write"
MEMORY_WRITE = "memory:write"
SESSION_HEADER = "X-IBEX-Session-ID"
REPLAYED_HEADER = "Idempotent-Replayed"

CREATE_SCHEMA = SessionCreateSchema()
TURNS_SCHEMA = TurnsAppendSchema()
LIST_QUERY_SCHEMA = SessionListQuerySchema()
TURNS_QUERY_SCHEMA = TurnListQuerySchema()


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
        "user_id": str(s.user_id) if s.user_id is not None else None,
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


def recorded_turn_json(turn: RecordedTurn) -> dict[str, Any]:
    """A turn read back (``schema.sessions.RecordedTurnSchema``), JSON-ready."""
    u = turn.usage
    return {
        "turn_index": turn.turn_index,
        "messages": turn.messages,
        "completion": turn.completion,
        "state": turn.state,
        "reason": turn.reason,
        "memories": turn.memories,
        "superseding": turn.superseding,
        "reused": turn.reused,
        "usage": None
        if u is None
        else {
            "llm_calls": u.llm_calls,
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "embedding_tokens": u.embedding_tokens,
            "latency_ms": u.latency_ms,
            "provider": u.provider,
            "model": u.model,
            "embedding_model": u.embedding_model,
            "cost": round(u.cost, 9),
        },
    }


def _external_id_header(req: falcon.Request) -> str | None:
    value = req.get_header(SESSION_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not 0 < len(value) <= MAX_EXTERNAL_ID_CHARS or not value.isprintable():
        raise ErrorAnswer(
            400,
            "INVALID_HEADER",
            f"{SESSION_HEADER} must be 1-{MAX_EXTERNAL_ID_CHARS} printable characters",
        )
    return value


def _user_header(req: falcon.Request) -> str | None:
    """The user's key in ``X-IBEX-User-ID``, if any."""
    value = req.get_header(USER_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not 0 < len(value) <= MAX_USER_KEY_CHARS or not value.isprintable():
        raise ErrorAnswer(
            400,
            "INVALID_HEADER",
            f"{USER_HEADER} must be 1-{MAX_USER_KEY_CHARS} printable characters",
        )
    return value


def _named_user(req: falcon.Request, body: dict[str, Any]) -> UserRef:
    """The user the body or the ``X-IBEX-User-ID`` header (a key) names; both: the same."""
    named = UserRef.of(body)
    header = _user_header(req)
    if header is None:
        return named
    if named.id is not None or (named.key is not None and named.key != header):
        raise validation_error({"user": [f"differs from the {USER_HEADER} header"]})
    return UserRef(key=header)


def session_cursor(info: SessionInfo) -> str:
    """The list cursor after ``info``: the same codec as the memories list."""
    return encode_cursor(info.session.created_at, info.session.id)


class SessionsResource:
    """``/v1/sessions`` and ``/v1/sessions/{session_id}`` with its ``turns``, ``complete`` and
    ``abandon`` suffixes (Falcon suffixed responders)."""

    def __init__(self, api: Api, service: SessionService, users: UserService) -> None:
        self.api = api
        self.service = service
        self.users = users

    # -- /v1/sessions ----------------------------------------------------------------------

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        principal, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        named = _external_id_header(req)
        body = json_body(req, self.api, CREATE_SCHEMA)
        external_id = body["external_id"]
        if named is not None:
            if external_id is not None and external_id != named:
                raise validation_error(
                    {"external_id": [f"differs from the {SESSION_HEADER} header"]}
                )
            external_id = named
        user_id = self.users.writer(principal, org_id, _named_user(req, body))
        info, created = self.service.open(
            org_id,
            agent_slug=body.get("agent"),
            agent_id=body.get("agent_id"),
            create_agent=body["create_agent"],
            external_id=external_id,
            model=body["model"],
            provider=body["provider"],
            user_id=user_id,
            owner=principal.user_id,
        )
        resp.location = f"/v1/sessions/{info.session.id}"
        respond_json(resp, 201 if created else 200, session_json(info))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        principal, org_id, after, query = list_request(
            self.api, req, SESSIONS_READ, LIST_QUERY_SCHEMA
        )
        if query.get("agent_id") is not None:
            self.service.agents.resolve(org_id, agent_id=query["agent_id"])
        limit = query["limit"]
        infos = self.service.list(
            org_id,
            agent_id=query.get("agent_id"),
            external_id=query.get("external_id"),
            status=query.get("status"),
            limit=limit + 1,
            after=after,
            owner=principal.user_id,
        )
        next_cursor = session_cursor(infos[limit - 1]) if len(infos) > limit else None
        respond_json(
            resp,
            200,
            {"items": [session_json(i) for i in infos[:limit]], "next_cursor": next_cursor},
        )

    # -- /v1/sessions/{session_id} ---------------------------------------------------------

    def on_get_one(self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID) -> None:
        principal, org_id = authenticate(self.api, req, SESSIONS_READ)
        info = self.service.info(org_id, session_id, principal.user_id)
        respond_json(resp, 200, session_json(info))

    def on_delete_one(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        """The session and every memory whose source it is, in one transaction: a reader sees
        both or neither. Deleting memories needs ``memory:write`` too, as
        ``DELETE /v1/memories/{id}`` does."""
        principal, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        if MEMORY_WRITE not in principal.scopes:
            raise ErrorAnswer(
                403, "INSUFFICIENT_SCOPE", f"this token lacks the {MEMORY_WRITE} scope"
            )
        self.service.delete(org_id, session_id, principal.user_id)
        resp.status = 204

    def on_post_turns(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        principal, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        body = json_body(req, self.api, TURNS_SCHEMA)
        turns = [TurnInput.from_loaded(t) for t in body["turns"]]
        info, added = self.service.append_turns(
            org_id, session_id, body["turns"][0]["turn_index"], turns, principal.user_id
        )
        if not added:
            resp.set_header(REPLAYED_HEADER, "true")
        respond_json(
            resp, 201 if added else 200, {"session": session_json(info), "turns_added": added}
        )

    def on_get_turns(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        """The session's turns in order, each as recorded with its state and usage. A
        user-bound token reaches its user's sessions only: another's is 404, as unknown."""
        principal, org_id = authenticate(self.api, req, SESSIONS_READ)
        after = 0
        if "cursor" in req.params:  # read first: a malformed cursor is a 400 of its own
            try:
                after = decode_turn_cursor(req.params["cursor"])
            except InvalidCursorError:
                raise cursor_error() from None
        query = load_or_422(TURNS_QUERY_SCHEMA, query_params(req))
        limit = query["limit"]
        turns = self.service.turns(
            org_id, session_id, after=after, limit=limit + 1, owner=principal.user_id
        )
        next_cursor = (
            encode_turn_cursor(turns[limit - 1].turn_index) if len(turns) > limit else None
        )
        respond_json(
            resp,
            200,
            {"items": [recorded_turn_json(t) for t in turns[:limit]], "next_cursor": next_cursor},
        )

    def _status(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID, status: str
    ) -> None:
        principal, org_id = authenticate(self.api, req, SESSIONS_WRITE)
        info = self.service.set_status(org_id, session_id, status, principal.user_id)
        respond_json(resp, 200, session_json(info))

    def on_post_complete(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        self._status(req, resp, session_id, "completed")

    def on_post_abandon(
        self, req: falcon.Request, resp: falcon.Response, session_id: uuid.UUID
    ) -> None:
        self._status(req, resp, session_id, "abandoned")


def add_routes(
    app: falcon.App[falcon.Request, falcon.Response],
    api: Api,
    db: peewee.Database,
    users: UserService,
    prices: PriceTable | None = None,
) -> None:
    """Serve the sessions API on ``app``; ``prices`` turns a turn's usage into money."""
    resource = SessionsResource(api, SessionService(db, prices), users)
    one = "/v1/sessions/{session_id:uuid}"
    app.add_route("/v1/sessions", resource)
    app.add_route(one, resource, suffix="one")
    for action in ("turns", "complete", "abandon"):
        app.add_route(f"{one}/{action}", resource, suffix=action)
