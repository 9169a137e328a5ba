"""Clients of the IBEX web service.

:class:`IbexClient` and :class:`AsyncIbexClient` are the public API for applications
(sessions, turns, memories, search, context), typed, retrying what is safe to retry. The
package depends on httpx alone. A caller that holds a request in the service's wire form
sends it with ``send`` and :mod:`ibex_client.wire` (the pipeline does, without retries: its
queue retries).

    with IbexClient("https://ibex.example.com", token) as ibex:
        hits = ibex.search("what is Dana allergic to?", agent_id=agent_id)
"""

from ibex_client._base import (
    RetryPolicy,
    canonical_body,
    parse_error,
    parse_retry_after,
)
from ibex_client.aio import AsyncIbexClient
from ibex_client.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DuplicateContentError,
    ExtractionTimeoutError,
    IbexClientError,
    IbexConnectionError,
    IbexTimeoutError,
    IbexTransportError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    TurnConflictError,
    TurnGapError,
    UnexpectedResponseError,
    UserConflictError,
)
from ibex_client.sync import IbexClient
from ibex_client.types import (
    Agent,
    Context,
    ForgottenUser,
    Memory,
    MemorySource,
    Page,
    Progress,
    RecordedTurn,
    SearchHit,
    Session,
    Signals,
    Turn,
    TurnsAppended,
    TurnUsage,
)

__all__ = [
    "Agent",
    "ApiError",
    "AsyncIbexClient",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "Context",
    "DuplicateContentError",
    "ExtractionTimeoutError",
    "ForgottenUser",
    "IbexClient",
    "IbexClientError",
    "IbexConnectionError",
    "IbexTimeoutError",
    "IbexTransportError",
    "InvalidRequestError",
    "Memory",
    "MemorySource",
    "NotFoundError",
    "Page",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Progress",
    "RateLimitedError",
    "RecordedTurn",
    "RetryPolicy",
    "SearchHit",
    "ServerError",
    "Session",
    "Signals",
    "Turn",
    "TurnConflictError",
    "TurnGapError",
    "TurnUsage",
    "TurnsAppended",
    "UnexpectedResponseError",
    "UserConflictError",
    "canonical_body",
    "parse_error",
    "parse_retry_after",
]
