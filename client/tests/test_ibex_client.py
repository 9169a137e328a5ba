"""IbexClient over httpx.MockTransport: the requests it makes, how it reads the answers, and
which failures it retries (and how long it waits) before raising a typed error."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from ibex_client import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DuplicateContentError,
    IbexClient,
    IbexConnectionError,
    IbexTimeoutError,
    InvalidRequestError,
    Memory,
    MemorySource,
    NotFoundError,
    PermissionDeniedError,
    Progress,
    RateLimitedError,
    RetryPolicy,
    ServerError,
    Session,
    Turn,
    TurnConflictError,
    TurnGapError,
    UnexpectedResponseError,
)

BASE = "http://ibex.test"
TOKEN = "ibex_secret_token_value"
ORG = uuid.UUID("11111111-1111-4111-8111-111111111111")
AGENT = uuid.UUID("22222222-2222-4222-8222-222222222222")
SESSION = uuid.UUID("33333333-3333-4333-8333-333333333333")
MEMORY = uuid.UUID("44444444-4444-4444-8444-444444444444")
CREATED = "2026-01-02T03:04:05.123456+00:00"

Handler = Callable[[httpx.Request], httpx.Response]


def memory_json(memory_id: uuid.UUID = MEMORY, content: str = "Dana is allergic to peanuts."):
    return {
        "id": str(memory_id),
        "org_id": str(ORG),
        "agent_id": str(AGENT),
        "content": content,
        "content_hash": "a" * 64,
        "kind": "fact",
        "source": {"session_id": str(SESSION), "turn_index": 3, "ordinal": 0},
        "metadata": {"lang": "en"},
        "user_id": None,
        "created_at": CREATED,
    }


def hit_json(memory_id: uuid.UUID = MEMORY, score: float = 0.82) -> dict[str, Any]:
    return {
        **memory_json(memory_id),
        "score": score,
        "signals": {"text": 0.9, "trigram": 0.58, "recency": 0.97},
        "snippet": "Dana is allergic to <mark>peanuts</mark>.",
    }


def session_json(**extra: Any) -> dict[str, Any]:
    """A session as the server sends it (``schema.sessions.SessionSchema``)."""
    turns = extra.get("turn_count", 0)
    pointer = extra.get("last_extracted_turn", 0)
    return {
        "id": str(SESSION),
        "org_id": str(ORG),
        "agent_id": str(AGENT),
        "external_id": "conv-42",
        "user_id": None,
        "status": "active",
        "model": "gpt-4o-mini",
        "provider": "openai",
        "turn_count": turns,
        "last_extracted_turn": pointer,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "progress": {"done": pointer, "pending": turns - pointer, "failed": 0, "pointer": pointer},
        "created_at": CREATED,
        "updated_at": CREATED,
        "completed_at": None,
        **extra,
    }


def appended_json(turns_added: int, **session: Any) -> dict[str, Any]:
    """The answer of ``POST /v1/sessions/{id}/turns`` (``TurnsAppendedSchema``)."""
    return {"session": session_json(**session), "turns_added": turns_added}


def error(status: int, code: str, message: str = "nope", headers=None, **extra: Any):
    return httpx.Response(
        status,
        json={"error": {"code": code, "message": message, **extra}},
        headers=headers,
    )


class Recorder:
    """A MockTransport handler that records every request and answers from a script."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def body(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)


@pytest.fixture
def sleeps() -> list[float]:
    return []


def client_for(handler: Handler, sleeps: list[float], **kwargs: Any) -> IbexClient:
    return IbexClient(
        BASE,
        TOKEN,
        transport=httpx.MockTransport(handler),
        sleep=sleeps.append,
        retry=kwargs.pop("retry", RetryPolicy(max_attempts=4, backoff_base=0.5, backoff_max=2)),
        **kwargs,
    )


# -- requests and parsing, method by method -----------------------------------------------


