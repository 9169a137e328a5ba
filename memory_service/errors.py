"""HTTP errors of the memory service and the one body they all share.

Every error leaves as ``{"error": {"code": ..., "message": ..., ...}}`` (``schema.memory.
ErrorSchema``), including Falcon's own 404 and 405 and any unexpected exception. The refusals
the services raise (:mod:`memories.errors`, and the turn rules of
:mod:`core.errors`) are mapped onto their answers here, in :func:`answer_for`, and nowhere else.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import falcon

from core.errors import (
    DatabaseUnavailableError,
    DomainError,
    ImmutableTurnError,
    SchemaNotReadyError,
    SessionUserConflictError,
    TurnIndexGapError,
)
from memories.errors import AdminScopeError, MemoryNotFoundError, UserForbiddenError
from schema import describe_errors
from schema.bodies import error_body
from sessions.errors import (
    AgentNotFoundError,
    NoSuchOrgError,
    SessionDeletedError,
    SessionNotFoundError,
    UnknownAgentError,
    UnknownUserIdError,
    UserNotFoundError,
)

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


class ErrorAnswer(falcon.HTTPError):
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


def validation_error(messages: dict[str, Any] | list[Any]) -> ErrorAnswer:
    """The 422 of a request that does not validate, field by field."""
    return ErrorAnswer(
        422,
        "VALIDATION_FAILED",
        f"invalid request: {describe_errors(messages)}",
        fields=messages,
    )


def answer_for(exc: Exception) -> ErrorAnswer:
    """The HTTP answer of a refusal a service raised."""
    if isinstance(exc, MemoryNotFoundError | SessionNotFoundError | UserNotFoundError):
        return ErrorAnswer(404, "NOT_FOUND", str(exc))
    if isinstance(exc, UserForbiddenError):
        return ErrorAnswer(403, "FORBIDDEN_USER", str(exc))
    if isinstance(exc, AdminScopeError):
        return ErrorAnswer(403, "INSUFFICIENT_SCOPE", str(exc))
    if isinstance(exc, UnknownUserIdError):
        return validation_error({exc.field: [str(exc)]})
    if isinstance(exc, SessionUserConflictError):
        return ErrorAnswer(
            409,
            "USER_CONFLICT",
            "this session belongs to another user; a session's user is set once",
            session_id=str(exc.session_id),
        )
    if isinstance(exc, NoSuchOrgError):
        return ErrorAnswer(403, "FORBIDDEN_ORG", str(exc))
    if isinstance(exc, AgentNotFoundError):
        return ErrorAnswer(404, "UNKNOWN_AGENT", str(exc))
    if isinstance(exc, UnknownAgentError):
        return validation_error({"agent_id": [str(exc)]})
    if isinstance(exc, SessionDeletedError):
        return ErrorAnswer(409, "SESSION_DELETED", str(exc))
    if isinstance(exc, TurnIndexGapError):
        return ErrorAnswer(409, "TURN_GAP", str(exc), expected_turn_index=exc.expected_turn_index)
    if isinstance(exc, ImmutableTurnError):
        return ErrorAnswer(409, "TURN_CONFLICT", str(exc), turn_index=exc.turn_index)
    raise TypeError(f"no answer for {type(exc).__name__}")


#: The refusals :func:`answer_for` answers, registered as error handlers.
REFUSALS: tuple[type[Exception], ...] = (
    DomainError,
    TurnIndexGapError,
    ImmutableTurnError,
    SessionUserConflictError,
)


def handle_refusal(
    req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]
) -> None:
    # Raised again as an HTTPError, Falcon serializes it like any other: one error body.
    raise answer_for(exc) from None


#: A path naming an object by id (``/v1/sessions/{id}``, ``/v1/memories/{id}/history``): a
#: segment there that is no UUID is the caller's typo, not an unknown object.
_ID_PATH = re.compile(r"^/v1/(?:sessions|memories)/(?P<id>[^/]+)(?:/[^/]*)?$")


def handle_route_not_found(
    req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]
) -> None:
    """No route matched: 400 ``MALFORMED_ID`` when the path names an object by something that
    is not an id (the routes take ``{...:uuid}``), else the 404 as it was."""
    found = _ID_PATH.match(req.path)
    if found is not None and found.group("id") != "search":
        try:
            uuid.UUID(found.group("id"))
        except ValueError:
            raise ErrorAnswer(
                400, "MALFORMED_ID", f"{found.group('id')!r} in the path is not an id (a UUID)"
            ) from None
    raise exc


def serialize_error(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    """Falcon's error serializer: our body for ErrorAnswer and for Falcon's built-in errors."""
    if isinstance(exc, ErrorAnswer):
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


def handle_schema_not_ready(
    req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]
) -> None:
    """The schema is missing or behind the code: every API call would fail until an operator
    runs ``ibex migrate``; the message (one line) names the database and says so."""
    log.warning("schema not ready: %s", exc)
    resp.status = 503
    resp.content_type = falcon.MEDIA_JSON
    resp.data = error_body("SCHEMA_NOT_READY", str(exc))


def handle_unexpected(
    req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]
) -> None:
    if isinstance(exc, falcon.HTTPError):  # more specific handlers normally catch these
        raise exc
    log.exception("unhandled error on %s %s", req.method, req.path)
    resp.status = 500
    resp.content_type = falcon.MEDIA_JSON
    resp.data = error_body("INTERNAL_ERROR", "internal error")


def register(app: falcon.App[falcon.Request, falcon.Response]) -> None:
    app.set_error_serializer(serialize_error)
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(DatabaseUnavailableError, handle_unavailable)
    app.add_error_handler(SchemaNotReadyError, handle_schema_not_ready)
    for refusal in REFUSALS:
        app.add_error_handler(refusal, handle_refusal)
