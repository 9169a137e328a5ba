"""What every client of the service shares: error bodies, retry classification, backoff.

Both the pipeline's ``MemoryClient`` (``extraction.memory_client`` in the server, which leaves
retrying to the queue) and the public clients (which retry in process) classify an answer with
:func:`is_retryable`: 408, 429, every 5xx and 409 ``IDEMPOTENCY_IN_PROGRESS`` are worth another
attempt; anything else is final. Repeating is safe for every call of the API: creates carry an
idempotency key, turns carry their index, status changes and deletes are idempotent, searches
are reads. The one exception is opening a session without an external id: each such request
that reaches the server opens a session, so it is a :class:`Call` with ``repeatable=False``,
sent again only when the connection was never made.

The public clients also share request building and response parsing, here, so the sync and
async clients differ only in how they send and sleep: a :class:`Call` describes one API call
(method, path, query, body, headers, how to read a success) and :func:`decide` turns one
attempt's answer into a value, a retry with its delay, or a typed error.
"""

from __future__ import annotations

import email.utils
import functools
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from ibex_client.errors import (
    ExtractionTimeoutError,
    IbexConnectionError,
    IbexTimeoutError,
    IbexTransportError,
    error_for,
)

T = TypeVar("T")
log = logging.getLogger("ibex.client")

IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS"
#: 408 is a timeout on the server side, so retrying it is as safe as retrying our own timeout.
RETRYABLE_4XX = frozenset({408, 429})
ORG_HEADER = "X-IBEX-Org-ID"
IDEMPOTENCY_HEADER = "X-Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True)
class ErrorBody:
    """The ``{"error": {"code", "message", ...}}`` body; ``details`` is the whole object."""

    code: str | None
    message: str | None
    details: Mapping[str, Any]


def canonical_body(body: Mapping[str, Any]) -> bytes:
    """The request body as sorted-key compact UTF-8 JSON: the same bytes on every attempt (the
    server's canonical form, ``core.canonical``, which this package cannot import)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return text.encode("utf-8")


@functools.lru_cache(maxsize=256)
def _url(text: str) -> httpx.URL:
    """``text`` parsed once: httpx parses a URL given as a string on every request (some
    30 us), one given as a URL not again. The paths a client calls repeat (``/v1/memories``,
    ``/v1/context``); one naming an id is parsed again once it has left the cache."""
    return httpx.URL(text)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), else None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def parse_error(response: httpx.Response) -> ErrorBody:
    """The error body of a response, tolerating anything else (an HTML page, no body)."""
    try:
        payload = response.json()
    except (ValueError, UnicodeDecodeError):
        return ErrorBody(None, None, {})
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return ErrorBody(None, None, {})
    code = error.get("code")
    message = error.get("message")
    return ErrorBody(
        code if isinstance(code, str) else None,
        message if isinstance(message, str) else None,
        error,
    )


def is_retryable(status: int, code: str | None) -> bool:
    """Whether an answer is worth another attempt of the same request."""
    return (status == 409 and code == IN_PROGRESS) or status in RETRYABLE_4XX or status >= 500


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently the public clients repeat a call.

    ``max_attempts`` counts the first attempt. Without ``Retry-After`` the n-th retry waits a
    random time in ``[0, min(backoff_max, backoff_base * 2 ** (n - 1))]`` (capped exponential
    backoff with full jitter, so clients that failed together do not retry together). A
    ``Retry-After`` from the server is honoured as given, up to ``retry_after_max`` seconds.
    """

    max_attempts: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 8.0
    retry_after_max: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.backoff_base < 0 or self.backoff_max < 0 or self.retry_after_max < 0:
            raise ValueError("delays must not be negative")

    def delay(self, retry: int, retry_after: float | None, rand: Callable[[], float]) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        if retry_after is not None:
            return min(retry_after, self.retry_after_max)
        cap = min(self.backoff_max, self.backoff_base * 2 ** (retry - 1))
        return float(rand() * cap)


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call: the request, and how a 2xx answer becomes a value.

    ``on_404`` (when set) is the value a 404 stands for, for calls where "not there" is an
    answer (a delete of something already gone) rather than an error. A call that is not
    ``repeatable`` is retried only when the connection could not be made (nothing was sent).
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, str] | None = None
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    on_404: Callable[[], T] | None = None
    repeatable: bool = True