def test_every_request_carries_the_token_and_json_accept_and_the_org_when_given(sleeps):
    rec = Recorder(httpx.Response(200, json=memory_json()))
    with client_for(rec, sleeps, org_id=ORG) as ibex:
        ibex.get_memory(MEMORY)
    assert rec.last.headers["Authorization"] == f"Bearer {TOKEN}"
    assert rec.last.headers["Accept"] == "application/json"
    assert rec.last.headers["X-IBEX-Org-ID"] == str(ORG)
    rec2 = Recorder(httpx.Response(200, json=memory_json()))
    with client_for(rec2, sleeps) as ibex:
        ibex.get_memory(str(MEMORY))
    assert "X-IBEX-Org-ID" not in rec2.last.headers


def test_create_session_posts_the_slug_and_parses_the_session(sleeps):
    rec = Recorder(
        httpx.Response(
            201, json=session_json(prompt_tokens=21, completion_tokens=9, unknown_field=1)
        )
    )
    with client_for(rec, sleeps) as ibex:
        session = ibex.create_session(
            "support-bot", external_id="conv-42", model="gpt-4o-mini", provider="openai"
        )
    assert (rec.last.method, rec.last.url.path) == ("POST", "/v1/sessions")
    assert rec.body() == {
        "agent": "support-bot",
        "external_id": "conv-42",
        "model": "gpt-4o-mini",
        "provider": "openai",
    }
    assert rec.last.headers["Content-Type"] == "application/json"
    # The session API has no idempotency key: the external id is what finds a repeat.
    assert "X-Idempotency-Key" not in rec.last.headers
    assert session == Session(
        id=SESSION,
        org_id=ORG,
        agent_id=AGENT,
        external_id="conv-42",
        status="active",
        model="gpt-4o-mini",
        provider="openai",
        turn_count=0,
        last_extracted_turn=0,
        prompt_tokens=21,
        completion_tokens=9,
        progress=Progress(done=0, pending=0, failed=0, pointer=0),
        created_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        updated_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        completed_at=None,
    )


def test_a_session_without_its_progress_is_an_unexpected_response(sleeps):
    body = session_json()
    del body["progress"]
    rec = Recorder(httpx.Response(200, json=body))
    with client_for(rec, sleeps) as ibex, pytest.raises(UnexpectedResponseError, match="progress"):
        ibex.get_session(SESSION)
    wrapped = Recorder(httpx.Response(200, json={"session": session_json()}))
    with client_for(wrapped, sleeps) as ibex, pytest.raises(UnexpectedResponseError):
        ibex.complete_session(SESSION)
    assert sleeps == []


def test_create_session_without_an_external_id_is_not_repeated_once_sent(sleeps):
    # Each such request that reaches the server opens a session: a lost answer must not
    # become a second session.
    rec = Recorder(error(503, "UNAVAILABLE"), httpx.Response(201, json=session_json()))
    with client_for(rec, sleeps) as ibex, pytest.raises(ServerError):
        ibex.create_session("support-bot")
    assert len(rec.requests) == 1
    timeout = Recorder(httpx.ReadTimeout("slow"), httpx.Response(201, json=session_json()))
    with client_for(timeout, sleeps) as ibex, pytest.raises(IbexTimeoutError):
        ibex.create_session("support-bot")
    assert len(timeout.requests) == 1
    # A connection that was never made sent nothing: that is retried.
    refused = Recorder(httpx.ConnectError("refused"), httpx.Response(201, json=session_json()))
    with client_for(refused, sleeps) as ibex:
        assert ibex.create_session("support-bot").id == SESSION
    assert len(refused.requests) == 2
    # With an external id a repeat finds the session the first attempt opened.
    named = Recorder(error(503, "UNAVAILABLE"), httpx.Response(200, json=session_json()))
    with client_for(named, sleeps) as ibex:
        assert ibex.create_session("support-bot", external_id="conv-42").id == SESSION
    assert len(named.requests) == 2


def test_create_session_by_agent_id_and_needs_exactly_one_agent(sleeps):
    rec = Recorder(httpx.Response(200, json=session_json()))
    with client_for(rec, sleeps) as ibex:
        ibex.create_session(agent_id=AGENT)
        assert rec.body() == {"agent_id": str(AGENT)}
        with pytest.raises(ValueError, match="exactly one"):
            ibex.create_session()
        with pytest.raises(ValueError, match="exactly one"):
            ibex.create_session("bot", agent_id=AGENT)
    assert len(rec.requests) == 1


