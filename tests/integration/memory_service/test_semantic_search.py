"""Semantic search in the memory service, with the default local embedder (the packaged
model) over the real Postgres: the fallback (exact cosine, real[]) on a server without
pgvector, the HNSW index on one with it (IBEX_TEST_SERVERS=embedded).

- a question that shares no word with its answer finds it (signals.semantic), and a
  lexical question ranks its memories exactly as the words alone do;
- the user scope, kinds and include_superseded hold on the semantic branch too;
- the embedder down or slow: a lexical answer with details, never a 5xx;
- on pgvector, the semantic branch reads the HNSW index.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
import redis

from bench.fake_embeddings import FakeEmbeddings
from core.errors import EmbeddingsUnavailable
from embeddings.remote import OpenAIEmbedder
from memory_service.app import create_app
from schema.search import ContextResultSchema, SearchResultSchema
from tests.integration.memory_service.helpers import BASE_URL, Tenant

MEMORIES = [
    "Dana is allergic to peanuts.",
    "The user drives a blue bicycle to work.",
    "Marcus plays the cello.",
    "The user has a dog called Rex.",
    "The user lives in Lisbon.",
    "The user prefers tea over coffee.",
]


def write(http: httpx.Client, tenant_: Tenant, content: str, **extra: Any) -> str:
    body = {"agent_id": str(tenant_.agent_id), "content": content, **extra}
    response = http.post("/v1/memories", json=body, headers=tenant_.headers(tenant_.writer))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def search(http: httpx.Client, tenant_: Tenant, query: str, **extra: Any) -> dict[str, Any]:
    body = {"agent_id": str(tenant_.agent_id), "query": query, **extra}
    response = http.post("/v1/memories/search", json=body, headers=tenant_.headers(tenant_.reader))
    assert response.status_code == 200, response.text
    SearchResultSchema().load(response.json())
    answer: dict[str, Any] = response.json()
    return answer


@pytest.fixture
def lexical_http(settings: Any, app_db: Any, redis_client: redis.Redis) -> Iterator[httpx.Client]:
    """The same service and database with no embedder: today's ranking."""
    app = create_app(settings, db=app_db, redis_client=redis_client, embedder=None)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as client:
        yield client


def test_a_question_sharing_no_word_with_its_answer_finds_it(
    http: httpx.Client, acme: Tenant, lexical_http: httpx.Client
) -> None:
    ids = {content: write(http, acme, content) for content in MEMORIES}
    question = "what musical instrument?"
    assert search(lexical_http, acme, question)["items"] == []  # the words alone: nothing
    hits = search(http, acme, question)["items"]
    assert [h["id"] for h in hits][:1] == [ids["Marcus plays the cello."]]
    top = hits[0]
    assert top["signals"]["text"] == 0
    assert 0.3 <= top["signals"]["semantic"] <= 1
    assert 0 < top["score"] <= 1
    # Unrelated memories do not enter on meaning alone.
    assert ids["The user drives a blue bicycle to work."] not in [h["id"] for h in hits]


@pytest.mark.parametrize("query", ["Dana peanuts", "cello", "Lisbon", "tea or coffee", "dog Rex"])
def test_a_lexical_question_ranks_as_the_words_alone(
    http: httpx.Client, acme: Tenant, lexical_http: httpx.Client, query: str
) -> None:
    for content in MEMORIES:
        write(http, acme, content)
    fused = search(http, acme, query)["items"]
    plain = search(lexical_http, acme, query)["items"]
    assert plain, query
    assert [h["id"] for h in fused][: len(plain)] == [h["id"] for h in plain]
    assert all(h["signals"]["semantic"] is None for h in plain)
    assert all(h["signals"]["semantic"] is not None for h in fused)


def test_scope_kinds_and_supersession_hold_on_the_semantic_branch(
    http: httpx.Client, acme: Tenant, globex: Tenant
) -> None:
    dana = write(http, acme, "Dana is allergic to peanuts.", user="dana")
    write(http, acme, "Sam is allergic to peanuts.", user="sam")
    write(http, globex, "Dana is allergic to peanuts.")
    question = "which nuts make her sick?"
    as_dana = [h["id"] for h in search(http, acme, question, user="dana")["items"]]
    assert as_dana == [dana]  # not Sam's, not another org's
    assert search(http, acme, question, user="dana", kinds=["event"])["items"] == []
    newer = write(
        http, acme, "Dana is no longer allergic to peanuts.", user="dana", supersedes=[dana]
    )
    current = [h["id"] for h in search(http, acme, question, user="dana")["items"]]
    assert current == [newer]
    everything = search(http, acme, question, user="dana", include_superseded=True)["items"]
    assert {h["id"] for h in everything} == {dana, newer}


class Down:
    model = "local:wordllama-l2_supercat-256"
    dimension = 256

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise EmbeddingsUnavailable("embeddings endpoint answered 503 (http://down.test)")


