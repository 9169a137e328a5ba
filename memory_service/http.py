"""What every resource of the service shares: the caller, the body, the cursor, the answer.

A resource parses with these, calls its domain's service and answers with :func:`respond`.
Each refuses the way the whole service refuses, with an :class:`~memory_service.errors.ErrorAnswer`
that the app's error serializer turns into the one error body.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import falcon
from marshmallow import Schema, ValidationError

from core import fastjson
from memories.auth import (
    Authenticator,
    AuthError,
    Principal,
    require_scope,
    resolve_org,
)
from memory_service.cursor import InvalidCursorError, Position, decode_cursor
from memory_service.errors import ErrorAnswer, validation_error
from schema.bodies import dumps
from schema.common import may_hold_unstorable, unstorable


@dataclass
class Api:
    """What the resources share, built once by ``create_app``."""

    auth: Authenticator
    max_body_bytes: int


def _reject(exc: AuthError) -> ErrorAnswer:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return ErrorAnswer(exc.status, exc.code, exc.message, headers=headers)


def authenticate(api: Api, req: falcon.Request, scope: str | None) -> tuple[Principal, uuid.UUID]:
    """The caller and the org it acts for; 401, 403 or 400 when there is none. ``scope``: the
    one the route needs (None: any token of the org)."""
    try:
        principal = api.auth.authenticate(req.get_header("Authorization"))
        if scope is not None:
            require_scope(principal, scope)
        return principal, resolve_org(principal, req.get_header("X-IBEX-Org-ID"))
    except AuthError as exc:
        raise _reject(exc) from None


def load_or_422(schema: Schema, data: Any) -> dict[str, Any]:
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


def _strict_loads(text: str) -> Any:
    return json.loads(text, parse_float=_finite_float, parse_constant=_reject_constant)


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no numbers that overflow; else 400. A string that
    Postgres cannot store (NUL, a lone surrogate), anywhere in the document, is a 422 naming
    where it is."""
    try:
        text = raw.decode("utf-8")
        document = fastjson.loads(text, _strict_loads)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ErrorAnswer(400, "MALFORMED_JSON", f"the body is not valid JSON: {exc}") from None
    if may_hold_unstorable(text):
        problems = unstorable(document)
        if problems is not None:
            raise validation_error(problems if isinstance(problems, dict) else {"_": problems})
    return document


def query_params(req: falcon.Request) -> dict[str, Any]:
    """The request's query parameters; one holding a string Postgres cannot store is a 422."""
    params = dict(req.params)
    problems = unstorable(params)
    if problems is not None:
        raise validation_error(problems if isinstance(problems, dict) else {"_": problems})
    return params


def _too_large(limit: int) -> ErrorAnswer:
    return ErrorAnswer(
        413, "BODY_TOO_LARGE", f"the body must be at most {limit} bytes (MEMORY_MAX_BODY_BYTES)"
    )


def read_body(req: falcon.Request, limit: int) -> bytes:
    length = req.content_length
    if length is not None and length > limit:
        raise _too_large(limit)
    # A chunked body has no length; servers that de-chunk it (gunicorn) say so with
    # wsgi.input_terminated, and only then may the raw stream be read to its end.
    terminated = length is None and req.env.get("wsgi.input_terminated")
    stream = req.stream if terminated else req.bounded_stream
    try:
        raw: bytes = stream.read(limit + 1)
    except Exception as exc:
        # The WSGI server's own error for a body it cannot decode (a broken chunk, a client
        # gone mid-body): the client's mistake, whatever server raised it.
        raise ErrorAnswer(400, "BAD_REQUEST", f"the body could not be read: {exc}") from None
    if len(raw) > limit:
        raise _too_large(limit)
    return raw


def json_body(req: falcon.Request, api: Api, schema: Schema) -> dict[str, Any]:
    """The request's JSON body, read within the size limit and loaded with ``schema``."""
    return load_or_422(schema, parse_json(read_body(req, api.max_body_bytes)))


def cursor_error() -> ErrorAnswer:
    return ErrorAnswer(
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


def list_request(
    api: Api, req: falcon.Request, scope: str, schema: Schema
) -> tuple[Principal, uuid.UUID, Position | None, dict[str, Any]]:
    """A list request's caller and org, its cursor's position and its query. The cursor is
    read first: a malformed one is a 400 of its own, whatever else is wrong."""
    principal, org_id = authenticate(api, req, scope)
    after = cursor_param(req)
    return principal, org_id, after, load_or_422(schema, query_params(req))


def respond(
    resp: falcon.Response,
    status: int,
    body: bytes,
    *,
    location: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Answer with a JSON ``body`` already encoded."""
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = body
    if location:
        resp.location = location
    for name, value in (headers or {}).items():
        resp.set_header(name, value)


def respond_json(resp: falcon.Response, status: int, value: Any) -> None:
    """Answer with ``value`` as JSON."""
    respond(resp, status, dumps(value))
