"""MemoryService.create without HTTP: each outcome, what the key keeps, and what is counted.

The idempotency records are the real Lua scripts on fakeredis; the memory table is an
in-memory fake of ``ibex_memory.create_memory`` (one row per org and key, one live row per org,
agent and content; unknown org, agent or session refused), so no socket is opened.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import fakeredis
import pytest

from core.errors import DatabaseUnavailableError
from memories.idempotency import (
    ClaimState,
    IdempotencyStore,
    compact_fingerprint,
    record_key,
)
from memories.outcomes import (
    Created,
    DuplicateContent,
    InProgress,
    Invalid,
    KeyConflict,
    Replayed,
    UnknownOrg,
)
from memories.service import CREATE_SCHEMA, MemoryService, new_memory
from memories.store import CreateResult, MemoryRow, NewMemory, WriteOutcome
from memory_service.metrics import Metrics

ORG = uuid.UUID("11111111-1111-4111-8111-111111111111")
AGENT = uuid.UUID("22222222-2222-4222-8222-222222222222")
SESSION = uuid.UUID("33333333-3333-4333-8333-333333333333")
LEASE_SECONDS = 30


class FakeMemories:
    """The memory table as ``ibex_memory.create_memory`` sees it, in memory."""

    def __init__(self) -> None:
        self.rows: list[MemoryRow] = []
        self.orgs = {ORG}
        self.agents = {(ORG, AGENT)}
        self.sessions = {(ORG, SESSION)}
        self.creates = 0
        self.fail_next: Exception | None = None

    def create(self, org_id: uuid.UUID, new: NewMemory) -> CreateResult:
        self.creates += 1
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        if org_id not in self.orgs:
            return CreateResult(WriteOutcome.UNKNOWN_ORG)
        if (org_id, new.agent_id) not in self.agents:
            return CreateResult(WriteOutcome.UNKNOWN_AGENT)
        if new.session_id is not None and (org_id, new.session_id) not in self.sessions:
            return CreateResult(WriteOutcome.UNKNOWN_SESSION)
        mine = [row for row in self.rows if row.org_id == org_id]
        for row in mine:  # the key's row first, as create_memory orders them
            if new.idempotency_key is not None and row.idempotency_key == new.idempotency_key:
                return CreateResult(WriteOutcome.KEY_EXISTS, row)
        for row in mine:
            if row.agent_id == new.agent_id and row.content_hash == new.content_hash:
                return CreateResult(WriteOutcome.CONTENT_EXISTS, row)
        row = MemoryRow(
            id=uuid.uuid4(),
            org_id=org_id,
            agent_id=new.agent_id,
            session_id=new.session_id,
            turn_index=new.turn_index,
            ordinal=new.ordinal,
            content=new.content,
            content_hash=new.content_hash,
            kind=new.kind,
            metadata=new.metadata,
            created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            idempotency_key=new.idempotency_key,
            request_fingerprint=new.fingerprint if new.idempotency_key is not None else None,
        )
        self.rows.append(row)
        return CreateResult(WriteOutcome.CREATED, row)

    def find_by_key(self, org_id: uuid.UUID, idempotency_key: str) -> MemoryRow | None:
        for row in self.rows:
            if row.org_id == org_id and row.idempotency_key == idempotency_key:
                return row
        return None


@pytest.fixture
def redis_server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def redis_client(redis_server: fakeredis.FakeServer) -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(server=redis_server)


@pytest.fixture
def idem(redis_client: fakeredis.FakeRedis) -> IdempotencyStore:
    return IdempotencyStore(redis_client, ttl_seconds=600, lease_seconds=LEASE_SECONDS)


@pytest.fixture
def memories() -> FakeMemories:
    return FakeMemories()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def service(memories: FakeMemories, idem: IdempotencyStore, metrics: Metrics) -> MemoryService:
    return MemoryService(memories, idem, metrics)  # type: ignore[arg-type]


def document(content: str = "Dana is allergic to peanuts.", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": str(AGENT),
        "content": content,
        "kind": "fact",
        "source": {"session_id": str(SESSION), "turn_index": 3, "ordinal": 0},
        "metadata": {},
    }
    body.update(extra)
    return body


def conflicts(metrics: Metrics, code: str) -> float:
    value = metrics.registry.get_sample_value("ibex_memory_conflicts_total", {"code": code})
    return value or 0.0


def replays(metrics: Metrics, source: str) -> float:
    sample = "ibex_memory_idempotent_replays_total"
    return metrics.registry.get_sample_value(sample, {"source": source}) or 0.0


def record(redis_client: fakeredis.FakeRedis, key: str) -> dict[bytes, bytes]:
    """The key's record by field ({} when there is none)."""
    raw = redis_client.get(record_key(ORG, key))
    if raw is None:
        return {}
    fp, state, rest = raw[:16], raw[16:17], raw[17:]
    if state == b"R":
        return {b"fp": fp, b"state": b"running", b"owner": rest}
    return {b"fp": fp, b"state": b"done", b"id": rest[:16], b"status": rest[16:]}


