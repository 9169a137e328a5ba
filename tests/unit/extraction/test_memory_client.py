"""MemoryClient (the public client without retries): every status the service can answer,
mapped onto what the queue does."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import random
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import MemoryRejectedError, MemoryUnavailableError
from extraction.memory_client import MemoryClient, WriteResult, body_bytes
from ibex_client import canonical_body, parse_retry_after

ORG = uuid.UUID("11111111-1111-4111-8111-111111111111")
MEMORY_ID = uuid.UUID("22222222-2222-4222-8222-222222222222")
BODY = {"agent_id": str(uuid.uuid4()), "content": "Dana is allergic to peanuts.", "kind": "fact"}
KEY = "5d1c8a1e-0000-5000-8000-000000000001"

Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler) -> MemoryClient:
    return MemoryClient(
        "http://memory.test", "ibex_secret_token", transport=httpx.MockTransport(handler)
    )


def error(
    status: int,
    code: str,
    message: str = "m",
    headers: dict[str, str] | None = None,
    **extra: object,
) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, json={"error": {"code": code, "message": message, **extra}}, headers=headers
        )

    return handler


def test_201_returns_the_memory_id_and_sends_the_headers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"id": str(MEMORY_ID)})

    with contextlib.closing(client_for(handler)) as client:
        outcome = client.create_memory(ORG, BODY, KEY)
    assert outcome == WriteResult(201, MEMORY_ID, None, False)
    (request,) = seen
    assert request.method == "POST"
    assert request.url.path == "/v1/memories"
    assert request.headers["Authorization"] == "Bearer ibex_secret_token"
    assert request.headers["X-IBEX-Org-ID"] == str(ORG)
    assert request.headers["X-Idempotency-Key"] == KEY
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == BODY


def test_the_body_is_byte_for_byte_the_same_whatever_the_key_order() -> None:
    reordered = dict(reversed(list(BODY.items())))
    assert canonical_body(reordered) == canonical_body(BODY)
    assert canonical_body({"a": "é"}) == '{"a":"é"}'.encode()
    assert body_bytes(reordered) == body_bytes(BODY) == canonical_body(BODY)
    assert body_bytes({"a": "é"}) == '{"a":"é"}'.encode()


def write_body(seed: int) -> dict[str, Any]:
    """A body as the write stage builds it, with a 256-dimension vector at seven digits."""
    rand = random.Random(seed)
    vector = [float(f"{rand.gauss(0, 0.06):.7g}") for _ in range(256)]
    vector[7] = 3.865994e-05  # a component json spells 3.865994e-05 and orjson 0.00003865994
    return {
        "agent_id": str(uuid.UUID(int=rand.getrandbits(128))),
        "content": "Dana is allergic to peanuts. Ça compte.",
        "kind": "fact",
        "source": {"session_id": str(uuid.UUID(int=seed)), "turn_index": 12, "ordinal": 1},
        "metadata": {"provider": "openai", "model": "gpt-4o-mini"},
        "embedding": {"model": "local:wordllama-l2_supercat-256", "vector": vector},
        "supersedes": [str(uuid.UUID(int=seed + 1))],
        "stale_supersedes": "skip",
    }


def test_a_write_body_reads_as_the_same_values_and_is_the_same_bytes_every_time() -> None:
    for seed in range(20):
        body = write_body(seed)
        sent = body_bytes(body)
        assert json.loads(sent) == json.loads(canonical_body(body)) == body
        assert sent == body_bytes(json.loads(sent)) == body_bytes(write_body(seed))
        assert list(json.loads(sent)) == sorted(body)  # the keys sorted, as canonical_body


@pytest.mark.parametrize(
    "body",
    [
        {"vector": [0.5, float("nan")]},  # orjson would write null
        {"vector": [float("inf"), 1.0]},
        {"metadata": {"score": -math.inf}},
        {"vector": [1.7e308, 1.7e308]},  # finite, but their sum is not
        {"count": 2**64},  # past orjson's integers
        {"at": dt.datetime(2026, 12, 7, 13, 0, tzinfo=dt.UTC)},  # canonical_body writes str()
        {"id": uuid.UUID(int=5), "n": 1},
    ],
)
def test_what_orjson_would_write_otherwise_is_written_by_canonical_body(
    body: dict[str, Any],
) -> None:
    assert body_bytes(body) == canonical_body(body)


JSON_LIKE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), JSON_LIKE, max_size=6))
def test_any_body_reads_as_the_values_canonical_body_writes(body: dict[str, Any]) -> None:
    try:
        expected = canonical_body(body)
    except UnicodeEncodeError:  # a lone surrogate: neither writes it
        with pytest.raises(UnicodeEncodeError):
            body_bytes(body)
        return
    sent = body_bytes(body)
    # Read back and written again by canonical_body: equal texts (NaN included) mean equal
    # values.
    assert canonical_body(json.loads(sent)) == canonical_body(json.loads(expected))


def test_replayed_201_is_flagged() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            201, json={"id": str(MEMORY_ID)}, headers={"Idempotent-Replayed": "true"}
        )

    assert client_for(handler).create_memory(ORG, BODY, KEY) == WriteResult(
        201, MEMORY_ID, None, True
    )


@pytest.mark.parametrize("status", [200, 202, 204])
def test_other_2xx_are_success(status: int) -> None:
    outcome = client_for(lambda r: httpx.Response(status)).create_memory(ORG, BODY, KEY)
    assert outcome == WriteResult(status, None, None, False)


def test_duplicate_content_is_success_with_the_existing_id() -> None:
    handler = error(409, "DUPLICATE_CONTENT", existing_id=str(MEMORY_ID))
    assert client_for(handler).create_memory(ORG, BODY, KEY) == WriteResult(
        409, MEMORY_ID, "DUPLICATE_CONTENT", False
    )


def test_idempotency_conflict_is_success_with_or_without_an_id() -> None:
    without = client_for(error(409, "IDEMPOTENCY_CONFLICT")).create_memory(ORG, BODY, KEY)
    assert without == WriteResult(409, None, "IDEMPOTENCY_CONFLICT", False)
    with_id = client_for(
        error(409, "IDEMPOTENCY_CONFLICT", existing_id=str(MEMORY_ID))
    ).create_memory(ORG, BODY, KEY)
    assert with_id.memory_id == MEMORY_ID


def test_in_progress_is_retryable_with_retry_after() -> None:
    handler = error(409, "IDEMPOTENCY_IN_PROGRESS", "still running", {"Retry-After": "2"})
    with pytest.raises(MemoryUnavailableError) as info:
        client_for(handler).create_memory(ORG, BODY, KEY)
    assert info.value.status == 409
    assert info.value.code == "IDEMPOTENCY_IN_PROGRESS"
    assert info.value.retry_after == 2.0
    assert info.value.server_message == "still running"
    assert "still running" in str(info.value)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_retryable_statuses(status: int) -> None:
    handler = error(status, "SOME_CODE", "try later", {"Retry-After": "7"})
    with pytest.raises(MemoryUnavailableError) as info:
        client_for(handler).create_memory(ORG, BODY, KEY)
    assert (info.value.status, info.value.code, info.value.retry_after) == (
        status,
        "SOME_CODE",
        7.0,
    )


def test_5xx_without_a_json_body_is_retryable() -> None:
    handler: Handler = lambda r: httpx.Response(502, text="<html>bad gateway</html>")  # noqa: E731
    with pytest.raises(MemoryUnavailableError) as info:
        client_for(handler).create_memory(ORG, BODY, KEY)
    assert (info.value.status, info.value.code, info.value.retry_after) == (502, None, None)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "MALFORMED_JSON"),
        (401, "UNAUTHORIZED"),
        (403, "FORBIDDEN"),
        (404, "NOT_FOUND"),
        (405, "METHOD_NOT_ALLOWED"),
        (409, "SOMETHING_ELSE"),
        (410, "GONE"),
        (413, "BODY_TOO_LARGE"),
        (415, "UNSUPPORTED_MEDIA_TYPE"),
        (422, "VALIDATION_FAILED"),
    ],
)
def test_other_4xx_are_permanent(status: int, code: str) -> None:
    handler = error(status, code, "the reason")
    with pytest.raises(MemoryRejectedError) as info:
        client_for(handler).create_memory(ORG, BODY, KEY)
    assert (info.value.status, info.value.code) == (status, code)
    assert info.value.server_message == "the reason"
    assert "the reason" in str(info.value)


def test_409_without_a_code_is_permanent() -> None:
    with pytest.raises(MemoryRejectedError) as info:
        client_for(lambda r: httpx.Response(409, text="conflict")).create_memory(ORG, BODY, KEY)
    assert (info.value.status, info.value.code) == (409, None)


def test_a_redirect_is_permanent_not_followed() -> None:
    handler: Handler = lambda r: httpx.Response(307, headers={"Location": "/elsewhere"})  # noqa: E731
    with pytest.raises(MemoryRejectedError) as info:
        client_for(handler).create_memory(ORG, BODY, KEY)
    assert info.value.status == 307


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectTimeout("connect timed out"),
        httpx.ReadTimeout("read timed out"),
        httpx.WriteTimeout("write timed out"),
        httpx.PoolTimeout("pool timed out"),
        httpx.ConnectError("connection refused"),
        httpx.ReadError("connection reset"),
        httpx.RemoteProtocolError("server disconnected"),
    ],
)
def test_network_failures_are_retryable(exc: httpx.TransportError) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(MemoryUnavailableError) as info:
        client_for(handler).create_memory(ORG, BODY, KEY)
    assert info.value.status is None
    assert info.value.__cause__ is exc


def test_the_token_never_appears_in_errors_or_repr() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    client = client_for(handler)
    with pytest.raises(MemoryUnavailableError) as info:
        client.create_memory(ORG, BODY, KEY)
    assert "ibex_secret_token" not in str(info.value)
    assert "ibex_secret_token" not in repr(client)


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="token"):
        MemoryClient("http://memory.test", "")


def test_retry_after_forms() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-5") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
