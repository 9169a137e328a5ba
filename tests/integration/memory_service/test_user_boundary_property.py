"""The user boundary under every order of events: a property over random interleavings.

A hypothesis state machine drives one org through random steps: open a session with or without
a user (by an org token or a user-bound one, external ids drawn from a small pool so that they
collide), give an agent-wide session its user late, append a turn, extract (the stages inline,
writing through the memory service, vectors included), supersede a memory, forget a user,
delete a session or a memory. After every step every read path is asked by every kind of
token, and no answer may hold a memory of another person:

- read paths: ``GET /v1/memories``, ``GET /v1/memories/{id}`` and ``.../history`` of every
  memory the org has, ``POST /v1/memories/search`` (a question that shares words with the
  memories, and one that shares none, so the semantic branch brings candidates of its own),
  ``POST /v1/context``, the chat path's injected block, and MCP ``recall`` and ``context``;
- tokens: an org token naming no user (agent-wide memories only), the org token naming each
  user, a token bound to each user (that user's and the agent-wide memories), and a
  ``memory:admin`` token reading every user's (which may see anything of its org).

Whose a memory is, is read from the database itself (``memories.user_id``) at the moment of
the read; texts (the injected block, MCP context) are mapped back to memories by their
content, which is unique per memory here.

The web process is the Procfile's ``web`` line (gunicorn) with the local embedder, so search
and context fuse the semantic signal, as in production; extraction runs the worker's stage
functions in this process (``ibex extract``'s inline drain) with the rules extractor.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cli.stack.processes import ROOT, Launcher, free_port
from memories.tokens import TokenStore
from tests.conftest import examples
from tests.integration.mcp_tools.conftest import process_env

pytestmark = [pytest.mark.slow]

USERS = ("alice", "bob")
EXTERNAL_IDS = ("conv-1", "conv-2", "conv-3")
#: Words no memory holds: the question the semantic branch answers alone.
UNRELATED_QUESTION = "what should I avoid eating at dinner?"
ORG_SCOPES = [
    "memory:read",
    "memory:write",
    "sessions:read",
    "sessions:write",
    "users:delete",
]
#: One word per turn, so every memory's content is unique.
ALLERGENS = [
    *("shellfish", "peanuts", "walnuts", "sesame", "mustard", "celery", "lupin", "kiwi"),
    *("mango", "latex", "penicillin", "pollen", "soy", "gluten", "dairy", "eggs", "oats"),
    *("quinoa", "lentils", "cashews", "almonds", "pecans", "hazelnuts", "pistachios"),
]


@pytest.fixture
def web(tmp_path: Path, database_url: str, redis_url: str) -> Iterator[str]:
    port = free_port()
    env = process_env(database_url, redis_url, port, EMBEDDINGS_PROVIDER="local")
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("web", env, bind_host="127.0.0.1")
        url = f"http://127.0.0.1:{port}"
        launcher.wait_http(f"{url}/healthz", timeout=30)
        yield url


class Boundary(RuleBasedStateMachine):
    """One org per example (its own slug), so examples share the servers and nothing else."""

    sessions = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        env = CONTEXT
        self.url: str = env["url"]
        self.db: Any = env["db"]
        self.store: Any = env["store"]
        self.database_url: str = env["database_url"]
        self.redis_url: str = env["redis_url"]
        self.http = httpx.Client(base_url=self.url, timeout=30)
        self.words = iter(ALLERGENS * 4)
        self.contents: dict[str, str] = {}  # content -> memory id

    # -- setup -------------------------------------------------------------------------

    @initialize(target=sessions)
    def an_org_with_two_people_and_an_agent_wide_conversation(self) -> str:
        """Every example starts with memories drawn from an agent-wide session, so the steps
        that move them (a user given late, a claim) are one step away."""
        self._org()
        session = self.open_session("conv-1", None, False)
        self.append_a_turn(session)
        self.extract(session)
        return session

    def _org(self) -> None:
        slug = f"org-{uuid.uuid4().hex[:10]}"
        tokens = TokenStore(self.db)
        self.org_id = tokens.ensure_org(slug)
        self.agent = "assistant"
        self.agent_id = self.store.ensure_agent(self.org_id, self.agent)
        self.org_token = tokens.issue(org_id=self.org_id, name="org", scopes=ORG_SCOPES)[1]
        self.admin = tokens.issue(
            org_id=self.org_id, name="admin", scopes=["memory:read", "memory:admin"]
        )[1]
        self.user_ids = {u: self.store.resolve_user(self.org_id, external_id=u) for u in USERS}
        self.bound = {
            u: tokens.issue(org_id=self.org_id, name=u, scopes=ORG_SCOPES, user_id=i)[1]
            for u, i in self.user_ids.items()
        }
        self.forgotten: set[str] = set()
        self.service_token = tokens.issue(org_id=None, name="worker", scopes=["memory:write"])[1]

    def teardown(self) -> None:
        self.http.close()

    def _headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    # -- steps -------------------------------------------------------------------------

    @rule(
        target=sessions,
        external_id=st.sampled_from(EXTERNAL_IDS),
        user=st.sampled_from((None, *USERS)),
        by_bound=st.booleans(),
    )
    def open_session(self, external_id: str, user: str | None, by_bound: bool) -> str:
        body: dict[str, Any] = {"agent_id": str(self.agent_id), "external_id": external_id}
        if user is not None and by_bound and user not in self.forgotten:
            token = self.bound[user]
        else:
            token = self.org_token
            if user is not None:
                body["user"] = user
        answer = self.http.post("/v1/sessions", json=body, headers=self._headers(token))
        assert answer.status_code in (200, 201, 401, 409), answer.text
        if answer.status_code in (401, 409):  # a forgotten user's token, a deleted session
            return ""
        return str(answer.json()["id"])

    @rule(session=sessions, user=st.sampled_from(USERS))
    def give_a_user_late(self, session: str, user: str) -> None:
        got = self.http.get(f"/v1/sessions/{session}", headers=self._headers(self.org_token))
        if not session or got.status_code != 200 or got.json()["user_id"] is not None:
            return
        body = {
            "agent_id": str(self.agent_id),
            "external_id": got.json()["external_id"],
            "user": user,
        }
        answer = self.http.post("/v1/sessions", json=body, headers=self._headers(self.org_token))
        assert answer.status_code in (200, 201, 409), answer.text

    @rule(session=sessions)
    def append_a_turn(self, session: str) -> None:
        got = self.http.get(f"/v1/sessions/{session}", headers=self._headers(self.org_token))
        if not session or got.status_code != 200:
            return
        word = next(self.words)
        turn = {
            "turn_index": got.json()["turn_count"] + 1,
            "messages": [{"role": "user", "content": f"I am allergic to {word}."}],
            "completion": {"role": "assistant", "content": "Noted."},
        }
        answer = self.http.post(
            f"/v1/sessions/{session}/turns",
            json={"turns": [turn]},
            headers=self._headers(self.org_token),
        )
        assert answer.status_code in (200, 201), answer.text

    @rule(session=sessions)
    def extract(self, session: str) -> None:
        if not session:
            return
        done = self.http.post(
            f"/v1/sessions/{session}/complete", headers=self._headers(self.org_token)
        )
        if done.status_code != 200:
            return
        from cli.extract import InlineReport, drain_inline
        from embeddings import embedder_from_settings
        from extraction.memory_client import MemoryClient
        from extraction.providers import make_provider
        from extraction.stages import StageDeps, scan
        from tests.integration.pipeline.helpers import pipeline_settings

        settings = pipeline_settings(
            self.database_url,
            self.redis_url,
            LLM_PROVIDER="rules",
            EMBEDDINGS_PROVIDER="local",
            MEMORY_SERVICE_URL=self.url,
            MEMORY_SERVICE_TOKEN=self.service_token,
        )
        client = MemoryClient(self.url, self.service_token)
        try:
            deps = StageDeps(
                store=self.store,
                settings=settings,
                provider=make_provider(settings),
                memory=client,
                embedder=embedder_from_settings(settings),
            )
            report = InlineReport()
            drain_inline(deps, scan(deps, session_id=uuid.UUID(session)).sent, report)
        finally:
            client.close()
        assert report.failures == [] or all("Rejected" in f for f in report.failures), report

    @rule(user=st.sampled_from((None, *USERS)), data=st.data())
    def supersede(self, user: str | None, data: st.DataObject) -> None:
        owned = [m for m in self._memories() if m["user"] == user and m["current"]]
        if not owned or (user is not None and user in self.forgotten):
            return
        old = data.draw(st.sampled_from(owned))
        body: dict[str, Any] = {
            "agent_id": str(self.agent_id),
            "content": f"The user is no longer allergic to {next(self.words)}.",
            "supersedes": [old["id"]],
        }
        if user is not None:
            body["user"] = user
        answer = self.http.post("/v1/memories", json=body, headers=self._headers(self.org_token))
        assert answer.status_code in (201, 409), answer.text

    @rule(user=st.sampled_from(USERS))
    def forget_a_user(self, user: str) -> None:
        answer = self.http.delete(f"/v1/users/{user}", headers=self._headers(self.org_token))
        assert answer.status_code in (200, 204, 404), answer.text
        self.forgotten.add(user)

    @rule(session=sessions)
    def delete_a_session(self, session: str) -> None:
        if session:
            self.http.delete(f"/v1/sessions/{session}", headers=self._headers(self.org_token))

    @precondition(lambda self: bool(self._memories()))
    @rule(data=st.data())
    def delete_a_memory(self, data: st.DataObject) -> None:
        memory = data.draw(st.sampled_from(self._memories()))
        params = {"user": memory["user"]} if memory["user"] else {}
        self.http.delete(
            f"/v1/memories/{memory['id']}", params=params, headers=self._headers(self.org_token)
        )

    # -- the property ------------------------------------------------------------------

    def _memories(self) -> list[dict[str, Any]]:
        """Every memory of the org as the database holds it (the truth)."""
        rows = self.db.execute_sql(
            "SELECT m.id, u.external_id, m.content, m.superseded_by IS NULL, m.deleted_at"
            "  FROM ibex_memory.memories m LEFT JOIN ibex_core.users u ON u.id = m.user_id"
            " WHERE m.org_id = %s ORDER BY m.content, m.created_at",
            (str(self.org_id),),
        ).fetchall()
        return [
            {"id": str(r[0]), "user": r[1], "content": r[2], "current": r[3], "deleted": r[4]}
            for r in rows
            if r[4] is None
        ]

    def _readers(self) -> list[tuple[str, str, dict[str, Any], set[str | None]]]:
        """(name, token, the request's user fields, whose memories it may see)."""
        readers: list[tuple[str, str, dict[str, Any], set[str | None]]] = [
            ("org", self.org_token, {}, {None})
        ]
        for user in USERS:
            readers.append((f"org naming {user}", self.org_token, {"user": user}, {None, user}))
            if user not in self.forgotten:
                readers.append((f"bound to {user}", self.bound[user], {}, {None, user}))
        return readers

    @invariant()
    def no_read_returns_another_persons_memory(self) -> None:
        if not hasattr(self, "org_id"):
            return
        owner = {m["id"]: m["user"] for m in self._memories()}
        by_content = {}
        for row in self.db.execute_sql(
            "SELECT m.id, m.content FROM ibex_memory.memories m WHERE m.org_id = %s",
            (str(self.org_id),),
        ).fetchall():
            by_content[row[1]] = str(row[0])
        # Whose each memory is, deleted ones included (a deleted memory must not come back
        # at all: an unknown owner marks it).
        everyone = {
            str(r[0]): (r[1] if r[2] is None else "<deleted>")
            for r in self.db.execute_sql(
                "SELECT m.id, u.external_id, m.deleted_at FROM ibex_memory.memories m"
                " LEFT JOIN ibex_core.users u ON u.id = m.user_id WHERE m.org_id = %s",
                (str(self.org_id),),
            ).fetchall()
        }
        for name, token, who, allowed in self._readers():
            seen = self._read_every_path(token, who, list(owner), by_content)
            for path, ids in seen.items():
                for memory_id in ids:
                    assert everyone.get(memory_id, "<unknown>") in allowed, (
                        f"{name} got {memory_id} ({everyone.get(memory_id)!r}) on {path}"
                    )

    def _read_every_path(
        self, token: str, who: dict[str, Any], ids: list[str], by_content: dict[str, str]
    ) -> dict[str, set[str]]:
        headers = self._headers(token)
        agent = str(self.agent_id)
        params = dict(who)
        seen: dict[str, set[str]] = {}
        listed = self.http.get(
            "/v1/memories",
            params={"agent_id": agent, "include_superseded": "true", **params},
            headers=headers,
        )
        assert listed.status_code == 200, listed.text
        seen["list"] = {m["id"] for m in listed.json()["items"]}
        seen["get"], seen["history"] = set(), set()
        for memory_id in ids:
            one = self.http.get(f"/v1/memories/{memory_id}", params=params, headers=headers)
            assert one.status_code in (200, 404), one.text
            if one.status_code == 200:
                seen["get"].add(one.json()["id"])
            chain = self.http.get(
                f"/v1/memories/{memory_id}/history", params=params, headers=headers
            )
            assert chain.status_code in (200, 404), chain.text
            if chain.status_code == 200:
                seen["history"] |= {m["id"] for m in chain.json()["items"]}
        seen["search"], seen["context"] = set(), set()
        for question in ("what am I allergic to?", UNRELATED_QUESTION):
            body = {"agent_id": agent, "query": question, **who}
            found = self.http.post(
                "/v1/memories/search", json={**body, "limit": 50}, headers=headers
            )
            assert found.status_code == 200, found.text
            seen["search"] |= {m["id"] for m in found.json()["items"]}
            block = self.http.post(
                "/v1/context", json={**body, "max_tokens": 2000}, headers=headers
            )
            assert block.status_code == 200, block.text
            seen["context"] |= {m["id"] for m in block.json()["memories"]}
            seen["context"] |= _in_text(block.json()["context"], by_content)
        seen["injection"] = self._injected(token, who, by_content)
        seen.update(asyncio.run(self._mcp(token, who, by_content)))
        return seen

    def _injected(self, token: str, who: dict[str, Any], by_content: dict[str, str]) -> set[str]:
        """The chat path's block for a question, as the proxy builds it for this token."""
        from core.config import Settings
        from embeddings import QueryCache, embedder_from_settings
        from proxy.injection import Injector

        bound = next((self.user_ids[u] for u, t in self.bound.items() if t == token), None)
        embedder = embedder_from_settings(Settings.from_env({"EMBEDDINGS_PROVIDER": "local"}))
        assert embedder is not None
        injector = Injector(self.db, QueryCache(embedder))
        found: set[str] = set()
        for question in ("what am I allergic to?", UNRELATED_QUESTION):
            block = injector.block(
                self.org_id,
                self.agent,
                [{"role": "user", "content": question}],
                2000,
                who.get("user"),
                bound,
            )
            found |= _in_text(block or "", by_content)
        return found

    async def _mcp(
        self, token: str, who: dict[str, Any], by_content: dict[str, str]
    ) -> dict[str, set[str]]:
        from mcp import Client

        from mcp_server import McpConfig, build_server

        config = McpConfig(url=self.url, token=token, agent=self.agent, user=who.get("user"))
        recalled: set[str] = set()
        packed: set[str] = set()
        async with Client(build_server(config)) as client:
            for question in ("what am I allergic to?", UNRELATED_QUESTION):
                hits = await client.call_tool("recall", {"query": question, "limit": 50})
                assert not hits.is_error, hits
                data = hits.structured_content or json.loads(hits.content[0].text)
                recalled |= {h["memory"]["id"] for h in data["hits"]}
                block = await client.call_tool("context", {"query": question, "max_tokens": 2000})
                assert not block.is_error, block
                data = block.structured_content or json.loads(block.content[0].text)
                packed |= _in_text(data["context"], by_content)
                packed |= {h["memory"]["id"] for h in data["memories"]}
        return {"mcp recall": recalled, "mcp context": packed}


def _in_text(text: str, by_content: dict[str, str]) -> set[str]:
    """The memories whose content is one of the block's lines."""
    lines = {line[2:].strip() for line in text.splitlines() if line.startswith("- ")}
    return {memory_id for content, memory_id in by_content.items() if content in lines}


#: What the state machine reads from the test's fixtures (hypothesis builds the machine).
CONTEXT: dict[str, Any] = {}


@pytest.mark.timeout(900)
def test_no_read_path_returns_another_persons_memory_whatever_the_order_of_events(
    web: str, db: Any, store: Any, database_url: str, redis_url: str
) -> None:
    CONTEXT.update(url=web, db=db, store=store, database_url=database_url, redis_url=redis_url)
    Boundary.TestCase.settings = settings(
        max_examples=examples(12),
        stateful_step_count=8,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        # No shrinking: each example runs real requests and extraction; a failure is reported
        # as found (at most stateful_step_count steps), which reads well enough.
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
    Boundary.TestCase().runTest()