def test_a_new_memory_is_created_and_its_response_kept_by_the_key(
    service: MemoryService, redis_client, metrics: Metrics
) -> None:
    outcome = service.create(ORG, "k1", document())
    assert isinstance(outcome, Created)
    response = outcome.response()
    assert response.status == 201
    assert response.location == f"/v1/memories/{outcome.row.id}"
    assert json.loads(response.body)["id"] == str(outcome.row.id)
    assert dict(response.headers) == {}
    stored = record(redis_client, "k1")
    assert stored[b"state"] == b"done" and stored[b"status"] == b"201"
    assert uuid.UUID(bytes=stored[b"id"]) == outcome.row.id
    assert conflicts(metrics, "DUPLICATE_CONTENT") == replays(metrics, "redis") == 0


def test_the_same_key_and_body_replay_the_stored_response_without_writing(
    service: MemoryService, memories: FakeMemories, metrics: Metrics
) -> None:
    first = service.create(ORG, "k1", document()).response()
    again = service.create(ORG, "k1", document())
    assert isinstance(again, Replayed) and again.source == "redis"
    response = again.response()
    assert (response.status, response.body, response.location) == (
        first.status,
        first.body,
        first.location,
    )
    assert response.headers == {"Idempotent-Replayed": "true"}
    assert memories.creates == 1
    assert replays(metrics, "redis") == 1


