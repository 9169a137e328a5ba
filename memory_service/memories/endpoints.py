"""The HTTP resources: /v1/memories, /v1/memories/{id}, health and the OpenAPI document.

Resources authenticate, parse and respond; what a write does is decided by
:class:`~memory_service.memories.service.MemoryService`. ``POST /v1/memories`` in order:
authenticate, check the scope and the org, check the idempotency key header, read at most the
body limit, parse, and hand the document to the service, which validates it before it touches
the key.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import falcon
import redis
from marshmallow import Schema, ValidationError

from core.db import db_errors
from core.errors import SchemaNotReadyError
from core.migrate import verify_schema
from memory_service.auth import (
    Authenticator,
    AuthError,
    Principal,
    require_scope,
    resolve_org,
)
from memory_service.cursor import InvalidCursorError, Position, decode_cursor, encode_cursor
from memory_service.errors import ApiError, dumps
from memory_service.memories.service import MemoryService, Response
from memory_service.memories.store import MemoryStore
from schema import describe_errors
from schema.memory import MAX_IDEMPOTENCY_KEY_CHARS, MemoryListQuerySchema

READ, WRITE = "memory:read", "memory:write"
# Built once: a marshmallow Schema is costly to instantiate and safe to share for load().
LIST_QUERY_SCHEMA = MemoryListQuerySchema()


@dataclass
class Api:
    """What the resources share, built once by ``create_app``."""

    auth: Authenticator
    max_body_bytes: int
    store: MemoryStore
    service: MemoryService


def _reject(exc: AuthError) -> ApiError:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return ApiError(exc.status, exc.code, exc.message, headers=headers)


def authenticate(api: Api, req: falcon.Request, scope: str) -> tuple[Principal, uuid.UUID]:
    """The caller and the org it acts for; 401, 403 or 400 when there is none."""
    try:
        principal = api.auth.authenticate(req.get_header("Authorization"))
        require_scope(principal, scope)
        return principal, resolve_org(principal, req.get_header("X-IBEX-Org-ID"))
    except AuthError as exc:
        raise _reject(exc) from None


def validation_error(messages: dict[str, Any] | list[Any]) -> ApiError:
    """The 422 of a request that does not validate, field by field."""
    return ApiError(
        422,
        "VALIDATION_FAILED",
        f"invalid request: {describe_errors(messages)}",
        fields=messages,
    )


def load(schema: Schema, data: Any) -> dict[str, Any]:
    """``schema.load(data)``, or a 422 field by field."""
    try:
        result: dict[str, Any] = schema.load(data)
    except ValidationError as exc:
        raise validation_error(exc.messages) from None
    return result


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("non-finite number")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no numbers that overflow; else 400."""
    try:
        text = raw.decode("utf-8")
        return json.loads(text, parse_float=_finite_float, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ApiError(400, "MALFORMED_JSON", f"the body is not valid JSON: {exc}") from None


def read_body(req: falcon.Request, limit: int) -> bytes:
    length = req.content_length
    if length is not None and length > limit:
        raise ApiError(413, "BODY_TOO_LARGE", f"the body must be at most {limit} bytes")
    # A chunked body has no length; servers that de-chunk it (gunicorn) say so with
    # wsgi.input_terminated, and only then may the raw stream be read to its end.
    terminated = length is None and req.env.get("wsgi.input_terminated")
    stream = req.stream if terminated else req.bounded_stream
    try:
        raw: bytes = stream.read(limit + 1)
    except Exception as exc:
        # The WSGI server's own error for a body it cannot decode (a broken chunk, a client
        # gone mid-body): the client's mistake, whatever server raised it.
        raise ApiError(400, "BAD_REQUEST", f"the body could not be read: {exc}") from None
    if len(raw) > limit:
        raise ApiError(413, "BODY_TOO_LARGE", f"the body must be at most {limit} bytes")
    return raw


def idempotency_key(req: falcon.Request) -> str | None:
    key = req.get_header("X-Idempotency-Key")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not key.isprintable():
        raise ApiError(
            400,
            "INVALID_HEADER",
            f"X-Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable characters",
        )
    return key


def respond(resp: falcon.Response, response: Response) -> None:
    resp.status = response.status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = response.body
    if response.location:
        resp.location = response.location
    for name, value in response.headers.items():
        resp.set_header(name, value)


class MemoriesResource:
    def __init__(self, api: Api) -> None:
        self.api = api

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        api = self.api
        _, org_id = authenticate(api, req, WRITE)
        key = idempotency_key(req)
        document = parse_json(read_body(req, api.max_body_bytes))
        respond(resp, api.service.create(org_id, key, document).response())

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _, org_id = authenticate(self.api, req, READ)
        # The cursor first: a malformed one is a 400 of its own, whatever else is wrong.
        after = cursor_param(req)
        query = load(LIST_QUERY_SCHEMA, dict(req.params))
        limit = query["limit"]
        rows = self.api.store.list(
            org_id,
            agent_id=query.get("agent_id"),
            session_id=query.get("session_id"),
            limit=limit + 1,
            after=after,
        )
        last = rows[limit - 1] if len(rows) > limit else None
        next_cursor = encode_cursor(last.created_at, last.id) if last else None
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps(
            {"items": [r.as_json() for r in rows[:limit]], "next_cursor": next_cursor}
        )


class MemoryResource:
    def __init__(self, api: Api) -> None:
        self.api = api

    def on_get(self, req: falcon.Request, resp: falcon.Response, memory_id: uuid.UUID) -> None:
        _, org_id = authenticate(self.api, req, READ)
        row = self.api.store.get(org_id, memory_id)
        if row is None:
            raise ApiError(404, "NOT_FOUND", "no such memory")
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps(row.as_json())

    def on_delete(self, req: falcon.Request, resp: falcon.Response, memory_id: uuid.UUID) -> None:
        _, org_id = authenticate(self.api, req, WRITE)
        if not self.api.store.soft_delete(org_id, memory_id):
            raise ApiError(404, "NOT_FOUND", "no such memory")
        resp.status = 204


def cursor_error() -> ApiError:
    return ApiError(
        400,
        "INVALID_CURSOR",
        "cursor: not a cursor this service issued",
        fields={"cursor": ["not a cursor this service issued"]},
    )


def cursor_param(req: falcon.Request) -> Position | None:
    """The position in the request's ``cursor`` parameter, if any; a malformed one is a 400."""
    if "cursor" not in req.params:
        return None
    try:
        return decode_cursor(req.params["cursor"])
    except InvalidCursorError:
        raise cursor_error() from None


class HealthResource:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps({"status": "ok"})


class ReadyResource:
    def __init__(
        self,
        store: MemoryStore,
        redis_client: redis.Redis,
        search_mode: Callable[[], str] | None = None,
    ) -> None:
        self.store = store
        self.redis = redis_client
        self.search_mode = search_mode

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        checks: dict[str, str] = {}
        details: dict[str, str] = {}
        try:
            self.store.ping()
            checks["postgres"] = "ok"
        except Exception as exc:
            checks["postgres"] = f"error: {type(exc).__name__}"
        else:
            # Not ready until the schema is current: before `ibex migrate`, every request would
            # answer 500.
            try:
                with db_errors():
                    verify_schema(lambda sql: self.store.db.execute_sql(sql).fetchall())
                checks["schema"] = "ok"
            except Exception as exc:
                checks["schema"] = f"error: {type(exc).__name__}"
                if isinstance(exc, SchemaNotReadyError):
                    details["schema"] = str(exc)
        try:
            self.redis.ping()
            checks["redis"] = "ok"
        except Exception as exc:
            checks["redis"] = f"error: {type(exc).__name__}"
        ready = all(v == "ok" for v in checks.values())
        if self.search_mode is not None and checks.get("schema") == "ok":
            try:
                details["search"] = self.search_mode()
            except Exception as exc:
                details["search"] = f"error: {type(exc).__name__}"
        body: dict[str, Any] = {"status": "ok" if ready else "unavailable", "checks": checks}
        if details:
            body["details"] = details
        resp.status = 200 if ready else 503
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps(body)


class OpenApiResource:
    def __init__(self, document: dict[str, Any]) -> None:
        self.body = dumps(document)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.body
