"""IbexClient and AsyncIbexClient against the real sessions API in-process, over the real
Postgres and Redis: open or find a session, append turns (replay, TURN_CONFLICT and TURN_GAP as
typed errors), complete, abandon, get, list page by page, delete. One scenario runs through
each client, so both parse exactly what the server sends.
(The client README's example runs against a whole stack: tests/integration/operations/
test_docs_blocks.py.)"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import httpx
import pytest

import ibex_client
from ibex_client import (
    AsyncIbexClient,
    IbexClient,
    MemorySource,
    NotFoundError,
    Page,
    Progress,
    RecordedTurn,
    Session,
    Turn,
    TurnConflictError,
    TurnGapError,
    TurnsAppended,
)
from tests.integration.memory_service.helpers import BASE_URL, Tenant, make_token

SCOPES = ["sessions:read", "sessions:write", "memory:read", "memory:write"]


def turn(i: int, text: str | None = None) -> Turn:
    return Turn(
        i,
        [{"role": "user", "content": text or f"Remember that my lucky number is {i}."}],
        {"role": "assistant", "content": "Noted."},
        prompt_tokens=10,
        completion_tokens=2,
        latency_ms=100,
    )


class AsyncWSGITransport(httpx.AsyncBaseTransport):
    """The app's WSGI transport for an async client: each request is handled in a thread (as
    a threaded WSGI server would), so the event loop never blocks on the app."""

    def __init__(self, app: Any) -> None:
        self._sync = httpx.WSGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        copy = httpx.Request(request.method, request.url, headers=request.headers, content=body)

        def handle() -> tuple[int, httpx.Headers, bytes]:
            response = self._sync.handle_request(copy)
            return response.status_code, response.headers, response.read()

        status, headers, content = await asyncio.to_thread(handle)
        return httpx.Response(status, headers=headers, content=content)


class Driver(Protocol):
    """A client's methods called synchronously, whichever client it is."""

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def iter_sessions(self, **kwargs: Any) -> list[Session]: ...


class SyncDriver:
    def __init__(self, client: IbexClient) -> None:
        self.client = client

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.client, method)(*args, **kwargs)

    def iter_sessions(self, **kwargs: Any) -> list[Session]:
        return list(self.client.iter_sessions(**kwargs))


class AsyncDriver:
    """Every call awaited on one event loop, the one the client's connections belong to."""

    def __init__(self, client: AsyncIbexClient, runner: asyncio.Runner) -> None:
        self.client = client
        self.runner = runner

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.runner.run(getattr(self.client, method)(*args, **kwargs))

    def iter_sessions(self, **kwargs: Any) -> list[Session]:
        async def collect(pages: AsyncIterator[Session]) -> list[Session]:
            return [s async for s in pages]

        return self.runner.run(collect(self.client.iter_sessions(**kwargs)))


@pytest.fixture
def token(db: Any, acme: Tenant) -> str:
    return make_token(db, acme.org_id, SCOPES)[0]


@pytest.fixture(params=["sync", "async"])
def ibex(request: pytest.FixtureRequest, app: Any, token: str) -> Iterator[Driver]:
    if request.param == "sync":
        with IbexClient(BASE_URL, token, transport=httpx.WSGITransport(app=app)) as client:
            yield SyncDriver(client)
        return
    with asyncio.Runner() as runner:
        client = AsyncIbexClient(BASE_URL, token, transport=AsyncWSGITransport(app))
        try:
            yield AsyncDriver(client, runner)
        finally:
            runner.run(client.aclose())