def test_the_same_key_with_another_body_is_a_conflict_without_writing(
    service: MemoryService, memories: FakeMemories, metrics: Metrics
) -> None:
    service.create(ORG, "k1", document())
    outcome = service.create(ORG, "k1", document("Dana likes tea."))
    assert outcome == KeyConflict(None)
    response = outcome.response()
    assert response.status == 409
    assert json.loads(response.body)["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert "existing_id" not in json.loads(response.body)["error"]
    assert memories.creates == 1
    assert conflicts(metrics, "IDEMPOTENCY_CONFLICT") == 1


def test_a_key_under_a_live_lease_is_in_progress_with_a_retry_after(
    service: MemoryService, idem: IdempotencyStore, memories: FakeMemories, metrics: Metrics
) -> None:
    # Another request claimed the key with the same body and is still running.
    claim = idem.claim(ORG, "k1", fingerprint_of(document()))
    assert claim.state is ClaimState.CLAIMED
    outcome = service.create(ORG, "k1", document())
    assert outcome == InProgress(LEASE_SECONDS)
    response = outcome.response()
    assert response.status == 409
    assert response.headers == {"Retry-After": str(LEASE_SECONDS)}
    assert json.loads(response.body)["error"]["retry_after"] == LEASE_SECONDS
    assert memories.creates == 0
    assert conflicts(metrics, "IDEMPOTENCY_IN_PROGRESS") == 1


def fingerprint_of(body: dict[str, Any]) -> str:
    return new_memory(CREATE_SCHEMA.load(body), None).fingerprint


def test_the_same_content_under_another_key_is_a_duplicate_the_key_keeps(
    service: MemoryService, memories: FakeMemories, redis_client, metrics: Metrics
) -> None:
    created = service.create(ORG, "k1", document())
    assert isinstance(created, Created)
    outcome = service.create(ORG, "k2", document())
    assert outcome == DuplicateContent(created.row.id)
    body = json.loads(outcome.response().body)
    assert body["error"] == {
        "code": "DUPLICATE_CONTENT",
        "message": "a memory with the same content exists for this agent",
        "existing_id": str(created.row.id),
    }
    assert record(redis_client, "k2")[b"status"] == b"dup"
    assert uuid.UUID(bytes=record(redis_client, "k2")[b"id"]) == created.row.id
    assert conflicts(metrics, "DUPLICATE_CONTENT") == 1
    again = service.create(ORG, "k2", document())  # answered by the record
    assert again == Replayed(outcome, "redis")
    assert again.response().body == outcome.response().body
    assert memories.creates == 2


def test_an_invalid_document_is_refused_before_its_key_is_claimed(
    service: MemoryService, memories: FakeMemories, redis_client
) -> None:
    outcome = service.create(ORG, "k1", document(content=""))
    assert isinstance(outcome, Invalid)
    response = outcome.response()
    assert response.status == 422
    error = json.loads(response.body)["error"]
    assert error["code"] == "VALIDATION_FAILED" and "content" in error["fields"]
    assert memories.creates == 0
    assert record(redis_client, "k1") == {}


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (document(agent_id=str(uuid.uuid4())), {"agent_id": ["unknown agent for this org"]}),
        (
            document(source={"session_id": str(uuid.uuid4()), "turn_index": 1, "ordinal": 0}),
            {"source": {"session_id": ["unknown session for this org"]}},
        ),
    ],
)
def test_an_unknown_agent_or_session_is_a_422_that_frees_the_key(
    service: MemoryService, memories: FakeMemories, redis_client, body, fields
) -> None:
    outcome = service.create(ORG, "k1", body)
    assert outcome == Invalid(fields)
    assert outcome.response().status == 422
    assert record(redis_client, "k1") == {}  # released: the key may be used again
    assert isinstance(service.create(ORG, "k1", document()), Created)


def test_an_unknown_org_is_forbidden_and_frees_the_key(
    service: MemoryService, redis_client
) -> None:
    stray = uuid.uuid4()
    outcome = service.create(stray, "k1", document())
    assert outcome == UnknownOrg()
    assert outcome.response().status == 403
    assert json.loads(outcome.response().body)["error"]["code"] == "FORBIDDEN_ORG"
    assert redis_client.get(record_key(stray, "k1")) is None


def test_after_the_owner_died_having_committed_the_next_owner_replays_the_row(
    service: MemoryService, memories: FakeMemories, redis_client, metrics: Metrics
) -> None:
    # Crash point: the first request committed its row and died before completing the record.
    created = service.create(ORG, "k1", document())
    assert isinstance(created, Created)
    running = compact_fingerprint(fingerprint_of(document())) + b"R" + b"deadbeef"
    redis_client.set(record_key(ORG, "k1"), running, px=30_000)
    assert isinstance(service.create(ORG, "k1", document()), InProgress)  # the lease is live
    redis_client.delete(record_key(ORG, "k1"))  # the lease ended: the record expired with it
    outcome = service.create(ORG, "k1", document())
    assert isinstance(outcome, Replayed) and outcome.source == "postgres"
    assert outcome.response().body == created.response().body
    assert outcome.response().headers == {"Idempotent-Replayed": "true"}
    assert len(memories.rows) == 1  # the write answered with the key's row
    assert record(redis_client, "k1")[b"state"] == b"done"
    assert replays(metrics, "postgres") == 1


