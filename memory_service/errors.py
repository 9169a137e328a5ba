"""HTTP errors of the memory service and the one body they all share.

Every error leaves as ``{"error": {"code": ..., "message": ..., ...}}`` (``schema.memory.
ErrorSchema``), including Falcon's own 404 and 405 and any unexpected exception.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import falcon

from core.errors import DatabaseUnavailableError

log = logging.getLogger(__name__)

#: The code Falcon's own errors are given, by status.
FALCON_CODES = {
    400: "BAD_REQUEST",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "BODY_TOO_LARGE",
    500: "INTERNAL_ERROR",
    503: "UNAVAILABLE",
}


class ApiError(falcon.HTTPError):
    """An answer with our error body: ``code``, ``message`` and any extra fields."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(status, title=code, description=message, headers=headers)
        self.error_code = code
        self.message = message
        self.extra = extra


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def error_body(code: str, message: str, **extra: Any) -> bytes:
    return dumps({"error": {"code": code, "message": message, **extra}})


def serialize_error(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    """Falcon's error serializer: our body for ApiError and for Falcon's built-in errors."""
    if isinstance(exc, ApiError):
        body = error_body(exc.error_code, exc.message, **exc.extra)
    else:
        status = exc.status_code
        code = FALCON_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")
        message = exc.description or exc.title or "request failed"
        body = error_body(code, str(message))
    resp.content_type = falcon.MEDIA_JSON
    resp.data = body


def handle_unavailable(
    req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]
) -> None:
    log.warning("database unavailable: %s", exc)
    resp.status = 503
    resp.content_type = falcon.MEDIA_JSON
    resp.set_header("Retry-After", "1")
    resp.data = error_body("UNAVAILABLE", "the database is unavailable; retry", retry_after=1)


def handle_unexpected(
    req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]
) -> None:
    if isinstance(exc, falcon.HTTPError):  # more specific handlers normally catch these
        raise exc
    log.exception("unhandled error on %s %s", req.method, req.path)
    resp.status = 500
    resp.content_type = falcon.MEDIA_JSON
    resp.data = error_body("INTERNAL_ERROR", "internal error")


def register(app: falcon.App) -> None:
    app.set_error_serializer(serialize_error)
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(DatabaseUnavailableError, handle_unavailable)
