"""AsyncIbexClient over httpx.MockTransport with async handlers: the same requests, parsing,
retries and errors as the sync client, and calls that really run concurrently."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from ibex_client import (
    AsyncIbexClient,
    DuplicateContentError,
    IbexConnectionError,
    Memory,
    NotFoundError,
    RetryPolicy,
    Session,
    Turn,
    TurnsAppended,
)
from test_ibex_client import (
    AGENT,
    BASE,
    MEMORY,
    ORG,
    SESSION,
    TOKEN,
    appended_json,
    error,
    hit_json,
    memory_json,
    session_json,
)

AsyncHandler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class AsyncRecorder:
    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        await asyncio.sleep(0)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def body(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)


def client_for(handler: AsyncHandler, sleeps: list[float], **kwargs: Any) -> AsyncIbexClient:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    return AsyncIbexClient(
        BASE, TOKEN, transport=httpx.MockTransport(handler), sleep=sleep, **kwargs
    )


def test_sessions_turns_and_status_changes() -> None:
    rec = AsyncRecorder(
        httpx.Response(201, json=session_json()),
        httpx.Response(201, json=appended_json(1, turn_count=1)),
        httpx.Response(200, json=session_json(turn_count=1, status="completed")),
        httpx.Response(200, json=session_json(status="abandoned")),
        httpx.Response(200, json=session_json(turn_count=1, last_extracted_turn=1)),
        httpx.Response(204),
    )
    sleeps: list[float] = []

    async def run() -> list[Session | TurnsAppended | bool]:
        async with client_for(rec, sleeps, org_id=ORG) as ibex:
            return [
                await ibex.create_session("support-bot", external_id="conv-42"),
                await ibex.append_turns(SESSION, [Turn(1, [{"role": "user", "content": "hi"}])]),
                await ibex.complete_session(SESSION),
                await ibex.abandon_session(SESSION),
                await ibex.get_session(SESSION),
                await ibex.delete_session(SESSION),
            ]

    created, appended, completed, abandoned, fetched, deleted = asyncio.run(run())
    assert [(r.method, r.url.path) for r in rec.requests] == [
        ("POST", "/v1/sessions"),
        ("POST", f"/v1/sessions/{SESSION}/turns"),
        ("POST", f"/v1/sessions/{SESSION}/complete"),
        ("POST", f"/v1/sessions/{SESSION}/abandon"),
        ("GET", f"/v1/sessions/{SESSION}"),
        ("DELETE", f"/v1/sessions/{SESSION}"),
    ]
    assert {r.headers["X-IBEX-Org-ID"] for r in rec.requests} == {str(ORG)}
    assert {r.headers["Authorization"] for r in rec.requests} == {f"Bearer {TOKEN}"}
    assert rec.body(0) == {"agent": "support-bot", "external_id": "conv-42"}
    assert rec.body(1)["turns"][0]["turn_index"] == 1
    assert isinstance(created, Session) and created.status == "active"
    assert isinstance(appended, TurnsAppended) and appended.session.turn_count == 1
    assert appended.turns_added == 1
    assert isinstance(completed, Session) and completed.status == "completed"
    assert isinstance(abandoned, Session) and abandoned.status == "abandoned"
    assert isinstance(fetched, Session) and fetched.extracted
    assert deleted is True


def test_memories_search_and_context() -> None:
    block = "<memories>\n- Dana is allergic to peanuts.\n</memories>"
    rec = AsyncRecorder(
        httpx.Response(201, json=memory_json()),
        httpx.Response(200, json=memory_json()),
        httpx.Response(200, json={"items": [hit_json()]}),
        httpx.Response(
            200, json={"context": block, "memories": [hit_json()], "tokens": 14, "dropped": 0}
        ),
        error(404, "NOT_FOUND", "no such memory"),
    )
    sleeps: list[float] = []

    async def run() -> tuple[Any, ...]:
        async with client_for(rec, sleeps) as ibex:
            created = await ibex.create_memory(AGENT, "Dana is allergic to peanuts.")
            fetched = await ibex.get_memory(MEMORY)
            hits = await ibex.search("peanuts", agent_id=AGENT, limit=3)
            context = await ibex.context(AGENT, query="peanuts", max_tokens=50)
            with pytest.raises(NotFoundError) as caught:
                await ibex.get_memory(MEMORY)
            return created, fetched, hits, context, caught.value

    created, fetched, hits, context, missing = asyncio.run(run())
    assert isinstance(created, Memory) and created == fetched
    assert rec.requests[0].headers["X-Idempotency-Key"]
    assert rec.body(2) == {"query": "peanuts", "agent_id": str(AGENT), "limit": 3}
    assert hits[0].signals.trigram == 0.58 and hits[0].snippet.startswith("Dana")
    assert rec.body(3) == {"agent_id": str(AGENT), "query": "peanuts", "max_tokens": 50}
    assert context.context == block and context.memories[0].memory.id == MEMORY
    assert (missing.status, missing.code, missing.message) == (404, "NOT_FOUND", "no such memory")


def test_iter_memories_is_an_async_iterator_over_pages() -> None:
    ids = [uuid.UUID(int=i) for i in range(1, 4)]
    pages = {
        None: {"items": [memory_json(ids[0]), memory_json(ids[1])], "next_cursor": "p2"},
        "p2": {"items": [memory_json(ids[2])], "next_cursor": None},
    }
    cursors: list[str | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        cursors.append(request.url.params.get("cursor"))
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    async def run() -> list[uuid.UUID]:
        async with client_for(handler, []) as ibex:
            return [m.id async for m in ibex.iter_memories(session_id=SESSION, page_size=2)]

    assert asyncio.run(run()) == ids
    assert cursors == [None, "p2"]


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_retries_honour_retry_after_and_reuse_the_key(status: int) -> None:
    rec = AsyncRecorder(
        error(status, "X", headers={"Retry-After": "2"}),
        httpx.ConnectError("reset"),
        httpx.Response(201, json=memory_json()),
    )
    sleeps: list[float] = []

    async def run() -> Memory:
        policy = RetryPolicy(max_attempts=3, backoff_base=0.25, backoff_max=0.25)
        async with client_for(rec, sleeps, retry=policy) as ibex:
            return await ibex.create_memory(AGENT, "Dana is allergic to peanuts.")

    assert asyncio.run(run()).id == MEMORY
    assert len(rec.requests) == 3
    assert len({r.headers["X-Idempotency-Key"] for r in rec.requests}) == 1
    assert sleeps[0] == 2.0 and 0 <= sleeps[1] <= 0.25


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_client_errors_are_not_retried(status: int) -> None:
    rec = AsyncRecorder(error(status, "SOME_CODE", "why"))
    sleeps: list[float] = []

    async def run() -> None:
        async with client_for(rec, sleeps) as ibex:
            await ibex.search("peanuts", agent_id=AGENT)

    with pytest.raises(Exception) as caught:
        asyncio.run(run())
    assert getattr(caught.value, "status", None) == status
    assert getattr(caught.value, "code", None) == "SOME_CODE"
    assert len(rec.requests) == 1 and sleeps == []


def test_duplicate_content_and_exhausted_connection_errors() -> None:
    existing = uuid.uuid4()
    rec = AsyncRecorder(error(409, "DUPLICATE_CONTENT", "exists", existing_id=str(existing)))
    down = AsyncRecorder(httpx.ConnectError("refused"))

    async def run() -> tuple[DuplicateContentError, IbexConnectionError]:
        async with client_for(rec, []) as ibex:
            try:
                await ibex.create_memory(AGENT, "x")
            except DuplicateContentError as exc:
                duplicate = exc
        async with client_for(down, [], retry=RetryPolicy(max_attempts=2)) as ibex:
            try:
                await ibex.get_memory(MEMORY)
            except IbexConnectionError as exc:
                return duplicate, exc
        raise AssertionError("no error raised")

    duplicate, _ = asyncio.run(run())
    assert duplicate.existing_id == existing
    assert len(down.requests) == 2


def test_calls_run_concurrently_on_one_event_loop() -> None:
    # The first request's handler waits until the second request has arrived: with a client
    # that blocked the loop (or serialised calls), the two could never overlap.
    second_arrived = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(str(MEMORY)):
            await asyncio.wait_for(second_arrived.wait(), timeout=5)
            return httpx.Response(200, json=memory_json())
        second_arrived.set()
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    async def run() -> tuple[Memory, Any]:
        async with client_for(handler, []) as ibex:
            return await asyncio.gather(ibex.get_memory(MEMORY), ibex.list_memories())

    memory, page = asyncio.run(run())
    assert memory.id == MEMORY and page.items == ()


def test_injected_async_client_is_left_open_and_token_not_in_repr() -> None:
    rec = AsyncRecorder(httpx.Response(200, json=memory_json()))

    async def run() -> httpx.AsyncClient:
        http = httpx.AsyncClient(transport=httpx.MockTransport(rec))
        async with AsyncIbexClient(BASE, TOKEN, client=http) as ibex:
            assert TOKEN not in repr(ibex)
            await ibex.get_memory(MEMORY)
        assert not http.is_closed
        await http.aclose()
        return http

    assert asyncio.run(run()).is_closed
    assert str(rec.requests[0].url) == f"{BASE}/v1/memories/{MEMORY}"


def test_supersession_calls() -> None:
    newer = uuid.UUID(int=7)
    old = {
        **memory_json(),
        "superseded_by": str(newer),
        "superseded_at": memory_json()["created_at"],
    }
    rec = AsyncRecorder(
        httpx.Response(201, json=memory_json(newer, "Dana lives in Oslo.")),
        httpx.Response(200, json={"items": [old], "next_cursor": None}),
        httpx.Response(200, json={"items": [old, memory_json(newer, "Dana lives in Oslo.")]}),
        httpx.Response(200, json={"items": [hit_json()]}),
    )
    sleeps: list[float] = []

    async def run() -> tuple[Any, ...]:
        async with client_for(rec, sleeps) as ibex:
            created = await ibex.create_memory(AGENT, "Dana lives in Oslo.", supersedes=[MEMORY])
            page = await ibex.list_memories(agent_id=AGENT, include_superseded=True)
            chain = await ibex.history(newer)
            await ibex.search("Oslo", agent_id=AGENT, include_superseded=True)
            return created, page, chain

    created, page, chain = asyncio.run(run())
    assert rec.body(0)["supersedes"] == [str(MEMORY)]
    assert created.current and created.id == newer
    assert rec.requests[1].url.params["include_superseded"] == "true"
    assert page.items[0].superseded_by == newer and not page.items[0].current
    assert rec.requests[2].url.path == f"/v1/memories/{newer}/history"
    assert [m.id for m in chain] == [MEMORY, newer]
    assert rec.body(3)["include_superseded"] is True


def test_the_agent_slug_on_search_context_and_session_and_an_unknown_one() -> None:
    block = "<memories>\n- Dana is allergic to peanuts.\n</memories>"
    rec = AsyncRecorder(
        httpx.Response(201, json=session_json()),
        httpx.Response(200, json={"items": [hit_json()]}),
        httpx.Response(200, json={"context": block, "memories": [], "tokens": 14, "dropped": 0}),
        error(404, "UNKNOWN_AGENT", "no agent 'suport-bot' in this org"),
    )

    async def run() -> tuple[Any, ...]:
        async with client_for(rec, []) as ibex:
            await ibex.create_session("support-bot", create_agent=True)
            hits = await ibex.search("peanuts", agent="support-bot")
            context = await ibex.context(agent="support-bot", query="peanuts")
            with pytest.raises(NotFoundError) as caught:
                await ibex.search("peanuts", agent="suport-bot")
            return hits, context, caught.value

    hits, context, unknown = asyncio.run(run())
    assert rec.body(0) == {"agent": "support-bot", "create_agent": True}
    assert rec.body(1) == {"query": "peanuts", "agent": "support-bot"}
    assert rec.body(2) == {"agent": "support-bot", "query": "peanuts"}
    assert hits[0].memory.id == MEMORY and context.context == block
    assert (unknown.status, unknown.code) == (404, "UNKNOWN_AGENT")