def test_the_embedder_down_or_slow_is_a_lexical_answer_with_details(
    http: httpx.Client, settings: Any, app_db: Any, redis_client: redis.Redis, acme: Tenant
) -> None:
    cello = write(http, acme, "Marcus plays the cello.")
    slow_server = FakeEmbeddings(dimension=256, latency_ms=1500).start()
    slow = OpenAIEmbedder(slow_server.base_url, "fake", 256, timeout_seconds=0.5)
    try:
        for embedder in (Down(), slow):
            app = create_app(settings, db=app_db, redis_client=redis_client, embedder=embedder)
            with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as c:
                answer = search(c, acme, "cello")
                assert [h["id"] for h in answer["items"]] == [cello]
                assert answer["items"][0]["signals"]["semantic"] is None
                assert answer["details"]["semantic"].startswith("semantic search unavailable")
                context = c.post(
                    "/v1/context",
                    json={"agent_id": str(acme.agent_id), "query": "cello"},
                    headers=acme.headers(acme.reader),
                )
                assert context.status_code == 200
                ContextResultSchema().load(context.json())
                assert "semantic" in context.json()["details"]
                # A write while the embedder is out still succeeds at once.
                created = c.post(
                    "/v1/memories",
                    json={"agent_id": str(acme.agent_id), "content": f"Note {uuid.uuid4()}"},
                    headers=acme.headers(acme.writer),
                )
                assert created.status_code == 201
    finally:
        slow.close()
        slow_server.stop()


def test_on_pgvector_the_semantic_branch_reads_the_hnsw_index(
    http: httpx.Client, acme: Tenant, db: Any
) -> None:
    (has_vector,) = db.execute_sql("SELECT to_regtype('vector') IS NOT NULL").fetchone()
    if not has_vector:
        pytest.skip("pgvector is not installed on this server: the exact fallback serves")
    for content in MEMORIES:
        write(http, acme, content)
    (index,) = db.execute_sql(
        "SELECT to_regclass('ibex_memory.idx_memory_embeddings_hnsw_256') IS NOT NULL"
    ).fetchone()
    assert index
    (vector,) = db.execute_sql(
        "SELECT embedding::text FROM ibex_memory.memory_embeddings LIMIT 1"
    ).fetchone()
    # The index serves the nearest-first order (with few rows the planner may prefer the
    # scope's btree and a sort; on a large scope it takes the HNSW index).
    with db.atomic():
        db.execute_sql("SET LOCAL enable_seqscan = off")
        db.execute_sql("SET LOCAL hnsw.iterative_scan = relaxed_order")
        plan = "\n".join(
            r[0]
            for r in db.execute_sql(
                "EXPLAIN SELECT m.memory_id FROM ibex_memory.memory_embeddings m"
                " WHERE m.dimension = 256"
                " ORDER BY m.embedding::vector(256) <=> %s::real[]::vector(256) LIMIT 50",
                (vector,),
            ).fetchall()
        )
    assert "idx_memory_embeddings_hnsw_256" in plan, plan
    hits = search(http, acme, "which nuts make her sick?")["items"]
    assert hits and hits[0]["content"] == "Dana is allergic to peanuts."


def test_with_the_local_model_a_write_stores_its_vector_with_the_row(
    http: httpx.Client, acme: Tenant, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process model embeds before the insert: the vector is in the same statement, so
    the after-commit store (a second statement and commit) is never called."""
    from memories.vectors import EmbeddingStore

    calls: list[Any] = []
    monkeypatch.setattr(EmbeddingStore, "put", lambda self, *a, **k: calls.append(a) or 1)
    memory_id = write(http, acme, "The user keeps bees on the roof.")
    rows = db.execute_sql(
        "SELECT model, dimension FROM ibex_memory.memory_embeddings WHERE memory_id = %s",
        (memory_id,),
    ).fetchall()
    assert rows == [("local:wordllama-l2_supercat-256", 256)]
    assert calls == []


class Gated:
    """A remote embedder that answers only once :attr:`opened` is set."""

    def __init__(self, inner: OpenAIEmbedder) -> None:
        self.inner = inner
        self.model, self.dimension = inner.model, inner.dimension
        self.opened = threading.Event()
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        assert self.opened.wait(10), "the test never opened the embedder"
        return self.inner.embed(texts)


def test_a_remote_embedder_never_delays_a_write_and_embeds_the_writes_of_a_moment_at_once(
    settings: Any, app_db: Any, redis_client: redis.Redis, acme: Tenant, db: Any
) -> None:
    """With an embeddings endpoint, a write's 201 comes before its vector: the memories
    written meanwhile are embedded in one request after their commit, and a search through the
    same service stores what waits before it reads (found by meaning at once)."""
    with FakeEmbeddings(dimension=256) as server:
        gated = Gated(OpenAIEmbedder(server.base_url, "fake", 256))
        app = create_app(settings, db=app_db, redis_client=redis_client, embedder=gated)
        with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as c:
            # The embedder does not answer: every write is stored and answered all the same.
            ids = [write(c, acme, content) for content in MEMORIES]
            (stored,) = db.execute_sql(
                "SELECT count(*) FROM ibex_memory.memory_embeddings"
                " WHERE memory_id = ANY(%s::uuid[])",
                (ids,),
            ).fetchone()
            assert stored == 0
            gated.opened.set()
            hits = search(c, acme, MEMORIES[2])["items"]
        gated.inner.close()
    assert hits and hits[0]["id"] == ids[2]
    assert hits[0]["signals"]["semantic"] is not None
    rows = db.execute_sql(
        "SELECT memory_id::text, model FROM ibex_memory.memory_embeddings"
        " WHERE memory_id = ANY(%s::uuid[])",
        (ids,),
    ).fetchall()
    assert sorted(rows) == sorted((i, "openai:fake") for i in ids)
    # The first write's batch waits at the closed endpoint; the five after it queue behind it
    # and go in one request: two requests for six writes, then the query's own.
    *writes, query = gated.calls
    assert query == [MEMORIES[2]]
    assert sorted(text for call in writes for text in call) == sorted(MEMORIES)
    assert len(writes) <= 2, gated.calls
    assert server.requests == len(gated.calls)