def test_a_key_whose_row_holds_another_body_is_a_conflict_naming_it(
    service: MemoryService, redis_client, metrics: Metrics
) -> None:
    created = service.create(ORG, "k1", document())
    assert isinstance(created, Created)
    redis_client.delete(record_key(ORG, "k1"))  # the record is lost (TTL, eviction, flush)
    outcome = service.create(ORG, "k1", document("Dana likes tea."))
    assert outcome == KeyConflict(created.row.id)
    assert json.loads(outcome.response().body)["error"]["existing_id"] == str(created.row.id)
    assert conflicts(metrics, "IDEMPOTENCY_CONFLICT") == 1
    assert record(redis_client, "k1")[b"status"] == b"key"  # the key keeps the conflict


def test_without_redis_the_rows_keys_decide(
    service: MemoryService,
    memories: FakeMemories,
    redis_server: fakeredis.FakeServer,
    metrics: Metrics,
) -> None:
    redis_server.connected = False
    first = service.create(ORG, "k1", document())
    assert isinstance(first, Created)
    again = service.create(ORG, "k1", document())
    assert isinstance(again, Replayed) and again.source == "postgres"
    assert again.response().body == first.response().body
    other = service.create(ORG, "k1", document("Dana likes tea."))
    assert other == KeyConflict(first.row.id)
    assert len(memories.rows) == 1
    unavailable = metrics.registry.get_sample_value("ibex_memory_idempotency_unavailable_total", {})
    assert unavailable == 3


def test_a_write_that_raises_frees_the_key_for_the_retry(
    service: MemoryService, memories: FakeMemories, redis_client
) -> None:
    # Crash point: the database fails during the write, after the key was claimed.
    memories.fail_next = DatabaseUnavailableError("database unavailable")
    with pytest.raises(DatabaseUnavailableError):
        service.create(ORG, "k1", document())
    assert record(redis_client, "k1") == {}
    retry = service.create(ORG, "k1", document())
    assert isinstance(retry, Created)
    assert len(memories.rows) == 1


def test_a_replay_whose_row_is_gone_is_decided_by_a_new_write(
    service: MemoryService, memories: FakeMemories, redis_client
) -> None:
    # The record says "created", but the row was removed since (a purge): the write decides.
    first = service.create(ORG, "k1", document())
    assert isinstance(first, Created)
    memories.rows.clear()
    again = service.create(ORG, "k1", document())
    assert isinstance(again, Created) and again.row.id != first.row.id
    assert memories.creates == 2
    assert record(redis_client, "k1")[b"state"] == b"done"


class RecordingMemories(FakeMemories):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[NewMemory] = []

    def create(self, org_id: uuid.UUID, new: NewMemory) -> CreateResult:
        self.writes.append(new)
        return super().create(org_id, new)


def test_the_local_models_vector_goes_in_with_the_row_as_its_real_text(
    idem: IdempotencyStore, metrics: Metrics
) -> None:
    """A memory written without a vector gets the local model's, made in the request: the
    ``real[]`` text the write sends holds the very values ``embed`` gives (already of length
    1)."""
    import numpy as np

    from embeddings.local import LocalEmbedder
    from memories.vectors import unit_array_literal, vector_literal

    memories = RecordingMemories()
    embedder = LocalEmbedder()
    service = MemoryService(memories, idem, metrics, embedder=embedder)  # type: ignore[arg-type]
    contents = ["Dana is allergic to peanuts.", "She moved to Lisbon in 2019 and loves it."]
    for n, content in enumerate(contents):
        assert isinstance(service.create(ORG, f"k{n}", document(content)), Created)
    first, second = memories.writes
    for new, content in ((first, contents[0]), (second, contents[1])):
        (vector,) = embedder.embed([content])
        assert new.embedding_model == embedder.model
        assert new.embedding == vector_literal(vector)
        assert isinstance(new.embedding, str)
        stored = np.array(new.embedding.strip("{}").split(","), dtype=np.float32)
        assert stored.tolist() == vector
        assert abs(float(np.dot(stored.astype(np.float64), stored)) - 1.0) < 1e-6
    # An array with no direction (a text with no known token) is written without a vector.
    assert unit_array_literal(np.zeros(256, dtype=np.float32)) is None
