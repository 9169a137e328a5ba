"""The queue of memories embedded after their commit (memories.pending_vectors), with a fake
embedder and a fake vector store: batches, flushes, failures, the bound, and the stop."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from core.errors import DatabaseUnavailableError, EmbeddingsUnavailable
from memories.pending_vectors import PendingVectors
from memory_service.metrics import Metrics

ORG_A, ORG_B = uuid.uuid4(), uuid.uuid4()


class FakeEmbedder:
    model = "fake:model"
    dimension = 3

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail: Exception | None = None
        self.gate = threading.Event()
        self.gate.set()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        assert self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        return [[float(len(t)), 1.0, 0.0] for t in texts]


class FakeDb:
    def __init__(self) -> None:
        self.before_close_all: list[Any] = []


class FakeVectors:
    def __init__(self) -> None:
        self.db = FakeDb()
        self.puts: list[tuple[uuid.UUID, str, int, list[uuid.UUID]]] = []
        self.fail: Exception | None = None
        self.released = 0

    def put(self, org_id: uuid.UUID, model: str, dimension: int, rows: Sequence[Any]) -> int:
        if self.fail is not None:
            raise self.fail
        self.puts.append((org_id, model, dimension, [memory_id for memory_id, _ in rows]))
        return len(rows)

    def release(self) -> None:
        self.released += 1


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def vectors() -> FakeVectors:
    return FakeVectors()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def queue(embedder: FakeEmbedder, vectors: FakeVectors, metrics: Metrics) -> Iterator[Any]:
    # A long linger: a batch is taken only when full or when a flush asks for it.
    pending = PendingVectors(embedder, vectors, metrics, linger_seconds=30, batch_size=8)  # type: ignore[arg-type]
    yield pending
    pending.close(timeout=5)


def failed(metrics: Metrics) -> float:
    return metrics.embeddings_failed._value.get()  # type: ignore[no-any-return]


def test_the_writes_of_a_moment_are_embedded_in_one_call_and_stored_in_one_put_per_org(
    queue: PendingVectors, embedder: FakeEmbedder, vectors: FakeVectors
) -> None:
    a = [uuid.uuid4() for _ in range(3)]
    b = [uuid.uuid4() for _ in range(2)]
    for memory_id in a:
        assert queue.add(ORG_A, memory_id, f"a {memory_id}")
    for memory_id in b:
        assert queue.add(ORG_B, memory_id, f"b {memory_id}")
    # The linger (30 s) is not over: the flush takes the batch at once.
    assert queue.flush(timeout=5)
    assert len(embedder.calls) == 1 and len(embedder.calls[0]) == 5
    assert sorted((org, ids) for org, _, _, ids in vectors.puts) == sorted([(ORG_A, a), (ORG_B, b)])
    assert all(model == "fake:model" and dim == 3 for _, model, dim, _ in vectors.puts)
    assert vectors.released == 1  # the thread holds no connection between batches


def test_a_full_batch_goes_without_waiting_for_the_linger(
    queue: PendingVectors, embedder: FakeEmbedder, vectors: FakeVectors
) -> None:
    ids = [uuid.uuid4() for _ in range(8)]
    embedder.gate.clear()  # hold the first batch in the embedder
    for memory_id in ids:
        queue.add(ORG_A, memory_id, "text")
    for _ in range(500):
        if embedder.calls:
            break
        threading.Event().wait(0.01)
    assert embedder.calls == [["text"] * 8]
    embedder.gate.set()
    assert queue.flush(timeout=5)
    assert [ids_ for _, _, _, ids_ in vectors.puts] == [ids]


def test_an_outage_leaves_the_batch_lexical_counts_it_and_pauses_the_queue(
    queue: PendingVectors, embedder: FakeEmbedder, vectors: FakeVectors, metrics: Metrics
) -> None:
    embedder.fail = EmbeddingsUnavailable("embeddings endpoint answered 503")
    for _ in range(3):
        assert queue.add(ORG_A, uuid.uuid4(), "text")
    assert queue.flush(timeout=5)
    assert failed(metrics) == 3 and vectors.puts == []
    # Paused: a write meanwhile stays lexical (the backfill embeds it), nothing waits for it.
    assert not queue.add(ORG_A, uuid.uuid4(), "text")
    assert queue.flush(timeout=0.1)


def test_the_database_down_is_an_outage_too(
    queue: PendingVectors, vectors: FakeVectors, metrics: Metrics
) -> None:
    vectors.fail = DatabaseUnavailableError("database unavailable")
    queue.add(ORG_A, uuid.uuid4(), "text")
    assert queue.flush(timeout=5)
    assert failed(metrics) == 1
    assert not queue.add(ORG_A, uuid.uuid4(), "text")


def test_an_unexpected_error_loses_one_batch_not_the_thread(
    queue: PendingVectors, vectors: FakeVectors, metrics: Metrics
) -> None:
    vectors.fail = RuntimeError("a bug")
    queue.add(ORG_A, uuid.uuid4(), "text")
    assert queue.flush(timeout=5)
    assert failed(metrics) == 1
    vectors.fail = None
    memory_id = uuid.uuid4()
    assert queue.add(ORG_A, memory_id, "text")  # not paused: not an outage
    assert queue.flush(timeout=5)
    assert [ids for _, _, _, ids in vectors.puts] == [[memory_id]]


def test_past_its_capacity_a_write_stays_lexical(
    embedder: FakeEmbedder, vectors: FakeVectors, metrics: Metrics
) -> None:
    queue = PendingVectors(embedder, vectors, metrics, linger_seconds=30, batch_size=64, capacity=2)  # type: ignore[arg-type]
    try:
        embedder.gate.clear()
        assert queue.add(ORG_A, uuid.uuid4(), "one")
        assert queue.add(ORG_A, uuid.uuid4(), "two")
        assert not queue.add(ORG_A, uuid.uuid4(), "three")
        assert failed(metrics) == 1
    finally:
        embedder.gate.set()
        queue.close(timeout=5)
    assert sum(len(ids) for _, _, _, ids in vectors.puts) == 2


def test_close_stores_what_waits_then_refuses_writes(
    embedder: FakeEmbedder, vectors: FakeVectors, metrics: Metrics
) -> None:
    queue = PendingVectors(embedder, vectors, metrics, linger_seconds=30)  # type: ignore[arg-type]
    memory_id = uuid.uuid4()
    queue.add(ORG_A, memory_id, "text")
    queue.close(timeout=5)
    assert [ids for _, _, _, ids in vectors.puts] == [[memory_id]]
    assert not queue.add(ORG_A, uuid.uuid4(), "text")
    assert queue._thread is not None and not queue._thread.is_alive()


def test_closing_its_pool_stores_what_waits_first(
    queue: PendingVectors, vectors: FakeVectors
) -> None:
    """The pool's close_all (a test's, at its end) runs the queue's flush before it closes
    the connections, so no batch opens one after."""
    memory_id = uuid.uuid4()
    queue.add(ORG_A, memory_id, "text")
    assert vectors.db.before_close_all == [queue.flush]
    for hook in vectors.db.before_close_all:
        hook()
    assert [ids for _, _, _, ids in vectors.puts] == [[memory_id]]


def test_a_flush_with_nothing_queued_returns_at_once(queue: PendingVectors) -> None:
    assert queue.flush(timeout=0)
    assert queue._thread is None  # no thread until the first write
