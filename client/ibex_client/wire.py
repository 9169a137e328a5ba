"""The wire form of the API, for callers that build a request themselves.

An application uses :class:`~ibex_client.IbexClient`'s typed methods. A caller that already
holds a request body in the service's wire form (a pipeline replaying a stored body byte for
byte, a proxy) builds a :class:`Call` and sends it with :meth:`IbexClient.send`: the client
still owns the connection pool, the headers, the retries (:data:`NO_RETRY` for a caller that
retries on its own, such as a queue) and the translation of every answer into the typed
errors of :mod:`ibex_client.errors`.
"""

from ibex_client._base import (
    IDEMPOTENCY_HEADER,
    IN_PROGRESS,
    NO_RETRY,
    ORG_HEADER,
    REPLAYED_HEADER,
    Call,
    ErrorBody,
    canonical_body,
    is_retryable,
    parse_error,
    parse_retry_after,
)

__all__ = [
    "IDEMPOTENCY_HEADER",
    "IN_PROGRESS",
    "NO_RETRY",
    "ORG_HEADER",
    "REPLAYED_HEADER",
    "Call",
    "ErrorBody",
    "canonical_body",
    "is_retryable",
    "parse_error",
    "parse_retry_after",
]