@dataclass(frozen=True)
class Retry:
    """Try again after ``delay`` seconds; ``error`` is what to raise if attempts run out."""

    delay: float
    error: Exception


class ClientCore:
    """Headers, URLs and attempt decisions shared by the sync and async public clients."""

    def __init__(
        self,
        base_url: str,
        token: str,
        org_id: object | None,
        retry: RetryPolicy,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not token:
            raise ValueError("an API token is required")
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.rand = rand
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if org_id is not None:
            headers[ORG_HEADER] = str(org_id)
        self._headers = headers

    def __repr__(self) -> str:
        return f"ClientCore({self.base_url!r})"

    def request(self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]) -> httpx.Request:
        """The request of ``call``: built once and sent as is on every attempt."""
        headers = dict(self._headers)
        if call.body is not None:
            headers["Content-Type"] = "application/json"
        headers.update(call.headers)
        return http.build_request(
            call.method,
            _url(f"{self.base_url}{call.path}"),
            params=call.params,
            content=call.body,
            headers=headers,
        )

    def decide(self, call: Call[T], response: httpx.Response, attempt: int) -> T | Retry:
        """The value of a 2xx, or a :class:`Retry`; raises the typed error when final."""
        status = response.status_code
        if 200 <= status < 300:
            return call.parse(response)
        if status == 404 and call.on_404 is not None:
            return call.on_404()
        body = parse_error(response)
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        error = error_for(status, body.code, body.message, body.details, retry_after)
        if (
            call.repeatable
            and is_retryable(status, body.code)
            and attempt < self.retry.max_attempts
        ):
            return self._retry(
                call, attempt, self.retry.delay(attempt, retry_after, self.rand), error
            )
        raise error

    def failed(self, call: Call[Any], exc: httpx.TransportError, attempt: int) -> Retry:
        """A request that got no answer: a timeout, a refused or reset connection (retried), or
        a request httpx could not make at all (raised at once)."""
        error: IbexTransportError
        if isinstance(exc, httpx.TimeoutException):
            error = IbexTimeoutError(f"no answer in time: {type(exc).__name__}")
        else:
            error = IbexConnectionError(f"no answer: {type(exc).__name__}: {exc}")
        if call.repeatable:
            retryable = isinstance(
                exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError
            )
        else:
            retryable = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
        if not retryable or attempt >= self.retry.max_attempts:
            raise error from exc
        return self._retry(call, attempt, self.retry.delay(attempt, None, self.rand), error)

    @staticmethod
    def _retry(call: Call[Any], attempt: int, delay: float, error: Exception) -> Retry:
        # The method and path only: the URL's query and the headers stay out of the log.
        log.info(
            "%s %s: attempt %d failed (%s); retrying in %.2f s",
            call.method,
            call.path,
            attempt,
            error,
            delay,
        )
        return Retry(delay, error)


def extraction_settled(session: Any) -> bool:
    """Whether waiting for a session's extraction is over: no turn is pending (each one is
    extracted, or failed and dead-lettered, which an operator replays)."""
    return bool(session.extracted or session.progress.pending == 0)


def extraction_timeout(session: Any, timeout: float) -> ExtractionTimeoutError:
    """The error of a wait that ran out, saying what to do about it."""
    progress = session.progress
    text = (
        f"session {session.id}: {progress.pending} of {session.turn_count} turns still pending"
        f" extraction after {timeout:g} s"
    )
    if session.status == "active":
        text += (
            "; the session is active, and turns are extracted once it is completed"
            " (complete_session, or X-IBEX-Session-End: true on the chat path's last call)"
        )
    else:
        text += "; is a worker running (ibex status shows the backlog)?"
    return ExtractionTimeoutError(text, session)


def only_session(sessions: list[T], agent: str, external_id: str) -> T | None:
    """The one session of ``sessions`` (those of ``agent`` with ``external_id``), None when
    there is none; several (one per user) need the caller to say whose."""
    if len(sessions) > 1:
        raise ValueError(
            f"{len(sessions)} sessions of {agent!r} have the external id {external_id!r}"
            " (one per user): pass user_id="
        )
    return sessions[0] if sessions else None