def test_append_turns_posts_each_turn_with_its_index(sleeps):
    rec = Recorder(httpx.Response(201, json=appended_json(2, turn_count=2)))
    turns = [
        Turn(
            1,
            [{"role": "user", "content": "Hi, I'm Dana."}],
            {"role": "assistant", "content": "Hi Dana!"},
            prompt_tokens=12,
            completion_tokens=4,
            latency_ms=640,
        ),
        Turn(2, [{"role": "user", "content": "I'm allergic to peanuts."}], None),
    ]
    with client_for(rec, sleeps) as ibex:
        appended = ibex.append_turns(SESSION, turns)
    assert (rec.last.method, rec.last.url.path) == ("POST", f"/v1/sessions/{SESSION}/turns")
    assert rec.body() == {
        "turns": [
            {
                "turn_index": 1,
                "messages": [{"role": "user", "content": "Hi, I'm Dana."}],
                "completion": {"role": "assistant", "content": "Hi Dana!"},
                "prompt_tokens": 12,
                "completion_tokens": 4,
                "latency_ms": 640,
                "is_streaming": False,
                "is_complete": True,
            },
            {
                "turn_index": 2,
                "messages": [{"role": "user", "content": "I'm allergic to peanuts."}],
                "completion": None,
                "is_streaming": False,
                "is_complete": True,
            },
        ]
    }
    assert appended.session.turn_count == 2
    assert appended.turns_added == 2 and not appended.replayed


def test_append_turns_replayed_says_so(sleeps):
    rec = Recorder(
        httpx.Response(
            200, json=appended_json(0, turn_count=1), headers={"Idempotent-Replayed": "true"}
        )
    )
    with client_for(rec, sleeps) as ibex:
        appended = ibex.append_turns(SESSION, [Turn(1, [{"role": "user", "content": "hi"}])])
    assert appended.replayed and appended.session.turn_count == 1


@pytest.mark.parametrize("action", ["complete", "abandon"])
def test_status_changes_post_to_their_route(sleeps, action):
    status = "completed" if action == "complete" else "abandoned"
    rec = Recorder(httpx.Response(200, json=session_json(status=status)))
    with client_for(rec, sleeps) as ibex:
        session = getattr(ibex, f"{action}_session")(str(SESSION))
    assert (rec.last.method, rec.last.url.path) == ("POST", f"/v1/sessions/{SESSION}/{action}")
    assert rec.last.content == b""
    assert session.status == status


def test_get_list_and_delete_session(sleeps):
    rec = Recorder(
        httpx.Response(200, json=session_json(turn_count=4, last_extracted_turn=4)),
        httpx.Response(200, json={"items": [session_json()], "next_cursor": None}),
        httpx.Response(204),
        error(404, "NOT_FOUND"),
    )
    with client_for(rec, sleeps) as ibex:
        session = ibex.get_session(SESSION)
        page = ibex.list_sessions(agent_id=AGENT, external_id="conv-42", status="active", limit=5)
        assert ibex.delete_session(SESSION) is True
        assert ibex.delete_session(SESSION) is False
    assert session.extracted
    assert rec.requests[0].url.path == f"/v1/sessions/{SESSION}"
    assert rec.requests[1].url.path == "/v1/sessions"
    assert dict(rec.requests[1].url.params) == {
        "agent_id": str(AGENT),
        "external_id": "conv-42",
        "status": "active",
        "limit": "5",
    }
    assert [s.id for s in page.items] == [SESSION] and page.next_cursor is None
    assert [r.method for r in rec.requests[2:]] == ["DELETE", "DELETE"]


