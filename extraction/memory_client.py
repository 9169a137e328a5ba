"""HTTP client of the memory service, as the pipeline uses it.

One :class:`MemoryClient` per process (it holds one pooled ``httpx.Client``; it is thread-safe).
:meth:`MemoryClient.create_memory` maps every outcome of a write onto what the queue should do
(the pipeline's memory HTTP outcomes):

- success, returned as a :class:`WriteOutcome`: 2xx, 409 ``IDEMPOTENCY_CONFLICT`` and 409
  ``DUPLICATE_CONTENT`` (the first committed wording wins);
- retryable, raised as :class:`~core.errors.MemoryUnavailableError`: 409
  ``IDEMPOTENCY_IN_PROGRESS``, 408, 429, 5xx, timeouts and connection errors;
- permanent, raised as :class:`~core.errors.MemoryRejectedError`: every other status.

The server's error code and message are kept on the exception. httpx exceptions are translated
here and nowhere else. The token is sent in a header and never appears in a message or repr.
Unlike the public clients, it does not retry: a retryable failure goes back to the queue, which
retries the whole message with its own backoff.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn

import httpx

from core.errors import MemoryRejectedError, MemoryUnavailableError
from ibex_client._base import (
    ErrorBody,
    canonical_body,
    is_retryable,
    parse_error,
    parse_retry_after,
)

#: 409 codes that mean "the memory is stored": the pipeline treats them as success.
SUCCESS_CONFLICTS = frozenset({"IDEMPOTENCY_CONFLICT", "DUPLICATE_CONTENT"})


@dataclass(frozen=True)
class WriteOutcome:
    """How a write ended when it ended well.

    ``memory_id`` is the stored memory (for ``DUPLICATE_CONTENT`` the one that already held
    the content; for ``IDEMPOTENCY_CONFLICT`` the key's memory when the server names it).
    ``replayed`` is true when the server answered from its idempotency record.
    """

    status: int
    memory_id: uuid.UUID | None
    code: str | None
    replayed: bool


def _as_uuid(value: object) -> uuid.UUID | None:
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _describe(status: int, error: ErrorBody) -> str:
    text = f"memory service answered {status}"
    if error.code:
        text += f" {error.code}"
    if error.message:
        text += f": {error.message}"
    return text


def classify_write(response: httpx.Response) -> WriteOutcome:
    """Map a response to ``POST /v1/memories`` onto success, or raise retryable/permanent."""
    status = response.status_code
    if 200 <= status < 300:
        memory_id = None
        try:
            payload = response.json()
        except (ValueError, UnicodeDecodeError):
            payload = None
        if isinstance(payload, dict):
            memory_id = _as_uuid(payload.get("id"))
        replayed = response.headers.get("Idempotent-Replayed", "").lower() == "true"
        return WriteOutcome(status, memory_id, None, replayed)
    error = parse_error(response)
    if status == 409 and error.code in SUCCESS_CONFLICTS:
        return WriteOutcome(status, _as_uuid(error.details.get("existing_id")), error.code, False)
    raise_failure(response, error)


def raise_failure(response: httpx.Response, error: ErrorBody) -> NoReturn:
    """A non-success answer: retryable (409 in progress, 408, 429, 5xx) or permanent."""
    status = response.status_code
    if is_retryable(status, error.code):
        raise MemoryUnavailableError(
            _describe(status, error),
            status=status,
            code=error.code,
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
            server_message=error.message,
        )
    raise MemoryRejectedError(
        _describe(status, error), status=status, code=error.code, server_message=error.message
    )


class MemoryClient:
    """The memory service over HTTP: one pooled, thread-safe httpx client.

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
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=httpx.Timeout(timeout),
            transport=transport,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"MemoryClient({str(self._http.base_url)!r})"

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writes ------------------------------------------------------------------------------

    def create_memory(
        self, org_id: uuid.UUID | str, body: Mapping[str, Any], idempotency_key: str
    ) -> WriteOutcome:
        """POST one memory under ``idempotency_key``; safe to call again with the same args."""
        response = self._send(
            "POST",
            "/v1/memories",
            org_id,
            content=canonical_body(body),
            headers={"Content-Type": "application/json", "X-Idempotency-Key": idempotency_key},
        )
        return classify_write(response)

    def delete_memory(self, org_id: uuid.UUID | str, memory_id: uuid.UUID | str) -> bool:
        """Soft-delete a memory; False when it does not exist (or is already deleted)."""
        response = self._send("DELETE", f"/v1/memories/{memory_id}", org_id)
        if response.status_code == 404:
            return False
        self._raise_for_status(response)
        return True

    # -- reads -------------------------------------------------------------------------------

    def get_memory(
        self, org_id: uuid.UUID | str, memory_id: uuid.UUID | str
    ) -> dict[str, Any] | None:
        """One memory as the service returns it, or None when it is not visible to the org."""
        response = self._send("GET", f"/v1/memories/{memory_id}", org_id)
        if response.status_code == 404:
            return None
        self._raise_for_status(response)
        return dict(response.json())

    def list_memories(
        self,
        org_id: uuid.UUID | str,
        *,
        agent_id: uuid.UUID | str | None = None,
        session_id: uuid.UUID | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page: ``{"items": [...], "next_cursor": str | None}``."""
        params: dict[str, str] = {}
        if agent_id is not None:
            params["agent_id"] = str(agent_id)
        if session_id is not None:
            params["session_id"] = str(session_id)
        if limit is not None:
            params["limit"] = str(limit)
        if cursor is not None:
            params["cursor"] = cursor
        response = self._send("GET", "/v1/memories", org_id, params=params)
        self._raise_for_status(response)
        return dict(response.json())

    def iter_memories(
        self,
        org_id: uuid.UUID | str,
        *,
        agent_id: uuid.UUID | str | None = None,
        session_id: uuid.UUID | str | None = None,
        page_size: int = 200,
    ) -> Iterator[dict[str, Any]]:
        """Every memory matching the filters, following the cursor page by page."""
        cursor: str | None = None
        while True:
            page = self.list_memories(
                org_id, agent_id=agent_id, session_id=session_id, limit=page_size, cursor=cursor
            )
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    # -- plumbing ----------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        org_id: uuid.UUID | str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        all_headers = {"X-IBEX-Org-ID": str(org_id)}
        if headers:
            all_headers.update(headers)
        try:
            return self._http.request(
                method, path, content=content, headers=all_headers, params=params
            )
        except httpx.TimeoutException as exc:
            raise MemoryUnavailableError(f"memory service timed out: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise MemoryUnavailableError(
                f"memory service unreachable: {type(exc).__name__}: {exc}"
            ) from exc

    @staticmethod
    def _raise_for_status(response: httpx.Response) -> None:
        """Reads and deletes: 2xx passes, anything else is classified like a write."""
        if 200 <= response.status_code < 300:
            return
        raise_failure(response, parse_error(response))
