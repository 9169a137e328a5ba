"""The pipeline's writes to the memory service, through the public client.

One :class:`MemoryClient` per process: an :class:`ibex_client.IbexClient` with no retries of
its own (a retryable failure goes back to the queue, which retries the whole message with its
own backoff), holding the one pooled httpx client. A write sends the body the stage built from
the persisted result, as it is (:func:`body_bytes`: the values of :mod:`ibex_client.wire`'s
canonical body, written by orjson), for the org of its message. This
module is the one place where the client's answers become what the queue does (the pipeline's
memory HTTP outcomes):

- success, returned as a :class:`WriteResult`: 2xx, 409 ``IDEMPOTENCY_CONFLICT`` and 409
  ``DUPLICATE_CONTENT`` (the first committed wording wins);
- retryable, raised as :class:`~core.errors.MemoryUnavailableError`: 409
  ``IDEMPOTENCY_IN_PROGRESS``, 408, 429, 5xx, timeouts and connection errors;
- permanent, raised as :class:`~core.errors.MemoryRejectedError`: every other status.

The server's error code and message are kept on the exception. The token is sent in a header
and never appears in a message or repr.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from core import fastjson, tracing
from core.errors import MemoryRejectedError, MemoryUnavailableError
from core.http import CookielessClient
from extraction.tracing import memory_post
from ibex_client import ApiError, IbexClient, IbexTransportError
from ibex_client.wire import (
    IDEMPOTENCY_HEADER,
    NO_RETRY,
    ORG_HEADER,
    REPLAYED_HEADER,
    Call,
    canonical_body,
    is_retryable,
)

#: 409 codes that mean "the memory is stored": the pipeline treats them as success.
SUCCESS_CONFLICTS = frozenset({"IDEMPOTENCY_CONFLICT", "DUPLICATE_CONTENT"})


@dataclass(frozen=True)
class WriteResult:
    """How a write ended when it ended well.

    ``memory_id`` is the stored memory (for ``DUPLICATE_CONTENT`` the one that already held
    the content; for ``IDEMPOTENCY_CONFLICT`` the key's memory when the server names it).
    ``replayed`` is true when the server answered from its idempotency record.
    """

    status: int
    memory_id: uuid.UUID | None
    code: str | None
    replayed: bool


def body_bytes(body: Mapping[str, Any]) -> bytes:
    """A write's JSON: the values :func:`canonical_body` writes (sorted keys, compact, UTF-8),
    at orjson's speed (:func:`core.fastjson.sorted_dumps`; a body with a 256-dimension vector:
    12 us against 137). A number may be spelled otherwise (orjson writes ``1e-05`` as
    ``0.00001``), never with another value, and the bytes are the same on every attempt (the
    server's fingerprint is taken over the values it reads, the vector left out). What orjson
    would write with another value (a float that is not finite, which it writes as ``null``)
    or cannot write is written by canonical_body."""
    return fastjson.sorted_dumps(body, canonical_body)


def _as_uuid(value: object) -> uuid.UUID | None:
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _written(response: httpx.Response) -> WriteResult:
    """A 2xx answer to ``POST /v1/memories``."""
    try:
        payload = fastjson.loads(response.content)  # as response.json(), faster
    except (ValueError, UnicodeDecodeError):
        payload = None
    memory_id = _as_uuid(payload.get("id")) if isinstance(payload, dict) else None
    replayed = response.headers.get(REPLAYED_HEADER, "").lower() == "true"
    return WriteResult(response.status_code, memory_id, None, replayed)


def _describe(error: ApiError) -> str:
    text = f"memory service answered {error.status}"
    if error.code:
        text += f" {error.code}"
    if error.message:
        text += f": {error.message}"
    return text


def classify(error: ApiError) -> WriteResult:
    """A non-2xx answer: a success conflict, or raise retryable or permanent."""
    if error.status == 409 and error.code in SUCCESS_CONFLICTS:
        existing = _as_uuid(error.details.get("existing_id"))
        return WriteResult(error.status, existing, error.code, False)
    if is_retryable(error.status, error.code):
        raise MemoryUnavailableError(
            _describe(error),
            status=error.status,
            code=error.code,
            retry_after=error.retry_after,
            server_message=error.message,
        ) from error
    raise MemoryRejectedError(
        _describe(error), status=error.status, code=error.code, server_message=error.message
    ) from error


class MemoryClient:
    """The memory service for the pipeline: one pooled, thread-safe public client, no retries.

    ``timeout`` bounds connect, read, write and pool waits; keep it below the actor's time limit
    so a hung request becomes a retry rather than a killed worker.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not token:
            raise ValueError("a memory service token is required")
        self._base_url = base_url.rstrip("/")
        # One client for every org's writes: it keeps no cookies (core.http).
        self._http = CookielessClient(
            timeout=httpx.Timeout(timeout), transport=transport, follow_redirects=False
        )
        self._client = IbexClient(self._base_url, token, retry=NO_RETRY, client=self._http)

    def __repr__(self) -> str:
        return f"MemoryClient({self._base_url!r})"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    @property
    def base_url(self) -> str:
        return self._base_url

    @memory_post
    def create_memory(
        self, org_id: uuid.UUID | str, body: Mapping[str, Any], idempotency_key: str
    ) -> WriteResult:
        """POST one memory under ``idempotency_key``; safe to call again with the same args."""
        call = Call(
            "POST",
            "/v1/memories",
            _written,
            body=body_bytes(body),
            # The POST's span context, so the memory service's span joins the turn's trace.
            headers=tracing.inject({ORG_HEADER: str(org_id), IDEMPOTENCY_HEADER: idempotency_key}),
        )
        try:
            return self._client.send(call)
        except ApiError as error:
            return classify(error)
        except IbexTransportError as error:
            # The httpx failure itself is the cause (the client's own error wraps it).
            raise MemoryUnavailableError(f"memory service: {error}") from error.__cause__


__all__ = ["SUCCESS_CONFLICTS", "MemoryClient", "WriteResult", "body_bytes", "classify"]
