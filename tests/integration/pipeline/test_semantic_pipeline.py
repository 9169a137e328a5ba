"""Semantic search through the pipeline: the stages (in-process, delivered at least once by the
harness) against the real memory service (in-process over WSGITransport), the project's fake
LLM and its fake OpenAI-compatible embeddings server (``bench/fake_embeddings.py``, over HTTP),
whose requests are counted.

- one embedding request per extracted turn, the vectors persisted with the result and stored
  with the memories (same statement as the memory);
- a kill after the result is persisted (crash point ``after_persist``) or after a POST
  (``after_post``) and the redelivery: no second embedding request, no second LLM call;
- the embeddings endpoint down during extraction: the turn completes, its memories are stored
  without vectors; search answers lexically with ``details`` (never a 5xx), and once the
  endpoint is back the backfill embeds them and search is semantic again;
- a model change through ``ibex reembed``: the new model's vectors of another dimension are
  stored beside the old ones and a ranking only ever uses the configured model's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from bench.fake_embeddings import FakeEmbeddings
from bench.fake_llm import FakeLLM
from cli.stack.processes import ROOT
from core.config import Settings
from core.errors import ConfigError
from embeddings.remote import OpenAIEmbedder
from extraction.memory_client import MemoryClient
from extraction.providers import OpenAICompatibleProvider
from extraction.stages import Send, StageDeps, extract_turn, scan
from memories.backfill import backfill
from memories.tokens import TokenStore
from memories.vectors import EmbeddingDimensionError, EmbeddingStore
from memory_service.app import create_app, make_web_pool
from schema.messages import ActorName
from sessions.turns import TurnInput
from tests.integration.pipeline.helpers import Crash, Harness, crash_at, pipeline_settings

BASE_URL = "http://memory.test"
DIMENSION = 32
BIN = Path(sys.executable).parent


@pytest.fixture
def embeddings_server() -> Iterator[FakeEmbeddings]:
    with FakeEmbeddings(dimension=DIMENSION) as server:
        yield server


@pytest.fixture
def settings(database_url: str, redis_url: str, embeddings_server: FakeEmbeddings) -> Settings:
    return pipeline_settings(
        database_url,
        redis_url,
        EXTRACTION_CONTEXT_TURNS="0",
        EMBEDDINGS_PROVIDER="openai",
        EMBEDDINGS_BASE_URL=embeddings_server.base_url,
        EMBEDDINGS_MODEL="fake",
        EMBEDDINGS_DIMENSION=str(DIMENSION),
        EMBEDDINGS_TIMEOUT_SECONDS="2",
    )


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(memories=3) as server:
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
    with httpx.Client(
        transport=httpx.WSGITransport(app=app),
        base_url=BASE_URL,
        headers={"Authorization": f"Bearer {token}"},
    ) as client:
        yield client


@pytest.fixture
def deps(
    store: Any,
    settings: Settings,
    app: Any,
    token: str,
    llm: FakeLLM,
    embeddings_server: FakeEmbeddings,
) -> Iterator[StageDeps]:
    memory = MemoryClient(BASE_URL, token, transport=httpx.WSGITransport(app=app))
    provider = OpenAICompatibleProvider(llm.base_url, "fake", timeout=10)
    embedder = OpenAIEmbedder(embeddings_server.base_url, "fake", DIMENSION, timeout_seconds=2)
    yield StageDeps(
        store=store, settings=settings, provider=provider, memory=memory, embedder=embedder
    )
    embedder.close()
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


def vectors(db: Any) -> dict[str, tuple[str, int]]:
    """memory content -> (model, dimension) of each stored vector (owner connection)."""
    rows = db.execute_sql(
        "SELECT m.content, e.model, e.dimension FROM ibex_memory.memory_embeddings e"
        " JOIN ibex_memory.memories m ON m.id = e.memory_id ORDER BY m.content, e.model"
    ).fetchall()
    out: dict[str, tuple[str, int]] = {}
    for content, model, dimension in rows:
        out[f"{content}|{model}"] = (model, dimension)
    return out


def live_memories(db: Any) -> int:
    (n,) = db.execute_sql(
        "SELECT count(*) FROM ibex_memory.memories WHERE deleted_at IS NULL"
    ).fetchone()
    return int(n)


def persisted(db: Any, session_id: uuid.UUID, turn: int = 1) -> dict[str, Any]:
    (result,) = db.execute_sql(
        "SELECT result FROM ibex_core.extraction_turns WHERE session_id = %s AND turn_index = %s",
        (str(session_id), turn),
    ).fetchone()
    return dict(result)


def search(api: httpx.Client, org_id: uuid.UUID, agent_id: uuid.UUID, query: str) -> Any:
    response = api.post(
        "/v1/memories/search",
        json={"agent_id": str(agent_id), "query": query},
        headers={"X-IBEX-Org-ID": str(org_id)},
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_one_embedding_request_per_turn_and_vectors_stored_with_the_memories(
    store: Any, db: Any, deps: StageDeps, llm: FakeLLM, embeddings_server: FakeEmbeddings
) -> None:
    session(store, "a", "I live in Lisbon.", "I have a dog called Rex.")
    session(store, "b", "I like green tea.", "I play the cello.")
    Harness(deps).drain(scan(deps).sent)
    assert sum(llm.calls.values()) == 4
    assert embeddings_server.requests == 4  # one per turn, for its 3 memories
    assert embeddings_server.texts == 12
    assert live_memories(db) == 12
    stored = vectors(db)
    assert len(stored) == 12
    assert set(stored.values()) == {("openai:fake", DIMENSION)}


def test_a_kill_after_persisting_or_posting_never_pays_for_the_vectors_again(
    store: Any, db: Any, deps: StageDeps, llm: FakeLLM, embeddings_server: FakeEmbeddings
) -> None:
    org_id, _, session_id = session(store, "a", "I live in Lisbon.")
    scan(deps)
    deps.fault = crash_at("after_persist")
    with pytest.raises(Crash):
        extract_turn(deps, org_id, session_id, 1)
    deps.fault = None
    result = persisted(db, session_id)
    assert all(m["embedding"]["model"] == "openai:fake" for m in result["memories"])
    assert embeddings_server.requests == 1
    # The redelivery reuses the persisted result with its vectors; a kill after the first
    # POST redelivers that write, which sends the same persisted vector.
    harness = Harness(deps)
    deps.fault = crash_at("after_post")
    message = Send(
        ActorName.EXTRACT,
        {"org_id": str(org_id), "session_id": str(session_id), "turn_index": 1},
    )
    harness.drain([message])
    deps.fault = None
    assert harness.crashes  # the after_post kill happened
    assert embeddings_server.requests == 1
    assert sum(llm.calls.values()) == 1
    assert len(vectors(db)) == 3


def test_an_outage_keeps_the_turn_then_search_is_lexical_then_backfilled(
    store: Any,
    db: Any,
    deps: StageDeps,
    api: httpx.Client,
    embeddings_server: FakeEmbeddings,
) -> None:
    org_id, agent_id, session_id = session(store, "a", "I live in Lisbon.")
    embeddings_server.down = True
    Harness(deps).drain(scan(deps).sent)
    assert live_memories(db) == 3  # the turn completed
    assert all("embedding" not in m for m in persisted(db, session_id)["memories"])
    assert vectors(db) == {}

    # Down: a lexical answer that says why, never a 5xx.
    answer = search(api, org_id, agent_id, "Lisbon")
    assert answer["items"]
    assert all(hit["signals"]["semantic"] is None for hit in answer["items"])
    assert "semantic search unavailable" in answer["details"]["semantic"]
    context = api.post(
        "/v1/context",
        json={"agent_id": str(agent_id), "query": "Lisbon"},
        headers={"X-IBEX-Org-ID": str(org_id)},
    )
    assert context.status_code == 200
    assert "semantic" in context.json()["details"]

    # Back: the backfill embeds what the outage left (one request for the batch).
    embeddings_server.down = False
    embeddings_server.reset()
    embedder = OpenAIEmbedder(embeddings_server.base_url, "fake", DIMENSION)
    report = backfill(EmbeddingStore(db), embedder, org_id)
    embedder.close()
    assert (report.memories, report.embedded, report.requests) == (3, 3, 1)
    assert len(vectors(db)) == 3
    answer = search(api, org_id, agent_id, "Lisbon")
    assert "details" not in answer
    assert all(hit["signals"]["semantic"] is not None for hit in answer["items"])
    # A rerun finds nothing left to do.
    again = OpenAIEmbedder(embeddings_server.base_url, "fake", DIMENSION)
    assert backfill(EmbeddingStore(db), again, org_id).requests == 0
    again.close()


def test_an_api_write_without_a_vector_is_embedded_after_it_is_stored(
    store: Any, db: Any, api: httpx.Client, embeddings_server: FakeEmbeddings
) -> None:
    org_id = store.ensure_org("acme")
    agent_id = store.ensure_agent(org_id, "bot")
    headers = {"X-IBEX-Org-ID": str(org_id)}
    body = {"agent_id": str(agent_id), "content": "The user keeps bees."}
    search = {"agent_id": str(agent_id), "query": "bees"}
    created = api.post("/v1/memories", json=body, headers=headers)
    assert created.status_code == 201
    # After its commit, in a batch: a search through the same service stores it first.
    assert api.post("/v1/memories/search", json=search, headers=headers).status_code == 200
    assert vectors(db) == {"The user keeps bees.|openai:fake": ("openai:fake", DIMENSION)}
    # Down: the write still succeeds at once, without a vector.
    embeddings_server.down = True
    down = api.post(
        "/v1/memories", json={**body, "content": "The user keeps goats."}, headers=headers
    )
    assert down.status_code == 201
    assert api.post("/v1/memories/search", json=search, headers=headers).status_code == 200
    assert len(vectors(db)) == 1


def test_a_model_change_through_reembed_never_mixes_dimensions(
    store: Any,
    db: Any,
    deps: StageDeps,
    settings: Settings,
    database_url: str,
    redis_url: str,
    embeddings_server: FakeEmbeddings,
) -> None:
    org_id, agent_id, _ = session(store, "a", "I live in Lisbon.", "I have a dog called Rex.")
    Harness(deps).drain(scan(deps).sent)
    assert set(vectors(db).values()) == {("openai:fake", DIMENSION)}

    # The same model with another dimension is refused at start and in /readyz.
    wrong = pipeline_settings(
        database_url,
        redis_url,
        EMBEDDINGS_PROVIDER="openai",
        EMBEDDINGS_BASE_URL=embeddings_server.base_url,
        EMBEDDINGS_MODEL="fake",
        EMBEDDINGS_DIMENSION="16",
    )
    with pytest.raises(EmbeddingDimensionError) as refused:
        create_app(wrong, db=db, redis_client=redis.Redis.from_url(redis_url))
    assert isinstance(refused.value, ConfigError)
    assert "16" in str(refused.value) and str(DIMENSION) in str(refused.value)

    # Another model (16 dimensions): `ibex reembed` stores its vectors beside the old ones.
    embeddings_server.dimension = 16
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("EMBEDDINGS_", "IBEX_"))},
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "EMBEDDINGS_PROVIDER": "openai",
        "EMBEDDINGS_BASE_URL": embeddings_server.base_url,
        "EMBEDDINGS_MODEL": "fake-small",
        "EMBEDDINGS_DIMENSION": "16",
    }
    done = subprocess.run(
        [str(BIN / "ibex"), "reembed", "--org", "acme", "--batch-size", "4", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["memories"], summary["embedded"], summary["requests"]) == (6, 6, 2)
    assert "6/6 memories" in done.stderr  # progress, on stderr
    models = sorted(set(vectors(db).values()))
    assert models == [("openai:fake", DIMENSION), ("openai:fake-small", 16)]
    # Rerun: nothing left.
    rerun = subprocess.run(
        [str(BIN / "ibex"), "reembed", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["embedded"] == 0

    # The service on the new model ranks with its vectors only: every hit's semantic signal
    # comes from a 16-dimension vector (a 32-dimension one would not even be a candidate).
    small = pipeline_settings(
        database_url,
        redis_url,
        EMBEDDINGS_PROVIDER="openai",
        EMBEDDINGS_BASE_URL=embeddings_server.base_url,
        EMBEDDINGS_MODEL="fake-small",
        EMBEDDINGS_DIMENSION="16",
    )
    r = redis.Redis.from_url(redis_url)
    pool = make_web_pool(database_url, max_connections=2)
    try:
        app = create_app(small, db=pool, redis_client=r)
        _, token = TokenStore(db).issue(org_id=None, name="reader", scopes=["memory:read"])
        with httpx.Client(
            transport=httpx.WSGITransport(app=app),
            base_url=BASE_URL,
            headers={"Authorization": f"Bearer {token}"},
        ) as client:
            answer = search(client, org_id, agent_id, "where does the user live")
            assert "details" not in answer
            assert answer["items"]
            assert all(hit["signals"]["semantic"] is not None for hit in answer["items"])
            ready = client.get("/readyz").json()
            assert ready["checks"]["embeddings"] == "ok"
            assert ready["details"]["search"].endswith("+semantic")
    finally:
        pool.close_all()
        r.close()


def test_the_scheduler_round_backfills_what_an_outage_left(
    store: Any,
    db: Any,
    api: httpx.Client,
    settings: Settings,
    embeddings_server: FakeEmbeddings,
) -> None:
    import threading
    import time

    from cli.scheduler import backfill_rounds

    org_id = store.ensure_org("acme")
    agent_id = store.ensure_agent(org_id, "bot")
    embeddings_server.down = True
    for content in ("The user keeps bees.", "The user keeps goats."):
        created = api.post(
            "/v1/memories",
            json={"agent_id": str(agent_id), "content": content},
            headers={"X-IBEX-Org-ID": str(org_id)},
        )
        assert created.status_code == 201
    assert vectors(db) == {}
    embeddings_server.down = False
    stop = threading.Event()
    rounds = threading.Thread(target=backfill_rounds, args=(settings, stop), daemon=True)
    rounds.start()
    try:
        deadline = time.monotonic() + 20
        while len(vectors(db)) < 2:
            assert time.monotonic() < deadline, "the backfill round did not embed them"
            time.sleep(0.1)
    finally:
        stop.set()
        rounds.join(timeout=10)
    assert set(vectors(db).values()) == {("openai:fake", DIMENSION)}