def test_create_memory_sends_the_body_and_a_generated_key_and_parses_the_memory(sleeps):
    rec = Recorder(httpx.Response(201, json=memory_json()))
    with client_for(rec, sleeps) as ibex:
        memory = ibex.create_memory(
            AGENT,
            "Dana is allergic to peanuts.",
            source=MemorySource(SESSION, 3, 0),
            metadata={"lang": "en"},
        )
    assert (rec.last.method, rec.last.url.path) == ("POST", "/v1/memories")
    assert rec.body() == {
        "agent_id": str(AGENT),
        "content": "Dana is allergic to peanuts.",
        "kind": "fact",
        "source": {"session_id": str(SESSION), "turn_index": 3, "ordinal": 0},
        "metadata": {"lang": "en"},
    }
    assert uuid.UUID(rec.last.headers["X-Idempotency-Key"]).version == 4
    assert memory == Memory(
        id=MEMORY,
        org_id=ORG,
        agent_id=AGENT,
        content="Dana is allergic to peanuts.",
        content_hash="a" * 64,
        kind="fact",
        source=MemorySource(SESSION, 3, 0),
        metadata={"lang": "en"},
        created_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
    )


def test_create_memory_uses_the_callers_key_and_a_new_key_per_call(sleeps):
    rec = Recorder(httpx.Response(201, json=memory_json()))
    with client_for(rec, sleeps) as ibex:
        ibex.create_memory(AGENT, "a", idempotency_key="my-key-1")
        ibex.create_memory(AGENT, "a")
        ibex.create_memory(AGENT, "a")
    keys = [r.headers["X-Idempotency-Key"] for r in rec.requests]
    assert keys[0] == "my-key-1"
    assert keys[1] != keys[2]


def test_get_list_and_delete_memory(sleeps):
    second = uuid.UUID("55555555-5555-4555-8555-555555555555")
    rec = Recorder(
        httpx.Response(200, json=memory_json()),
        httpx.Response(
            200, json={"items": [memory_json(), memory_json(second)], "next_cursor": "c2"}
        ),
        httpx.Response(204),
        error(404, "NOT_FOUND", "no such memory"),
    )
    with client_for(rec, sleeps) as ibex:
        assert ibex.get_memory(MEMORY).id == MEMORY
        page = ibex.list_memories(agent_id=AGENT, session_id=SESSION, limit=2, cursor="c1")
        assert ibex.delete_memory(MEMORY) is True
        assert ibex.delete_memory(MEMORY) is False
    assert (rec.requests[0].method, rec.requests[0].url.path) == ("GET", f"/v1/memories/{MEMORY}")
    assert dict(rec.requests[1].url.params) == {
        "agent_id": str(AGENT),
        "session_id": str(SESSION),
        "limit": "2",
        "cursor": "c1",
    }
    assert [m.id for m in page.items] == [MEMORY, second] and page.next_cursor == "c2"
    assert (rec.requests[2].method, rec.requests[2].url.path) == (
        "DELETE",
        f"/v1/memories/{MEMORY}",
    )


def test_get_memory_of_another_org_raises_not_found(sleeps):
    rec = Recorder(error(404, "NOT_FOUND", "no such memory"))
    with client_for(rec, sleeps) as ibex, pytest.raises(NotFoundError) as caught:
        ibex.get_memory(MEMORY)
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        404,
        "NOT_FOUND",
        "no such memory",
    )


def test_iter_memories_follows_next_cursor_until_the_last_page(sleeps):
    ids = [uuid.UUID(int=i) for i in range(1, 6)]
    pages = {
        None: ({"items": [memory_json(i) for i in ids[:2]], "next_cursor": "p2"}),
        "p2": ({"items": [memory_json(i) for i in ids[2:4]], "next_cursor": "p3"}),
        "p3": ({"items": [memory_json(ids[4])], "next_cursor": None}),
    }
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    with client_for(handler, sleeps) as ibex:
        iterator = ibex.iter_memories(agent_id=AGENT, page_size=2)
        assert seen == []  # nothing is fetched before the first item is asked for
        assert [m.id for m in iterator] == ids
    assert [r.url.params.get("cursor") for r in seen] == [None, "p2", "p3"]
    assert {r.url.params["limit"] for r in seen} == {"2"}


def test_iter_sessions_follows_next_cursor(sleeps):
    other = uuid.UUID(int=7)
    rec = Recorder(
        httpx.Response(200, json={"items": [session_json()], "next_cursor": "n"}),
        httpx.Response(200, json={"items": [session_json(id=str(other))], "next_cursor": None}),
    )
    with client_for(rec, sleeps) as ibex:
        assert [s.id for s in ibex.iter_sessions(status="completed")] == [SESSION, other]
    assert [r.url.params.get("cursor") for r in rec.requests] == [None, "n"]


