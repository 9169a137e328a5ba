"""The chat path end to end: calls through the proxy to the fake upstream, recorded by the
record actor into the real session store."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from core.db import tenant
from proxy import metrics
from tests.integration.proxy.conftest import REPLY, Org, ProxyServer, wait_for

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def headers(org: Org, session: str = "conv-1", **extra: str) -> dict[str, str]:
    return {
        "Authorization": "Bearer upstream-key",
        "X-IBEX-Token": org.token,
        "X-IBEX-Agent": "support-bot",
        "X-IBEX-Session-ID": session,
        **extra,
    }


def chat(
    server: ProxyServer, messages: list[Any], hdrs: dict[str, str], **body: Any
) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "fake", "messages": messages, **body},
        headers=hdrs,
        timeout=10,
    )


def checkpoints(store: Any, org: Org, external_id: str = "conv-1") -> list[dict[str, Any]]:
    with tenant(store.db, org.org_id):
        rows = store.db.execute_sql(
            "SELECT c.turn_index, c.prompt_tokens, c.completion_tokens, c.latency_ms,"
            " c.is_streaming, c.is_complete, p.messages, p.completion, s.turn_count"
            " FROM ibex_core.checkpoints c"
            " JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id"
            " JOIN ibex_core.sessions s ON s.id = c.session_id"
            " WHERE s.external_id = %s ORDER BY c.turn_index",
            (external_id,),
        ).fetchall()
    names = (
        "turn_index",
        "prompt_tokens",
        "completion_tokens",
        "latency_ms",
        "is_streaming",
        "is_complete",
        "messages",
        "completion",
        "turn_count",
    )
    return [dict(zip(names, row, strict=True)) for row in rows]


def sse_content(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                out.append(choice.get("delta", {}).get("content") or "")
    return "".join(out)


def test_a_call_without_the_headers_is_passed_through_and_not_recorded(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any
) -> None:
    # The caller's own Authorization: passed through (the operator's key is not spent).
    own_key = {"Authorization": "Bearer sk-callers-own"}
    answer = chat(proxy_server, [SYSTEM, {"role": "user", "content": "hi"}], own_key)
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == REPLY
    proxy_server.settle()
    worker.join("chat_turns", timeout=5000)
    assert store.db.execute_sql("SELECT count(*) FROM ibex_core.checkpoints").fetchone()[0] == 0


def test_non_streaming_calls_are_recorded_as_turns_holding_only_what_is_new(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    first = [SYSTEM, {"role": "user", "content": "I like green tea."}]
    answer = chat(proxy_server, first, headers(acme))
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme)) == 1, "turn 1")
    second = [
        *first,
        answer.json()["choices"][0]["message"],
        {"role": "user", "content": "And I live in Lyon."},
    ]
    assert chat(proxy_server, second, headers(acme)).status_code == 200
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme)) == 2, "turn 2")
    one, two = checkpoints(store, acme)
    assert one["messages"] == first
    assert one["completion"] == {"role": "assistant", "content": REPLY}
    assert (one["prompt_tokens"], one["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert one["is_streaming"] is False and one["is_complete"] is True
    assert one["latency_ms"] >= 0
    assert two["messages"] == [{"role": "user", "content": "And I live in Lyon."}]
    assert two["turn_count"] == 2


def test_a_streamed_call_is_relayed_and_recorded_with_its_tokens(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Stream me something."}]
    answer = chat(
        proxy_server, messages, headers(acme), stream=True, stream_options={"include_usage": True}
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert sse_content(answer.text) == REPLY
    assert answer.text.rstrip().endswith("data: [DONE]")
    usage = next(json.loads(x[6:]) for x in answer.text.splitlines() if '"usage"' in x)["usage"]
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme)) == 1, "the streamed turn")
    (turn,) = checkpoints(store, acme)
    assert turn["completion"] == {"role": "assistant", "content": REPLY}
    assert turn["is_streaming"] is True and turn["is_complete"] is True
    assert (turn["prompt_tokens"], turn["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


def test_a_stream_cut_halfway_is_recorded_incomplete(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    upstream.configure(cut_stream_after=3)  # the role chunk and two pieces of four
    messages = [SYSTEM, {"role": "user", "content": "Tell me a long story."}]
    with httpx.stream(
        "POST",
        f"{proxy_server.url}/v1/chat/completions",
        json={"model": "fake", "messages": messages, "stream": True},
        headers=headers(acme),
        timeout=10,
    ) as answer:
        assert answer.status_code == 200
        received = b"".join(answer.iter_raw()).decode()
    assert "[DONE]" not in received
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme)) == 1, "the cut turn")
    (turn,) = checkpoints(store, acme)
    assert turn["is_streaming"] is True and turn["is_complete"] is False
    content = turn["completion"]["content"]
    assert content and REPLY.startswith(content) and content != REPLY


def test_the_same_request_retried_three_times_is_one_turn(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    before = {name: metrics.count(name) for name in metrics.TURN_OUTCOMES}
    messages = [SYSTEM, {"role": "user", "content": "Remember my dog is called Rex."}]
    for _ in range(3):
        assert chat(proxy_server, messages, headers(acme)).status_code == 200
    proxy_server.settle()
    wait_for(lambda: metrics.count("replayed") - before["replayed"] == 2, "the retries drained")
    assert upstream.requests == 3
    turns = checkpoints(store, acme)
    assert len(turns) == 1 and turns[0]["turn_count"] == 1
    assert turns[0]["messages"] == messages
    assert metrics.count("spooled") - before["spooled"] == 3
    assert metrics.count("recorded") - before["recorded"] == 1
    assert metrics.count("failed") == before["failed"]
    exposed = httpx.get(f"{proxy_server.url}/metrics").text
    assert 'ibex_chat_turns_total{outcome="spooled"}' in exposed


def test_a_client_that_leaves_mid_stream_is_recorded_incomplete(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    upstream.configure(stream_chunk_ms=300)
    messages = [SYSTEM, {"role": "user", "content": "Take your time."}]
    with httpx.stream(
        "POST",
        f"{proxy_server.url}/v1/chat/completions",
        json={"model": "fake", "messages": messages, "stream": True},
        headers=headers(acme),
        timeout=10,
    ) as answer:
        first = next(answer.iter_raw())
        assert first.startswith(b"data: ")
    # The client has hung up; the proxy notices at the next chunk.
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme)) == 1, "the abandoned turn")
    (turn,) = checkpoints(store, acme)
    assert turn["is_streaming"] is True and turn["is_complete"] is False
    assert turn["completion"]["content"] != REPLY


def test_upstream_errors_are_passed_through_unchanged_and_not_recorded(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    upstream.fail_next(1, 429)
    answer = chat(proxy_server, [SYSTEM, {"role": "user", "content": "hi"}], headers(acme))
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "1"
    assert answer.json() == {
        "error": {"message": "injected failure 429", "type": "rate_limit_exceeded", "code": None}
    }
    proxy_server.settle()
    worker.join("chat_turns", timeout=5000)
    assert checkpoints(store, acme) == []


def test_a_bad_token_is_refused_before_the_upstream_is_called(
    proxy_server: ProxyServer, upstream: Any, acme: Org
) -> None:
    hdrs = headers(acme)
    hdrs["X-IBEX-Token"] = "ibex_not-a-token"
    answer = chat(proxy_server, [{"role": "user", "content": "hi"}], hdrs)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "UNAUTHORIZED"
    assert upstream.requests == 0


def test_the_callers_authorization_is_passed_upstream(
    proxy_server: ProxyServer, upstream: Any, acme: Org
) -> None:
    upstream.api_key = "sk-right"
    hdrs = headers(acme)
    hdrs["Authorization"] = "Bearer sk-wrong"
    assert chat(proxy_server, [{"role": "user", "content": "hi"}], hdrs).status_code == 401
    hdrs["Authorization"] = "Bearer sk-right"
    assert chat(proxy_server, [{"role": "user", "content": "hi"}], hdrs).status_code == 200


def test_the_user_header_makes_the_user_the_sessions_own(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    hdrs = headers(acme, session="conv-user", **{"X-IBEX-User": "dana@example.com"})
    assert chat(proxy_server, [{"role": "user", "content": "hi"}], hdrs).status_code == 200
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme, "conv-user")) == 1, "the turn")
    with tenant(store.db, acme.org_id):
        owner = store.db.execute_sql(
            "SELECT u.external_id FROM ibex_core.sessions s"
            " JOIN ibex_core.users u ON u.id = s.user_id WHERE s.external_id = 'conv-user'"
        ).fetchone()
    assert owner == ("dana@example.com",)


def test_a_turn_drained_before_its_predecessor_waits_for_it(store: Any, acme: Org) -> None:
    from sessions.chat import EarlierTurnPending, Recording, spool_message, store_chat_turn

    recording = Recording("support-bot", "conv-order", None, acme.org_id, None, None)

    def spooled(messages: list[Any], content: str) -> dict[str, Any]:
        return spool_message(
            recording,
            request_hash="h",
            model="fake",
            messages=messages,
            completion={"role": "assistant", "content": content},
            prompt_tokens=1,
            completion_tokens=1,
            latency_ms=1,
            is_streaming=False,
            is_complete=True,
        )

    first = [SYSTEM, {"role": "user", "content": "one"}]
    second = [*first, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "two"}]
    with pytest.raises(EarlierTurnPending):
        store_chat_turn(store, spooled(second, "A2"), first_attempt=True)
    assert store_chat_turn(store, spooled(first, "A1"), first_attempt=True) == 1
    assert store_chat_turn(store, spooled(second, "A2")) == 2  # its retry
    assert store_chat_turn(store, spooled(second, "A2")) is None  # a redelivery
    turns = checkpoints(store, acme, "conv-order")
    assert [t["messages"] for t in turns] == [first, [{"role": "user", "content": "two"}]]


def test_a_body_over_the_limit_is_refused_before_anything_is_forwarded(
    proxy_server: ProxyServer, upstream: Any, acme: Org
) -> None:
    from proxy.app import MAX_REQUEST_BYTES

    before = len(upstream.bodies)
    huge = "x" * (MAX_REQUEST_BYTES + 1)
    answer = chat(proxy_server, [{"role": "user", "content": huge}], headers(acme))
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "BODY_TOO_LARGE"
    assert len(upstream.bodies) == before  # nothing reached the upstream


def test_a_recorded_call_holding_nul_or_a_lone_surrogate_is_refused_before_forwarding(
    proxy_server: ProxyServer, upstream: Any, acme: Org
) -> None:
    before = upstream.requests
    for bad in ("\\u0000", "\\ud800"):
        raw = (
            '{"model": "fake", "messages": [{"role": "user", "content": "hi ' + bad + '"}]}'
        ).encode()
        answer = httpx.post(
            f"{proxy_server.url}/v1/chat/completions",
            content=raw,
            headers={**headers(acme), "Content-Type": "application/json"},
            timeout=10,
        )
        assert answer.status_code == 422, answer.text
        assert "messages[0].content" in answer.json()["error"]["message"]
    assert upstream.requests == before
