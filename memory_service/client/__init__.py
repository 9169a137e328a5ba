"""Clients of the IBEX web service.

- :class:`IbexClient` and :class:`AsyncIbexClient`: the public API for applications
  (sessions, turns, memories, search, context), typed, retrying what is safe to retry.
- :class:`MemoryClient`: the pipeline's own client of ``/v1/memories``, which maps every answer
  onto what the queue should do and leaves retrying to the queue.

    with IbexClient("https://ibex.example.com", token) as ibex:
        hits = ibex.search("what is Dana allergic to?", agent_id=agent_id)
"""

from memory_service.client._base import (
    RetryPolicy,
    canonical_body,
    parse_error,
    parse_retry_after,
)
from memory_service.client.aio import AsyncIbexClient
from memory_service.client.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DuplicateContentError,
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
)
from memory_service.client.sync import IbexClient
from memory_service.client.types import (
    Context,
    Memory,
    MemorySource,
    Page,
    Progress,
    SearchHit,
    Session,
    Signals,
    Turn,
    TurnsAppended,
)
from memory_service.client.worker import MemoryClient, WriteOutcome, classify_write

__all__ = [
    "ApiError",
    "AsyncIbexClient",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "Context",
    "DuplicateContentError",
    "IbexClient",
    "IbexClientError",
    "IbexConnectionError",
    "IbexTimeoutError",
    "IbexTransportError",
    "InvalidRequestError",
    "Memory",
    "MemoryClient",
    "MemorySource",
    "NotFoundError",
    "Page",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Progress",
    "RateLimitedError",
    "RetryPolicy",
    "SearchHit",
    "ServerError",
    "Session",
    "Signals",
    "Turn",
    "TurnConflictError",
    "TurnGapError",
    "TurnsAppended",
    "UnexpectedResponseError",
    "WriteOutcome",
    "canonical_body",
    "classify_write",
    "parse_error",
    "parse_retry_after",
]