def test_search_posts_the_query_and_parses_hits_with_signals_and_snippet(sleeps):
    rec = Recorder(httpx.Response(200, json={"items": [hit_json(score=0.82)]}))
    with client_for(rec, sleeps) as ibex:
        hits = ibex.search(
            "what is Dana allergic to?", agent_id=AGENT, session_id=SESSION, kinds=["fact"], limit=5
        )
    assert (rec.last.method, rec.last.url.path) == ("POST", "/v1/memories/search")
    assert rec.body() == {
        "query": "what is Dana allergic to?",
        "agent_id": str(AGENT),
        "session_id": str(SESSION),
        "kinds": ["fact"],
        "limit": 5,
    }
    (hit,) = hits
    assert hit.memory.id == MEMORY and hit.memory.content == "Dana is allergic to peanuts."
    assert hit.score == 0.82
    assert (hit.signals.text, hit.signals.trigram, hit.signals.recency) == (0.9, 0.58, 0.97)
    assert hit.snippet == "Dana is allergic to <mark>peanuts</mark>."


def test_context_by_query_or_messages(sleeps):
    block = "<memories>\n- Dana is allergic to peanuts.\n</memories>"
    answer = {"context": block, "memories": [hit_json()], "tokens": 14, "dropped": 3}
    rec = Recorder(httpx.Response(200, json=answer))
    messages = [{"role": "user", "content": "What should I cook for Dana?"}]
    with client_for(rec, sleeps) as ibex:
        by_query = ibex.context(AGENT, query="Dana food", max_tokens=100)
        by_messages = ibex.context(AGENT, messages=messages, kinds=["fact", "preference"])
        with pytest.raises(ValueError, match="exactly one"):
            ibex.context(AGENT)
        with pytest.raises(ValueError, match="exactly one"):
            ibex.context(AGENT, query="q", messages=messages)
    assert [r.url.path for r in rec.requests] == ["/v1/context", "/v1/context"]
    assert rec.body(0) == {"agent_id": str(AGENT), "query": "Dana food", "max_tokens": 100}
    assert rec.body(1) == {
        "agent_id": str(AGENT),
        "messages": messages,
        "kinds": ["fact", "preference"],
    }
    assert by_query == by_messages
    assert str(by_query) == block
    assert (by_query.tokens, by_query.dropped) == (14, 3)
    assert [h.memory.id for h in by_query.memories] == [MEMORY]


def test_ids_must_be_uuids_so_a_path_cannot_be_smuggled(sleeps):
    rec = Recorder(httpx.Response(200, json=memory_json()))
    with client_for(rec, sleeps) as ibex, pytest.raises(ValueError, match="memory_id"):
        ibex.get_memory("../sessions")
    assert rec.requests == []


def test_a_2xx_with_an_unexpected_body_raises_and_is_not_retried(sleeps):
    rec = Recorder(httpx.Response(200, json={"id": "not-a-uuid"}))
    with client_for(rec, sleeps) as ibex, pytest.raises(UnexpectedResponseError):
        ibex.get_memory(MEMORY)
    rec2 = Recorder(httpx.Response(200, text="<html>hi</html>"))
    with client_for(rec2, sleeps) as ibex, pytest.raises(UnexpectedResponseError, match="not JSON"):
        ibex.get_memory(MEMORY)
    assert len(rec.requests) == len(rec2.requests) == 1


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "MALFORMED_JSON", BadRequestError),
        (401, "UNAUTHORIZED", AuthenticationError),
        (403, "INSUFFICIENT_SCOPE", PermissionDeniedError),
        (404, "NOT_FOUND", NotFoundError),
        (409, "IDEMPOTENCY_CONFLICT", ConflictError),
        (422, "VALIDATION_FAILED", InvalidRequestError),
    ],
)
def test_client_errors_are_raised_at_once_with_code_and_message(sleeps, status, code, cls):
    rec = Recorder(error(status, code, "the server says why"))
    with client_for(rec, sleeps) as ibex, pytest.raises(cls) as caught:
        ibex.create_memory(AGENT, "Dana is allergic to peanuts.")
    assert len(rec.requests) == 1 and sleeps == []
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        status,
        code,
        "the server says why",
    )
    assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value)