def test_session_lifecycle_through_the_client(ibex: Driver, acme: Tenant) -> None:
    opened = ibex(
        "create_session",
        "support-bot",
        create_agent=True,
        external_id="conv-42",
        model="gpt-4o-mini",
    )
    assert isinstance(opened, Session)
    assert (opened.org_id, opened.external_id, opened.status) == (acme.org_id, "conv-42", "active")
    assert (opened.model, opened.provider, opened.turn_count) == ("gpt-4o-mini", None, 0)
    assert opened.progress == Progress(done=0, pending=0, failed=0, pointer=0)
    assert opened.completed_at is None and opened.created_at.tzinfo is not None
    # Get-or-create: the same external id, by slug or by agent id, is the same session.
    assert ibex("create_session", "support-bot", external_id="conv-42").id == opened.id
    assert ibex("create_session", agent_id=opened.agent_id, external_id="conv-42") == opened

    appended = ibex("append_turns", opened.id, [turn(1), turn(2)])
    assert isinstance(appended, TurnsAppended) and appended.turns_added == 2
    session = appended.session
    assert (session.turn_count, session.prompt_tokens, session.completion_tokens) == (2, 20, 4)
    assert session.progress == Progress(done=0, pending=2, failed=0, pointer=0)
    # A blind retry of the same request is a replay: nothing written.
    replay = ibex("append_turns", str(opened.id), [turn(1), turn(2)])
    assert replay.replayed and replay.session.turn_count == 2

    with pytest.raises(TurnConflictError) as conflict:
        ibex("append_turns", opened.id, [turn(2, "I am someone else entirely.")])
    assert (conflict.value.status, conflict.value.code) == (409, "TURN_CONFLICT")
    assert conflict.value.turn_index == 2
    with pytest.raises(TurnGapError) as gap:
        ibex("append_turns", opened.id, [turn(5)])
    assert gap.value.code == "TURN_GAP" and gap.value.expected_turn_index == 3
    # Overlapping the stored turns: only the new one is stored.
    grown = ibex("append_turns", opened.id, [turn(2), turn(3)])
    assert grown.turns_added == 1 and grown.session.turn_count == 3

    completed = ibex("complete_session", opened.id)
    assert completed.status == "completed" and completed.completed_at is not None
    again = ibex("complete_session", opened.id)
    assert (again.status, again.completed_at) == ("completed", completed.completed_at)
    fetched = ibex("get_session", opened.id)
    assert fetched == again and not fetched.extracted
    assert fetched.progress == Progress(done=0, pending=3, failed=0, pointer=0)

    abandoned = ibex("create_session", "support-bot", external_id="conv-43")
    assert ibex("abandon_session", abandoned.id).status == "abandoned"
    assert ibex("abandon_session", abandoned.id).status == "abandoned"
    anonymous = ibex("create_session", "support-bot")
    assert anonymous.external_id is None
    assert ibex("create_session", "support-bot").id != anonymous.id

    agent = opened.agent_id
    every = ibex.iter_sessions(agent_id=agent, page_size=1)
    assert len(every) == 4 and every[-2:] == [ibex("get_session", abandoned.id), fetched]
    first = ibex("list_sessions", agent_id=agent, limit=3)
    assert len(first.items) == 3 and first.next_cursor is not None
    rest = ibex("list_sessions", agent_id=agent, limit=3, cursor=first.next_cursor)
    assert [s.id for s in rest.items] == [opened.id] and rest.next_cursor is None
    assert [s.id for s in ibex.iter_sessions(status="abandoned")] == [abandoned.id]
    assert [s.id for s in ibex.iter_sessions(external_id="conv-42")] == [opened.id]

    # Deleting the session deletes the memories extracted from it.
    memory = ibex(
        "create_memory", agent, "My lucky number is 1.", source=MemorySource(opened.id, 1, 0)
    )
    assert ibex("delete_session", opened.id) is True
    assert ibex("delete_session", opened.id) is False
    with pytest.raises(NotFoundError):
        ibex("get_session", opened.id)
    with pytest.raises(NotFoundError):
        ibex("get_memory", memory.id)
    with pytest.raises(NotFoundError):
        ibex("append_turns", opened.id, [turn(4)])
    assert opened.id not in {s.id for s in ibex.iter_sessions(agent_id=agent)}
    assert ibex("delete_session", uuid.uuid4()) is False


def test_list_turns_reads_the_turns_back_page_by_page(ibex: Driver) -> None:
    opened = ibex("create_session", "support-bot", create_agent=True, external_id="conv-turns")
    ibex("append_turns", opened.id, [turn(1), turn(2), turn(3)])
    first = ibex("list_turns", opened.id, limit=2)
    assert isinstance(first, Page) and [t.turn_index for t in first] == [1, 2]
    assert all(isinstance(t, RecordedTurn) for t in first)
    assert first.items[0].messages == tuple(turn(1).messages)
    assert {t.state for t in first} == {"pending"} and first.items[0].usage is None
    rest = ibex("list_turns", str(opened.id), cursor=first.next_cursor)
    assert [t.turn_index for t in rest] == [3] and rest.next_cursor is None
    with pytest.raises(NotFoundError):
        ibex("list_turns", uuid.uuid4())


def test_find_session_and_a_wait_that_runs_out_says_why(ibex: Driver, acme: Tenant) -> None:
    opened = ibex("create_session", "support-bot", create_agent=True, external_id="conv-wait")
    assert ibex("find_session", "support-bot", "conv-wait") == opened
    assert ibex("find_session", "support-bot", "conv-none") is None
    with pytest.raises(NotFoundError):
        ibex("find_session", "suport-bot", "conv-wait")
    ibex("append_turns", opened.id, [turn(1)])
    # Active: turns are extracted only once the session is completed, and the error says so.
    with pytest.raises(ibex_client.ExtractionTimeoutError) as waited:
        ibex("wait_for_extraction", opened.id, timeout=0.2, interval=0.05)
    assert "1 of 1 turns still pending" in str(waited.value)
    assert "the session is active" in str(waited.value)
    assert waited.value.session.status == "active"
    # Completed, but no worker runs here: the wait runs out naming the backlog instead.
    with pytest.raises(ibex_client.ExtractionTimeoutError) as completed:
        ibex("complete_session", opened.id, wait=True, timeout=0.2)
    assert "is a worker running" in str(completed.value)
    assert isinstance(completed.value, TimeoutError)
    # Nothing to extract: the wait is over at once.
    empty = ibex("create_session", "support-bot", external_id="conv-empty")
    assert ibex("complete_session", empty.id, wait=True, timeout=5).status == "completed"
