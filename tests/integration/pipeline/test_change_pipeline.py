"""Facts that change, through the pipeline: the stages (in-process, delivered at least once by
the harness) against the real memory service (in-process over WSGITransport) and the
project's fake OpenAI-compatible LLM (``bench/fake_llm.py``, over HTTP), with LLM calls
counted by the fake.

- a changed fact supersedes the old one: the prompt lists the old memory under a ref, the
  answer's ``replaces`` is resolved to its id and persisted, the write sends ``supersedes``;
- a kill after the answer is persisted and before the write: the replay supersedes exactly
  the memory the persisted answer named, not what a new call would name now;
- an unknown ref is dropped and counted;
- 100 sessions opening with the same turn cost one LLM call for it, not 100.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from bench.fake_llm import FakeLLM
from core.config import Settings
from extraction.memory_client import MemoryClient
from extraction.metrics import PipelineMetrics
from extraction.providers import OpenAICompatibleProvider, RulesProvider
from extraction.stages import Send, StageDeps, extract_turn, scan
from extraction.status import collect
from memories.tokens import TokenStore
from memory_service.app import create_app, make_web_pool
from schema.messages import ActorName
from sessions.turns import TurnInput
from tests.integration.pipeline.helpers import Crash, Harness, crash_at, pipeline_settings

BASE_URL = "http://memory.test"


class CountingMetrics(PipelineMetrics):
    def __init__(self) -> None:
        self.repeated = 0
        self.resolved = 0
        self.unknown = 0

    def repeated_turn(self) -> None:
        self.repeated += 1

    def refs(self, *, resolved: int, unknown: int) -> None:
        self.resolved += resolved
        self.unknown += unknown


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    return pipeline_settings(database_url, redis_url, EXTRACTION_CONTEXT_TURNS="0")


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(memories=1, replaces="first") as server:
        yield server


@pytest.fixture
def app(db: Any, settings: Settings, redis_url: str) -> Iterator[Any]:
    pool = make_web_pool(settings.database_url, max_connections=4)
    r = redis.Redis.from_url(redis_url)
    yield create_app(settings, db=pool, redis_client=r, token_cache_seconds=0.5)
    r.close()
    pool.close_all()


@pytest.fixture
def token(db: Any) -> str:
    _, issued = TokenStore(db).issue(
        org_id=None, name="pipeline", scopes=["memory:write", "memory:read"]
    )
    return issued


@pytest.fixture
def api(app: Any, token: str) -> Iterator[httpx.Client]:
    transport = httpx.WSGITransport(app=app)
    with httpx.Client(
        transport=transport, base_url=BASE_URL, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        yield client


@pytest.fixture
def deps(store: Any, settings: Settings, app: Any, token: str, llm: FakeLLM) -> Iterator[StageDeps]:
    memory = MemoryClient(BASE_URL, token, transport=httpx.WSGITransport(app=app))
    provider = OpenAICompatibleProvider(llm.base_url, "fake", timeout=10)
    yield StageDeps(
        store=store, settings=settings, provider=provider, memory=memory, metrics=CountingMetrics()
    )
    provider.close()
    memory.close()


def session(store: Any, external_id: str, *said: str) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    org_id = store.ensure_org("acme")
    agent_id = store.ensure_agent(org_id, "bot")
    created = store.create_session(org_id, agent_id, external_id, status="completed")
    store.append_turns(
        org_id,
        created.id,
        [
            TurnInput(
                messages=[{"role": "user", "content": text}],
                completion={"role": "assistant", "content": "Noted."},
            )
            for text in said
        ],
    )
    return org_id, agent_id, created.id


def memories(db: Any) -> dict[str, tuple[str, str | None]]:
    """content -> (id, superseded_by) of every live memory (owner connection: no RLS)."""
    rows = db.execute_sql(
        "SELECT content, id, superseded_by FROM ibex_memory.memories WHERE deleted_at IS NULL"
    ).fetchall()
    return {c: (str(i), str(s) if s else None) for c, i, s in rows}


def persisted(db: Any, session_id: uuid.UUID, turn: int = 1) -> dict[str, Any]:
    (result,) = db.execute_sql(
        "SELECT result FROM ibex_core.extraction_turns WHERE session_id = %s AND turn_index = %s",
        (str(session_id), turn),
    ).fetchone()
    return dict(result)


def extract_message(org_id: uuid.UUID, session_id: uuid.UUID) -> Send:
    return Send(
        ActorName.EXTRACT, {"org_id": str(org_id), "session_id": str(session_id), "turn_index": 1}
    )


def test_a_changed_fact_supersedes_the_old_one_through_the_pipeline(
    store: Any, db: Any, deps: StageDeps, llm: FakeLLM, api: httpx.Client
) -> None:
    org_id, agent_id, _ = session(store, "march", "I live in Lisbon.")
    Harness(deps).drain(scan(deps).sent)
    lisbon, _ = memories(db)["Fact 1 about: I live in Lisbon."]

    _, _, june = session(store, "june", "I moved to Oslo.")
    Harness(deps).drain(scan(deps).sent)
    stored = memories(db)
    oslo, current = stored["Fact 1 about: I moved to Oslo."]
    assert current is None
    assert stored["Fact 1 about: I live in Lisbon."] == (lisbon, oslo)
    # The decision was persisted with the answer, as an id (never the prompt's local ref).
    assert persisted(db, june)["memories"] == [
        {"content": "Fact 1 about: I moved to Oslo.", "kind": "fact", "supersedes": [lisbon]}
    ]
    assert sum(llm.calls.values()) == 2
    assert deps.metrics.resolved == 1  # type: ignore[attr-defined]

    # Context returns only the current fact; history returns both, oldest first.
    headers = {"X-IBEX-Org-ID": str(org_id)}
    context = api.post(
        "/v1/context",
        json={"agent_id": str(agent_id), "query": "Where does the user live? Lisbon? Oslo?"},
        headers=headers,
    ).json()
    assert [m["id"] for m in context["memories"]] == [oslo]
    history = api.get(f"/v1/memories/{lisbon}/history", headers=headers).json()
    assert [m["id"] for m in history["items"]] == [lisbon, oslo]
    assert history["items"][0]["superseded_by"] == oslo


def test_a_kill_between_persisting_the_answer_and_writing_replays_the_same_supersession(
    store: Any, db: Any, deps: StageDeps, llm: FakeLLM, api: httpx.Client
) -> None:
    org_id, agent_id, _ = session(store, "march", "I live in Lisbon.")
    Harness(deps).drain(scan(deps).sent)
    lisbon, _ = memories(db)["Fact 1 about: I live in Lisbon."]

    _, _, june = session(store, "june", "I moved to Oslo.")
    scan(deps)
    deps.fault = crash_at("after_persist")
    with pytest.raises(Crash):
        extract_turn(deps, org_id, june, 1)
    deps.fault = None
    assert persisted(db, june)["memories"][0]["supersedes"] == [lisbon]

    # Meanwhile another memory of the scope is written: it is now the newest, so a new LLM
    # call would list it first and this fake would replace it instead.
    porto = api.post(
        "/v1/memories",
        json={"agent_id": str(agent_id), "content": "The user has a flat in Porto."},
        headers={"X-IBEX-Org-ID": str(org_id)},
    )
    assert porto.status_code == 201, porto.text

    # The redelivery reuses the persisted answer: no second call, the same supersession.
    Harness(deps).drain([extract_message(org_id, june)])
    assert sum(llm.calls.values()) == 2
    stored = memories(db)
    oslo, _ = stored["Fact 1 about: I moved to Oslo."]
    assert stored["Fact 1 about: I live in Lisbon."] == (lisbon, oslo)
    assert stored["The user has a flat in Porto."] == (porto.json()["id"], None)


def test_an_unknown_ref_is_dropped_and_counted(
    store: Any, db: Any, deps: StageDeps, llm: FakeLLM
) -> None:
    session(store, "march", "I live in Lisbon.")
    Harness(deps).drain(scan(deps).sent)
    llm.configure(replaces="m7")  # a ref the prompt never listed
    _, _, june = session(store, "june", "I moved to Oslo.")
    Harness(deps).drain(scan(deps).sent)
    assert persisted(db, june)["memories"] == [
        {"content": "Fact 1 about: I moved to Oslo.", "kind": "fact"}
    ]
    assert deps.metrics.unknown == 1  # type: ignore[attr-defined]
    assert all(superseded is None for _, superseded in memories(db).values())


def test_a_memory_superseded_meanwhile_is_left_as_it_is(
    store: Any, db: Any, deps: StageDeps, api: httpx.Client
) -> None:
    org_id, agent_id, _ = session(store, "march", "I live in Lisbon.")
    Harness(deps).drain(scan(deps).sent)
    lisbon, _ = memories(db)["Fact 1 about: I live in Lisbon."]
    _, _, june = session(store, "june", "I moved to Oslo.")
    scan(deps)
    deps.fault = crash_at("after_persist")
    with pytest.raises(Crash):
        extract_turn(deps, org_id, june, 1)
    deps.fault = None
    # Before the write, the application supersedes Lisbon itself.
    bergen = api.post(
        "/v1/memories",
        json={
            "agent_id": str(agent_id),
            "content": "The user lives in Bergen.",
            "supersedes": [lisbon],
        },
        headers={"X-IBEX-Org-ID": str(org_id)},
    )
    assert bergen.status_code == 201, bergen.text
    # The write still succeeds (the pipeline's supersedes skips what is no longer current).
    Harness(deps).drain([extract_message(org_id, june)])
    stored = memories(db)
    assert stored["Fact 1 about: I live in Lisbon."] == (lisbon, bergen.json()["id"])
    assert stored["Fact 1 about: I moved to Oslo."][1] is None
    assert db.execute_sql("SELECT count(*) FROM ibex_core.dead_letters").fetchone()[0] == 0


def test_100_sessions_opening_with_the_same_turn_cost_one_llm_call(
    store: Any, db: Any, deps: StageDeps, llm: FakeLLM
) -> None:
    llm.configure(replaces="", memories=2)
    opening = "Hi, I'm Dana and I'm allergic to peanuts."
    for n in range(100):
        session(store, f"conv-{n}", opening)
    harness = Harness(deps, max_steps=2000)
    harness.drain(scan(deps).sent)
    assert sum(llm.calls.values()) == 1
    assert deps.metrics.repeated == 99  # type: ignore[attr-defined]
    # Every session is done, with the same memories, stored once.
    (done, calls, reused) = db.execute_sql(
        "SELECT count(*) FILTER (WHERE state = 'done'), sum(llm_calls),"
        "       count(*) FILTER (WHERE reused)"
        "  FROM ibex_core.extraction_turns"
    ).fetchone()
    assert (done, calls, reused) == (100, 1, 99)
    # `ibex status` counts them.
    assert collect(db, None, queues=[]).total["turns_reused"] == 99
    assert (
        db.execute_sql(
            "SELECT count(*) FROM ibex_core.sessions WHERE last_extracted_turn = 1"
        ).fetchone()[0]
        == 100
    )
    assert sorted(memories(db)) == [f"Fact {i} about: {opening}" for i in (1, 2)]
    outcomes = db.execute_sql(
        "SELECT outcome, count(*) FROM ibex_core.extraction_slots GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert outcomes == [("created", 2), ("duplicate_content", 198)]
    # A second turn that differs is its own input: one more call.
    org_id = store.ensure_org("acme")
    first = store.find_session(org_id, store.ensure_agent(org_id, "bot"), "conv-0")
    store.append_turns(
        org_id,
        first.id,
        [TurnInput(messages=[{"role": "user", "content": "I moved."}], completion={})],
    )
    Harness(deps).drain(scan(deps).sent)
    assert sum(llm.calls.values()) == 2


def test_the_rules_extractor_supersedes_a_moved_users_home(
    store: Any, db: Any, deps: StageDeps
) -> None:
    deps.provider = RulesProvider()
    session(store, "march", "Hi, I'm Dana. I live in Lisbon.")
    Harness(deps).drain(scan(deps).sent)
    session(store, "june", "I moved to Oslo last week, and I started a new job at Globex.")
    Harness(deps).drain(scan(deps).sent)
    stored = memories(db)
    oslo, _ = stored["The user moved to Oslo last week."]
    assert stored["The user lives in Lisbon."][1] == oslo
    assert stored["The user's name is Dana."][1] is None
    assert stored["The user works at Globex."][1] is None