def test_validation_errors_carry_the_fields(sleeps):
    fields = {"content": ["must not be blank"]}
    rec = Recorder(error(422, "VALIDATION_FAILED", "invalid request", fields=fields))
    with client_for(rec, sleeps) as ibex, pytest.raises(InvalidRequestError) as caught:
        ibex.create_memory(AGENT, " ")
    assert caught.value.fields == fields


def test_duplicate_content_is_a_typed_error_naming_the_existing_memory(sleeps):
    existing = uuid.uuid4()
    rec = Recorder(error(409, "DUPLICATE_CONTENT", "exists", existing_id=str(existing)))
    with client_for(rec, sleeps) as ibex, pytest.raises(DuplicateContentError) as caught:
        ibex.create_memory(AGENT, "Dana is allergic to peanuts.")
    assert caught.value.existing_id == existing
    assert isinstance(caught.value, ConflictError) and len(rec.requests) == 1


def test_turn_conflict_and_gap_are_typed(sleeps):
    rec = Recorder(
        error(409, "TURN_CONFLICT", "turn 1 differs", turn_index=1),
        error(409, "TURN_GAP", "expected turn 3", expected_turn_index=3),
    )
    turn = Turn(5, [{"role": "user", "content": "hi"}])
    with client_for(rec, sleeps) as ibex:
        with pytest.raises(TurnConflictError) as conflict:
            ibex.append_turns(SESSION, [turn])
        with pytest.raises(TurnGapError) as gap:
            ibex.append_turns(SESSION, [turn])
    assert conflict.value.turn_index == 1
    assert gap.value.expected_turn_index == 3
    assert len(rec.requests) == 2


def test_an_error_page_that_is_not_json_still_raises_by_status(sleeps):
    rec = Recorder(httpx.Response(403, text="<html>Forbidden</html>"))
    with client_for(rec, sleeps) as ibex, pytest.raises(PermissionDeniedError) as caught:
        ibex.get_memory(MEMORY)
    assert caught.value.code is None and caught.value.status == 403


# -- retries -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (408, "REQUEST_TIMEOUT"),
        (429, "RATE_LIMITED"),
        (500, "INTERNAL_ERROR"),
        (503, "UNAVAILABLE"),
    ],
)
def test_retryable_statuses_are_retried_honouring_retry_after(sleeps, status, code):
    rec = Recorder(
        error(status, code, headers={"Retry-After": "3"}),
        error(status, code, headers={"Retry-After": "1"}),
        httpx.Response(200, json={"items": [hit_json()]}),
    )
    with client_for(rec, sleeps) as ibex:
        hits = ibex.search("peanuts", agent_id=AGENT)
    assert len(hits) == 1
    assert len(rec.requests) == 3
    assert sleeps == [3.0, 1.0]
    assert rec.requests[0].content == rec.requests[2].content


def test_without_retry_after_the_backoff_is_capped_exponential_with_jitter(sleeps):
    rec = Recorder(error(503, "UNAVAILABLE"))
    policy = RetryPolicy(max_attempts=5, backoff_base=0.5, backoff_max=1.5)
    with client_for(rec, sleeps, retry=policy) as ibex, pytest.raises(ServerError):
        ibex.get_memory(MEMORY)
    assert len(rec.requests) == 5
    caps = [0.5, 1.0, 1.5, 1.5]
    assert len(sleeps) == 4
    assert all(0 <= s <= cap for s, cap in zip(sleeps, caps, strict=True))


def test_the_last_failure_is_raised_when_attempts_run_out(sleeps):
    rec = Recorder(error(429, "RATE_LIMITED", "slow down", headers={"Retry-After": "2"}))
    with client_for(rec, sleeps) as ibex, pytest.raises(RateLimitedError) as caught:
        ibex.get_session(SESSION)
    assert len(rec.requests) == 4 and sleeps == [2.0, 2.0, 2.0]
    assert caught.value.retry_after == 2.0 and caught.value.code == "RATE_LIMITED"


