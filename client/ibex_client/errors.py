"""Errors of the public clients: one class per kind of answer, carrying the server's data.

Every answer in the service's error format becomes an :class:`ApiError` subclass chosen by
status (and, for 409, by code), with ``status``, ``code``, ``message``, the per-field errors of
a 422 (``fields``) and the whole error object (``details``). A request that got no answer at
all raises an :class:`IbexTransportError`. Retryable failures (408, 429, 5xx, 409
``IDEMPOTENCY_IN_PROGRESS``, timeouts and connection errors) are raised only once the client's
attempts are used up. No error carries the request, so no token can leak through one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any


class IbexClientError(Exception):
    """Base of every error the public clients raise."""


class IbexTransportError(IbexClientError):
    """The request got no answer."""


class IbexTimeoutError(IbexTransportError):
    """Connecting, sending or reading took longer than the client's timeout."""


class IbexConnectionError(IbexTransportError):
    """The connection was refused, reset or could not be made."""


class ExtractionTimeoutError(IbexClientError, TimeoutError):
    """``wait_for_extraction`` gave up: the session's turns were not all extracted in time.
    ``session`` is the last state seen (its ``status`` and ``progress`` say why)."""

    def __init__(self, message: str, session: Any) -> None:
        super().__init__(message)
        self.session = session


class UnexpectedResponseError(IbexClientError):
    """A 2xx answer whose body is not what the API documents."""


class ApiError(IbexClientError):
    """The service answered with an error status."""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str | None,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        text = f"{status}"
        if code:
            text += f" {code}"
        if message:
            text += f": {message}"
        super().__init__(text)
        self.status = status
        self.code = code
        self.message = message
        self.details: Mapping[str, Any] = dict(details or {})
        self.retry_after = retry_after

    @property
    def fields(self) -> Mapping[str, Any]:
        """A 422's errors field by field (``{}`` for other errors)."""
        value = self.details.get("fields")
        return value if isinstance(value, dict) else {}


class BadRequestError(ApiError):
    """400: malformed JSON, a bad header or cursor."""


class AuthenticationError(ApiError):
    """401: the token is missing or unknown."""


class PermissionDeniedError(ApiError):
    """403: the token lacks the scope, or may not act for the org."""


class NotFoundError(ApiError):
    """404: no such resource in this org."""


class ConflictError(ApiError):
    """409: the request contradicts what is stored (e.g. ``IDEMPOTENCY_CONFLICT``: the key
    was used with another body)."""


class DuplicateContentError(ConflictError):
    """409 ``DUPLICATE_CONTENT``: the agent already has a memory with this content.

    Not a failure of storage: the content is stored, as ``existing_id``."""

    @property
    def existing_id(self) -> uuid.UUID | None:
        value = self.details.get("existing_id")
        try:
            return uuid.UUID(str(value)) if value is not None else None
        except ValueError:
            return None


def _int_detail(details: Mapping[str, Any], key: str) -> int | None:
    value = details.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class TurnConflictError(ConflictError):
    """409 ``TURN_CONFLICT``: the turn ``turn_index`` is stored with other content (turns are
    immutable)."""

    @property
    def turn_index(self) -> int | None:
        return _int_detail(self.details, "turn_index")


class TurnGapError(ConflictError):
    """409 ``TURN_GAP``: the first turn sent is past ``expected_turn_index``, the next index
    the session expects (its turn_count + 1)."""

    @property
    def expected_turn_index(self) -> int | None:
        return _int_detail(self.details, "expected_turn_index")


class UserConflictError(ConflictError):
    """409 ``USER_CONFLICT``: the session belongs to another user (a session's user is set
    once)."""


class PayloadTooLargeError(ApiError):
    """413: the body is over the service's limit."""


class InvalidRequestError(ApiError):
    """422: the body failed validation; see :attr:`fields`."""


class RateLimitedError(ApiError):
    """429: too many requests; ``retry_after`` says when to come back."""


class ServerError(ApiError):
    """5xx (and 408): the service could not answer now; retried before it is raised."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: ServerError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    429: RateLimitedError,
}

_BY_CONFLICT_CODE: dict[str, type[ApiError]] = {
    "DUPLICATE_CONTENT": DuplicateContentError,
    "TURN_CONFLICT": TurnConflictError,
    "TURN_GAP": TurnGapError,
    "USER_CONFLICT": UserConflictError,
}


def error_for(
    status: int,
    code: str | None,
    message: str | None,
    details: Mapping[str, Any] | None = None,
    retry_after: float | None = None,
) -> ApiError:
    """The typed error for an error answer."""
    cls: type[ApiError]
    if status == 409 and code is not None and code in _BY_CONFLICT_CODE:
        cls = _BY_CONFLICT_CODE[code]
    elif status >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(status, ApiError)
    return cls(status, code, message, details, retry_after)
