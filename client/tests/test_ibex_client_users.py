"""``user=`` on every call of both clients, and ``forget_user``: what is sent, what is read back,
and the typed errors of the user rules (a session's user set once; another user's data)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest

from ibex_client import (
    AsyncIbexClient,
    ForgottenUser,
    IbexClient,
    MemorySource,
    NotFoundError,
    PermissionDeniedError,
    UserConflictError,
)
from test_ibex_client import (
    AGENT,
    BASE,
    MEMORY,
    SESSION,
    TOKEN,
    Recorder,
    error,
    hit_json,
    memory_json,
    session_json,
)

USER = uuid.UUID("55555555-5555-4555-8555-555555555555")


def sync_client(rec: Recorder) -> IbexClient:
    return IbexClient(BASE, TOKEN, transport=httpx.MockTransport(rec), sleep=lambda s: None)


def forgotten_json() -> dict[str, Any]:
    return {"user_id": str(USER), "sessions": 2, "memories": 5, "tokens": 1}


def test_writes_send_the_user_by_key_or_id_and_read_it_back() -> None:
    rec = Recorder(
        httpx.Response(201, json=session_json(user_id=str(USER))),
        httpx.Response(201, json={**memory_json(), "user_id": str(USER)}),
        httpx.Response(201, json={**memory_json(), "user_id": str(USER)}),
    )
    with sync_client(rec) as ibex:
        session = ibex.create_session("support-bot", external_id="conv-1", user="dana-17")
        by_key = ibex.create_memory(AGENT, "Dana likes tea.", user="dana-17")
        by_id = ibex.create_memory(
            AGENT, "Dana likes tea.", user_id=USER, source=MemorySource(SESSION, 1, 0)
        )
    assert rec.body(0) == {"agent": "support-bot", "external_id": "conv-1", "user": "dana-17"}
    assert rec.body(1)["user"] == "dana-17" and "user_id" not in rec.body(1)
    assert rec.body(2)["user_id"] == str(USER) and "user" not in rec.body(2)
    assert session.user_id == USER
    assert by_key.user_id == USER and by_id.user_id == USER


def test_an_agent_wide_memory_and_a_server_without_users_read_as_no_user() -> None:
    older = memory_json()
    del older["user_id"]
    rec = Recorder(httpx.Response(200, json=memory_json()), httpx.Response(200, json=older))
    with sync_client(rec) as ibex:
        assert ibex.get_memory(MEMORY).user_id is None
        assert ibex.get_memory(MEMORY).user_id is None
    # No user given: no user parameter sent (the server reads agent-wide memories only).
    assert rec.requests[0].url.params == httpx.QueryParams()


def test_reads_send_the_user_and_the_scope_flags() -> None:
    rec = Recorder(
        httpx.Response(200, json=memory_json()),
        httpx.Response(200, json={"items": [memory_json()], "next_cursor": None}),
        httpx.Response(200, json={"items": [hit_json()]}),
        httpx.Response(200, json={"context": "", "memories": [], "tokens": 0, "dropped": 0}),
        httpx.Response(200, json={"items": [], "next_cursor": None}),
    )
    with sync_client(rec) as ibex:
        ibex.get_memory(MEMORY, user="dana-17")
        ibex.list_memories(agent_id=AGENT, user_id=USER, include_shared=False)
        ibex.search("tea", agent_id=AGENT, user="dana-17")
        ibex.context(AGENT, query="tea", user="dana-17", include_shared=False)
        list(ibex.iter_memories(agent_id=AGENT, all_users=True))
    assert dict(rec.requests[0].url.params) == {"user": "dana-17"}
    assert dict(rec.requests[1].url.params) == {
        "agent_id": str(AGENT),
        "user_id": str(USER),
        "include_shared": "false",
    }
    assert rec.body(2) == {"query": "tea", "agent_id": str(AGENT), "user": "dana-17"}
    assert rec.body(3) == {
        "agent_id": str(AGENT),
        "query": "tea",
        "user": "dana-17",
        "include_shared": False,
    }
    assert dict(rec.requests[4].url.params) == {"agent_id": str(AGENT), "all_users": "true"}


def test_user_and_user_id_together_are_refused_before_anything_is_sent() -> None:
    rec = Recorder(httpx.Response(200, json=memory_json()))
    with sync_client(rec) as ibex, pytest.raises(ValueError, match="user or user_id"):
        ibex.search("tea", agent_id=AGENT, user="dana-17", user_id=USER)
    assert rec.requests == []


def test_user_errors_are_typed() -> None:
    rec = Recorder(
        error(409, "USER_CONFLICT", "this session belongs to another user"),
        error(403, "FORBIDDEN_USER"),
        error(404, "NOT_FOUND", "no such memory"),
    )
    with sync_client(rec) as ibex:
        with pytest.raises(UserConflictError):
            ibex.create_session("support-bot", external_id="conv-1", user="grace")
        with pytest.raises(PermissionDeniedError) as denied:
            ibex.search("tea", agent_id=AGENT, user="grace")
        assert denied.value.code == "FORBIDDEN_USER"
        with pytest.raises(NotFoundError):
            ibex.get_memory(MEMORY, user="grace")


def test_forget_user_deletes_by_key_escaped_and_none_when_there_is_no_such_user() -> None:
    rec = Recorder(httpx.Response(200, json=forgotten_json()), error(404, "NOT_FOUND"))
    with sync_client(rec) as ibex:
        forgotten = ibex.forget_user("dana/17 ü")
        missing = ibex.forget_user(USER)
    assert rec.requests[0].method == "DELETE"
    assert rec.requests[0].url.raw_path == b"/v1/users/dana%2F17%20%C3%BC"
    assert rec.requests[1].url.path == f"/v1/users/{USER}"
    assert forgotten == ForgottenUser(USER, sessions=2, memories=5, tokens=1)
    assert missing is None


def test_the_async_client_sends_the_same_user_fields_and_forgets() -> None:
    requests: list[httpx.Request] = []
    answers = [
        httpx.Response(201, json=session_json(user_id=str(USER))),
        httpx.Response(201, json={**memory_json(), "user_id": str(USER)}),
        httpx.Response(200, json={**memory_json(), "user_id": str(USER)}),
        httpx.Response(200, json={"items": [memory_json()], "next_cursor": None}),
        httpx.Response(200, json={"items": [hit_json()]}),
        httpx.Response(200, json={"context": "", "memories": [], "tokens": 0, "dropped": 0}),
        httpx.Response(200, json=forgotten_json()),
    ]

    async def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return answers.pop(0)

    async def sleep(seconds: float) -> None:
        return None

    async def run() -> tuple[Any, ...]:
        async with AsyncIbexClient(
            BASE, TOKEN, transport=httpx.MockTransport(handler), sleep=sleep
        ) as ibex:
            session = await ibex.create_session("support-bot", external_id="c", user="dana-17")
            memory = await ibex.create_memory(AGENT, "Dana likes tea.", user_id=USER)
            fetched = await ibex.get_memory(MEMORY, user="dana-17")
            await ibex.list_memories(agent_id=AGENT, user="dana-17", include_shared=False)
            await ibex.search("tea", agent_id=AGENT, user="dana-17")
            await ibex.context(AGENT, query="tea", user_id=USER)
            forgotten = await ibex.forget_user("dana-17")
            return session, memory, fetched, forgotten

    session, memory, fetched, forgotten = asyncio.run(run())
    assert session.user_id == memory.user_id == fetched.user_id == USER
    assert forgotten.memories == 5
    assert json.loads(requests[0].content)["user"] == "dana-17"
    assert json.loads(requests[1].content)["user_id"] == str(USER)
    assert dict(requests[2].url.params) == {"user": "dana-17"}
    assert dict(requests[3].url.params) == {
        "agent_id": str(AGENT),
        "user": "dana-17",
        "include_shared": "false",
    }
    assert json.loads(requests[4].content)["user"] == "dana-17"
    assert json.loads(requests[5].content)["user_id"] == str(USER)
    assert (requests[6].method, requests[6].url.path) == ("DELETE", "/v1/users/dana-17")