def test_a_huge_retry_after_is_capped(sleeps):
    rec = Recorder(error(503, "UNAVAILABLE", headers={"Retry-After": "86400"}), httpx.Response(204))
    policy = RetryPolicy(retry_after_max=30)
    with client_for(rec, sleeps, retry=policy) as ibex:
        assert ibex.delete_memory(MEMORY) is True
    assert sleeps == [30.0]


def test_a_retried_create_reuses_its_idempotency_key_and_body(sleeps):
    rec = Recorder(
        error(503, "UNAVAILABLE"),
        error(409, "IDEMPOTENCY_IN_PROGRESS", headers={"Retry-After": "1"}),
        httpx.ConnectError("connection reset"),
        httpx.Response(201, json=memory_json(), headers={"Idempotent-Replayed": "true"}),
    )
    with client_for(rec, sleeps) as ibex:
        memory = ibex.create_memory(AGENT, "Dana is allergic to peanuts.")
    assert memory.id == MEMORY
    assert len(rec.requests) == 4
    assert len({r.headers["X-Idempotency-Key"] for r in rec.requests}) == 1
    assert len({r.content for r in rec.requests}) == 1
    assert sleeps[1] == 1.0


def test_timeouts_and_connection_errors_are_retried_then_raised(sleeps):
    rec = Recorder(httpx.ReadTimeout("slow"), httpx.Response(200, json=memory_json()))
    with client_for(rec, sleeps) as ibex:
        assert ibex.get_memory(MEMORY).id == MEMORY
    assert len(rec.requests) == 2 and len(sleeps) == 1

    rec2 = Recorder(httpx.ConnectError("refused"))
    policy = RetryPolicy(max_attempts=2)
    with client_for(rec2, sleeps, retry=policy) as ibex, pytest.raises(IbexConnectionError):
        ibex.get_memory(MEMORY)
    assert len(rec2.requests) == 2

    rec3 = Recorder(httpx.ConnectTimeout("slow"))
    policy = RetryPolicy(max_attempts=1)
    with client_for(rec3, sleeps, retry=policy) as ibex, pytest.raises(IbexTimeoutError):
        ibex.get_memory(MEMORY)
    assert len(rec3.requests) == 1


def test_a_request_httpx_cannot_make_is_not_retried(sleeps):
    rec = Recorder(httpx.UnsupportedProtocol("no such scheme"))
    with client_for(rec, sleeps) as ibex, pytest.raises(IbexConnectionError):
        ibex.get_memory(MEMORY)
    assert len(rec.requests) == 1 and sleeps == []


def test_a_retried_delete_that_finds_nothing_reports_false(sleeps):
    # The first DELETE committed but its answer was lost (a 502 from a proxy): the retry
    # finds nothing to delete, which is an answer, not an error.
    rec = Recorder(error(502, "BAD_GATEWAY"), error(404, "NOT_FOUND"))
    with client_for(rec, sleeps) as ibex:
        assert ibex.delete_memory(MEMORY) is False
    assert len(rec.requests) == 2


# -- the token and the client's lifetime -------------------------------------------------------


def test_the_token_is_not_in_the_repr(sleeps):
    ibex = client_for(Recorder(httpx.Response(204)), sleeps)
    assert TOKEN not in repr(ibex) and BASE in repr(ibex)
    assert TOKEN not in repr(ibex.__dict__.get("_base"))
    ibex.close()


def test_an_injected_client_is_used_and_left_open(sleeps):
    rec = Recorder(httpx.Response(200, json=memory_json()))
    http = httpx.Client(transport=httpx.MockTransport(rec))
    with IbexClient(BASE, TOKEN, client=http, sleep=sleeps.append) as ibex:
        ibex.get_memory(MEMORY)
    assert not http.is_closed
    assert str(rec.last.url) == f"{BASE}/v1/memories/{MEMORY}"
    http.close()
    with pytest.raises(ValueError, match="not both"):
        IbexClient(BASE, TOKEN, client=http, transport=httpx.MockTransport(rec))
    with pytest.raises(ValueError, match="token"):
        IbexClient(BASE, "")


