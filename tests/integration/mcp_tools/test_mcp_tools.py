"""The MCP tools over both transports (stdio: ``ibex mcp`` spawned with its environment; HTTP:
the Procfile's ``mcp`` process), against the real web process: what each tool answers, and
that scopes, orgs and argument checks hold as they do over the HTTP API."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack.processes import ROOT, Launcher, free_port
from tests.integration.mcp_tools.conftest import (
    Agent,
    Connect,
    Defaults,
    LossyProxy,
    Servers,
    http_agent,
    process_env,
    run,
    stdio_agent,
)
from tests.integration.memory_service.helpers import make_tenant, make_token, memory_count

TOOLS = {"remember", "recall", "context", "forget", "list_memories"}


def test_every_tool_round_trip(connect: Connect, store: Any) -> None:
    acme = make_tenant(store, "acme")

    async def scenario() -> None:
        async with connect(acme.writer, agent=str(acme.agent_id)) as agent:
            listed = await agent.session.list_tools()
            tools = {t.name: t for t in listed.tools}
            assert set(tools) >= TOOLS
            for name in TOOLS:
                assert tools[name].description, name
            assert tools["recall"].input_schema["required"] == ["query"]
            assert tools["remember"].input_schema["properties"]["kind"]["default"] == "fact"

            peanuts = await agent.ok("remember", content="Dana is allergic to peanuts.")
            memory = peanuts["memory"]
            assert memory["content"] == "Dana is allergic to peanuts."
            assert memory["kind"] == "fact"
            assert memory["agent_id"] == str(acme.agent_id)
            assert memory["source_session_id"] is None
            assert peanuts["already_known"] is False
            # Content the agent already has, under another kind (so another key): the memory
            # that holds it.
            known = await agent.ok("remember", content="Dana is allergic to peanuts.", kind="other")
            assert known == {"memory": memory, "already_known": True}
            tea = await agent.ok("remember", content="Dana prefers green tea.", kind="preference")
            assert tea["memory"]["kind"] == "preference"
            await agent.ok("remember", content="Dana moved to Lisbon in May.", kind="event")

            hits = (await agent.ok("recall", query="what is Dana allergic to?"))["hits"]
            assert hits[0]["memory"]["id"] == memory["id"]
            assert hits[0]["score"] > 0
            assert set(hits[0]["signals"]) == {"text", "trigram", "recency", "semantic"}
            assert hits[0]["signals"]["text"] > 0
            # The memory was embedded when it was stored (the default, offline embedder).
            assert 0 <= hits[0]["signals"]["semantic"] <= 1
            assert "<mark>" in hits[0]["snippet"]
            assert len((await agent.ok("recall", query="Dana", limit=1))["hits"]) == 1

            packed = await agent.ok("context", query="what is Dana allergic to?")
            assert packed["context"].startswith("<memories>")
            assert "Dana is allergic to peanuts." in packed["context"]
            assert 0 < packed["tokens"] <= 400
            tight = await agent.ok("context", query="Dana", max_tokens=12)
            assert tight["tokens"] <= 12

            first = await agent.ok("list_memories", limit=2)
            assert len(first["memories"]) == 2 and first["next_cursor"]
            rest = await agent.ok("list_memories", cursor=first["next_cursor"], limit=2)
            assert rest["next_cursor"] is None
            seen = [m["content"] for m in first["memories"] + rest["memories"]]
            assert sorted(seen) == sorted(
                [
                    "Dana is allergic to peanuts.",
                    "Dana prefers green tea.",
                    "Dana moved to Lisbon in May.",
                ]
            )

            gone = await agent.ok("forget", memory_id=memory["id"])
            assert gone == {"memory_id": memory["id"], "forgotten": True}
            hits = (await agent.ok("recall", query="peanuts allergic"))["hits"]
            assert memory["id"] not in [h["memory"]["id"] for h in hits]
            again = await agent.error("forget", memory_id=memory["id"])
            assert again.startswith("NOT_FOUND")

    run(scenario())
    assert memory_count(store.db, acme.org_id) == 3


def test_remember_after_forget_stores_the_memory_again(connect: Connect, store: Any) -> None:
    """``remember``'s key is derived from its arguments, so after ``forget`` the same call
    would replay onto the forgotten memory: it must store the content again, and say
    ``already_known`` only while a memory holding it exists."""
    acme = make_tenant(store, "acme")
    content = "Dana is allergic to peanuts."

    async def scenario() -> None:
        async with connect(acme.writer, agent=str(acme.agent_id)) as agent:
            first = await agent.ok("remember", content=content)
            assert first["already_known"] is False
            again = await agent.ok("remember", content=content)
            assert again == {"memory": first["memory"], "already_known": True}
            await agent.ok("forget", memory_id=first["memory"]["id"])
            back = await agent.ok("remember", content=content)
            assert back["already_known"] is False
            assert back["memory"]["id"] != first["memory"]["id"]
            hits = (await agent.ok("recall", query="what is Dana allergic to?"))["hits"]
            assert [h["memory"]["id"] for h in hits][:1] == [back["memory"]["id"]]
            repeat = await agent.ok("remember", content=content)
            assert repeat == {"memory": back["memory"], "already_known": True}
            # Forgotten and remembered a second time: a third memory, as the first two.
            await agent.ok("forget", memory_id=back["memory"]["id"])
            third = await agent.ok("remember", content=content)
            assert third["already_known"] is False
            assert third["memory"]["id"] not in (first["memory"]["id"], back["memory"]["id"])

    run(scenario())
    live = store.db.execute_sql(
        "SELECT count(*) FROM ibex_memory.memories WHERE org_id = %s AND deleted_at IS NULL",
        (str(acme.org_id),),
    ).fetchone()[0]
    assert live == 1 and memory_count(store.db, acme.org_id) == 3


def test_missing_scope_is_a_tool_error_with_the_code(connect: Connect, store: Any) -> None:
    acme = make_tenant(store, "acme")
    no_read, _ = make_token(store.db, acme.org_id, ["memory:write"])

    async def scenario() -> None:
        async with connect(acme.reader, agent=str(acme.agent_id)) as agent:
            refused = await agent.error("remember", content="Dana is allergic to peanuts.")
            assert refused.startswith("INSUFFICIENT_SCOPE")
            assert "memory:write" in refused
            # The server lives on: the next call of the same session is answered.
            assert (await agent.ok("recall", query="Dana"))["hits"] == []
        async with connect(no_read, agent=str(acme.agent_id)) as agent:
            assert (await agent.error("recall", query="Dana")).startswith("INSUFFICIENT_SCOPE")
            assert (await agent.error("list_memories")).startswith("INSUFFICIENT_SCOPE")

    run(scenario())
    assert memory_count(store.db) == 0


def test_another_orgs_memory_is_not_found(connect: Connect, store: Any) -> None:
    acme, globex = make_tenant(store, "acme"), make_tenant(store, "globex")

    async def scenario() -> None:
        async with connect(globex.writer, agent=str(globex.agent_id)) as agent:
            theirs = (await agent.ok("remember", content="Globex ships on Fridays."))["memory"]
        async with connect(acme.writer, agent=str(acme.agent_id)) as agent:
            assert (await agent.error("forget", memory_id=theirs["id"])).startswith("NOT_FOUND")
            assert (await agent.ok("list_memories"))["memories"] == []
            # Naming the other org's agent finds nothing of it either.
            other = await agent.error("recall", query="Fridays", agent=str(globex.agent_id))
            assert other.startswith("UNKNOWN_AGENT"), other

    run(scenario())
    assert memory_count(store.db, globex.org_id) == 1


def test_bad_arguments_name_the_argument(connect: Connect, store: Any) -> None:
    acme = make_tenant(store, "acme")

    async def scenario() -> None:
        async with connect(acme.writer, agent=str(acme.agent_id)) as agent:
            assert "limit" in await agent.error("recall", query="Dana", limit=0)
            assert "limit" in await agent.error("recall", query="Dana", limit=51)
            assert "query" in await agent.error("recall")
            assert "content" in await agent.error("remember")
            assert "kind" in await agent.error("remember", content="x y z", kind="rumour")
            assert "memory_id" in await agent.error("forget", memory_id="not-a-uuid")
            assert "max_tokens" in await agent.error("context", query="Dana", max_tokens=0)
            assert "cursor" in await agent.error("list_memories", cursor="%%%")
            assert "content" in await agent.error("remember", content="x" * 4001)
            # Refused by the service, field by field: the field is named.
            blank = await agent.error("remember", content="   ")
            assert blank.startswith("VALIDATION_FAILED") and "content" in blank, blank
        async with connect(acme.writer) as agent:  # no agent anywhere
            assert "agent" in await agent.error("recall", query="Dana")

    run(scenario())
    assert memory_count(store.db) == 0


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_remember_twice_after_a_lost_answer_stores_one_memory(
    transport: str, servers: Servers, store: Any, database_url: str, redis_url: str
) -> None:
    """The first answer of POST /v1/memories is lost on the way back to the MCP server: its
    client retries with the same key (a replay). Then the agent, which never heard back,
    calls ``remember`` again with the same arguments, on a new connection (over stdio, a new
    process): the same memory, and one stored."""
    acme = make_tenant(store, "acme")
    content = "Dana is allergic to peanuts."

    async def scenario(connect: Callable[[], Any]) -> list[str]:
        ids = []
        async with connect() as agent:
            ids.append((await agent.ok("remember", content=content))["memory"]["id"])
            ids.append((await agent.ok("remember", content=content))["memory"]["id"])
        async with connect() as agent:
            ids.append((await agent.ok("remember", content=content))["memory"]["id"])
        return ids

    with LossyProxy(servers.web_url, drop=1).running() as proxy:
        if transport == "stdio":
            ids = run(
                scenario(
                    lambda: stdio_agent(
                        proxy.url, acme.writer, servers.tmp, agent=str(acme.agent_id)
                    )
                )
            )
        else:
            with mcp_process(database_url, redis_url, proxy.url, servers.tmp) as url:
                ids = run(scenario(lambda: agent_args(http_agent(url, acme.writer), acme)))
    assert len(set(ids)) == 1
    assert len(proxy.posts) >= 2  # the lost attempt and its retry
    assert proxy.posts[0] == proxy.posts[1]
    assert memory_count(store.db, acme.org_id) == 1


@contextlib.contextmanager
def mcp_process(database_url: str, redis_url: str, web_url: str, tmp: Path) -> Iterator[str]:
    """Another Procfile ``mcp`` process, calling ``web_url``."""
    port = free_port()
    with Launcher(tmp / "lossy", cwd=ROOT) as launcher:
        env = process_env(database_url, redis_url, port, IBEX_URL=web_url)
        launcher.start_procfile("mcp", env, bind_host="127.0.0.1")
        launcher.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        yield f"http://127.0.0.1:{port}/mcp"


@contextlib.asynccontextmanager
async def agent_args(connecting: Any, tenant: Any) -> AsyncIterator[Agent]:
    async with connecting as agent:
        yield Defaults(agent.session, str(tenant.agent_id), None)


def test_http_without_a_bearer_token_is_refused(servers: Servers, store: Any) -> None:
    answer = httpx.post(
        servers.mcp_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "UNAUTHORIZED"

    async def unknown() -> str:
        async with http_agent(servers.mcp_url, "ibex_not-a-token") as agent:
            return await agent.error("recall", query="Dana", agent=str(uuid.uuid4()))

    assert run(unknown()).startswith("UNAUTHORIZED")


def test_an_agent_slug_is_resolved_and_an_unknown_one_is_refused(
    connect: Connect, store: Any
) -> None:
    acme = make_tenant(store, "acme")
    token, _ = make_token(store.db, acme.org_id, ["memory:read", "memory:write"])

    async def scenario() -> None:
        async with connect(token, agent="bot") as agent:
            stored = await agent.ok("remember", content="Dana is allergic to peanuts.")
            assert stored["memory"]["agent_id"] == str(acme.agent_id)
            assert (await agent.ok("recall", query="peanuts"))["hits"]
        async with connect(token, agent="bto") as agent:  # a typo: no new agent
            assert (await agent.error("recall", query="Dana")).startswith("UNKNOWN_AGENT")

    run(scenario())