def test_api_error_base_class_for_an_unlisted_status(sleeps):
    rec = Recorder(error(418, "TEAPOT"))
    with client_for(rec, sleeps) as ibex, pytest.raises(ApiError) as caught:
        ibex.get_memory(MEMORY)
    assert type(caught.value) is ApiError and caught.value.status == 418


def test_retries_are_logged_without_the_token(sleeps, caplog):
    rec = Recorder(error(503, "UNAVAILABLE", headers={"Retry-After": "1"}), httpx.Response(204))
    with caplog.at_level("DEBUG"), client_for(rec, sleeps, org_id=ORG) as ibex:
        assert ibex.delete_memory(MEMORY) is True
    retries = [r for r in caplog.records if r.name == "ibex.client"]
    assert len(retries) == 1
    assert f"DELETE /v1/memories/{MEMORY}: attempt 1 failed (503 UNAVAILABLE" in retries[0].message
    assert TOKEN not in caplog.text


# -- the agent by slug, pages, unknown agents -------------------------------------------------


def test_search_and_context_take_the_agent_slug_as_sessions_do(sleeps):
    block = "<memories>\n- Dana is allergic to peanuts.\n</memories>"
    rec = Recorder(
        httpx.Response(200, json={"items": [hit_json()]}),
        httpx.Response(200, json={"context": block, "memories": [], "tokens": 14, "dropped": 0}),
    )
    with client_for(rec, sleeps) as ibex:
        (hit,) = ibex.search("peanuts", agent="support-bot")
        context = ibex.context(agent="support-bot", query="Dana food")
        for wrong in ({}, {"agent": "support-bot", "agent_id": AGENT}):
            with pytest.raises(ValueError, match="exactly one of agent"):
                ibex.search("peanuts", **wrong)
            with pytest.raises(ValueError, match="exactly one of agent"):
                ibex.context(query="q", **wrong)
    assert rec.body(0) == {"query": "peanuts", "agent": "support-bot"}
    assert rec.body(1) == {"agent": "support-bot", "query": "Dana food"}
    assert hit.memory.id == MEMORY and str(context) == block
    assert len(rec.requests) == 2  # the wrong calls sent nothing


def test_create_session_sends_create_agent_only_when_asked(sleeps):
    rec = Recorder(
        httpx.Response(201, json=session_json()), httpx.Response(201, json=session_json())
    )
    with client_for(rec, sleeps) as ibex:
        ibex.create_session("support-bot", create_agent=True, external_id="a")
        ibex.create_session("support-bot", external_id="b")
        with pytest.raises(ValueError, match="create_agent needs agent"):
            ibex.create_session(agent_id=AGENT, create_agent=True)
    assert rec.body(0) == {"agent": "support-bot", "create_agent": True, "external_id": "a"}
    assert rec.body(1) == {"agent": "support-bot", "external_id": "b"}


def test_an_unknown_agent_raises_not_found_with_its_code(sleeps):
    rec = Recorder(error(404, "UNKNOWN_AGENT", "no agent 'suport-bot' in this org"))
    with client_for(rec, sleeps) as ibex, pytest.raises(NotFoundError) as raised:
        ibex.search("peanuts", agent="suport-bot")
    assert raised.value.code == "UNKNOWN_AGENT"
    assert "suport-bot" in raised.value.message
    assert len(rec.requests) == 1  # a 404 is not retried


def test_a_page_is_iterable_and_sized(sleeps):
    other = uuid.UUID(int=7)
    rec = Recorder(
        httpx.Response(
            200, json={"items": [session_json(), session_json(id=str(other))], "next_cursor": "n"}
        ),
        httpx.Response(200, json={"items": [memory_json()], "next_cursor": None}),
    )
    with client_for(rec, sleeps) as ibex:
        sessions = ibex.list_sessions(limit=2)
        memories = ibex.list_memories(agent_id=AGENT)
    assert [s.id for s in sessions] == [SESSION, other]
    assert len(sessions) == 2 and sessions.next_cursor == "n"
    assert [m.id for m in memories] == [MEMORY] and len(memories) == 1
    assert list(sessions) == list(sessions.items)  # iterating twice yields the same items
