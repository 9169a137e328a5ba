"""write_memory against the real memory service (in-process over WSGITransport): 409
IDEMPOTENCY_CONFLICT and 409 DUPLICATE_CONTENT are success, a replay is success, and a permanent
4xx is not retried."""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from core.config import Settings
from core.errors import LLMUnavailableError, MemoryRejectedError, MemoryUnavailableError
from extraction.memory_client import MemoryClient
from extraction.stages import StageDeps, extract_turn, memory_body, scan, write_memory
from extraction.values import TurnRef
from memories.tokens import TokenStore
from memory_service.app import create_app, make_web_pool
from schema.messages import ActorName
from tests.integration.pipeline.helpers import (
    FakeProvider,
    Harness,
    crash_at,
    key_of,
    make_session,
    once_each,
    pipeline_settings,
    pointer_of,
    turn_rows,
)

BASE_URL = "http://memory.test"


@pytest.fixture
def service_settings(database_url: str, redis_url: str) -> Settings:
    return pipeline_settings(database_url, redis_url)


@pytest.fixture
def client(db: Any, service_settings: Settings, redis_url: str) -> Iterator[MemoryClient]:
    _, token = TokenStore(db).issue(
        org_id=None, name="pipeline", scopes=["memory:write", "memory:read"]
    )
    pool = make_web_pool(service_settings.database_url, max_connections=4)
    r = redis.Redis.from_url(redis_url)
    app = create_app(service_settings, db=pool, redis_client=r, token_cache_seconds=0.5)
    memory = MemoryClient(BASE_URL, token, transport=httpx.WSGITransport(app=app))
    # The app the client talks to, for a test that needs a second client of it.
    memory.test_app = app  # type: ignore[attr-defined]
    yield memory
    memory.close()
    r.close()
    pool.close_all()


@pytest.fixture
def real_deps(store: Any, service_settings: Settings, client: MemoryClient) -> StageDeps:
    return StageDeps(
        store=store, settings=service_settings, provider=FakeProvider(memories=2), memory=client
    )


def memories(db: Any, session_id: Any) -> list[tuple[int, int, str]]:
    rows = db.execute_sql(
        "SELECT turn_index, ordinal, content FROM ibex_memory.memories"
        " WHERE session_id = %s ORDER BY turn_index, ordinal",
        (str(session_id),),
    ).fetchall()
    return [(int(t), int(o), str(c)) for t, o, c in rows]


def test_the_pipeline_writes_every_memory_once_through_the_real_service(
    store: Any, db: Any, real_deps: StageDeps
) -> None:
    ref = make_session(store, 3)
    Harness(real_deps).drain(scan(real_deps).sent)
    assert len(memories(db, ref.session_id)) == 6
    assert pointer_of(db, ref.session_id) == 3
    # Every slot written again as if never recorded (state rolled back to "extracted", slots
    # forgotten): the service answers each POST with its stored response, no new rows.
    db.execute_sql("DELETE FROM ibex_core.extraction_slots")
    db.execute_sql("UPDATE ibex_core.extraction_turns SET state = 'extracted'")
    for t in range(1, 4):
        for o in range(2):
            write_memory(real_deps, ref.org_id, ref.session_id, t, o)
    assert len(memories(db, ref.session_id)) == 6
    outcomes = db.execute_sql("SELECT DISTINCT outcome FROM ibex_core.extraction_slots").fetchall()
    assert {r[0] for r in outcomes} == {"replayed"}


def test_409_idempotency_conflict_is_success(
    store: Any, db: Any, real_deps: StageDeps, client: MemoryClient
) -> None:
    ref = make_session(store, 1)
    [message] = scan(real_deps).sent
    extract_turn(real_deps, ref.org_id, ref.session_id, 1)
    # Another wording was committed under this slot's key (an earlier, differently worded run).
    view = real_deps.turns.load_slot(TurnRef(ref.org_id, ref.session_id, 1), 0)
    assert view.result is not None
    body = memory_body(view.agent_id, TurnRef(ref.org_id, ref.session_id, 1), 0, view.result)
    first = client.create_memory(
        ref.org_id, {**body, "content": "An earlier wording of the same memory."}, key_of(ref, 1, 0)
    )
    assert first.status == 201
    write_memory(real_deps, ref.org_id, ref.session_id, 1, 0)
    follow = write_memory(real_deps, ref.org_id, ref.session_id, 1, 1)
    Harness(real_deps).drain(follow)
    slots = db.execute_sql(
        "SELECT ordinal, outcome FROM ibex_core.extraction_slots ORDER BY ordinal"
    ).fetchall()
    assert [(int(o), str(x)) for o, x in slots] == [(0, "idempotency_conflict"), (1, "created")]
    assert len(memories(db, ref.session_id)) == 2  # the first wording kept, nothing added
    assert pointer_of(db, ref.session_id) == 1
    assert message.kwargs["turn_index"] == 1


def test_409_duplicate_content_is_success(
    store: Any, db: Any, real_deps: StageDeps, client: MemoryClient
) -> None:
    ref = make_session(store, 1)
    scan(real_deps)
    extract_turn(real_deps, ref.org_id, ref.session_id, 1)
    view = real_deps.turns.load_slot(TurnRef(ref.org_id, ref.session_id, 1), 1)
    assert view.result is not None
    body = memory_body(view.agent_id, TurnRef(ref.org_id, ref.session_id, 1), 1, view.result)
    # The same content already stored for this agent under some other key.
    client.create_memory(ref.org_id, body, "11111111-2222-4333-8444-555555555555")
    follow = write_memory(real_deps, ref.org_id, ref.session_id, 1, 1)
    follow += write_memory(real_deps, ref.org_id, ref.session_id, 1, 0)
    Harness(real_deps).drain(follow)
    outcome = db.execute_sql(
        "SELECT outcome FROM ibex_core.extraction_slots WHERE ordinal = 1"
    ).fetchone()[0]
    assert outcome == "duplicate_content"
    assert turn_rows(db, ref.session_id)[1]["state"] == "done"
    assert pointer_of(db, ref.session_id) == 1


def test_a_permanent_4xx_is_raised_as_permanent(
    store: Any, db: Any, real_deps: StageDeps, client: MemoryClient
) -> None:
    ref = make_session(store, 1)
    scan(real_deps)
    extract_turn(real_deps, ref.org_id, ref.session_id, 1)
    # A token without memory:write: the service answers 403, which no retry can fix.
    _, token = TokenStore(db).issue(org_id=None, name="reader", scopes=["memory:read"])
    reader = MemoryClient(BASE_URL, token, transport=httpx.WSGITransport(app=client.test_app))  # type: ignore[attr-defined]
    real_deps.memory = reader
    with pytest.raises(MemoryRejectedError) as rejected:
        write_memory(real_deps, ref.org_id, ref.session_id, 1, 0)
    assert rejected.value.status == 403
    reader.close()


def documented_key(org_id: Any, session_id: Any, turn_index: int, ordinal: int) -> str:
    """The idempotency key as the architecture documents it, computed here on purpose (not
    with extraction.keys): a changed formula in the code fails the test below."""
    key_material = f"{org_id}:{session_id}:{turn_index}:{ordinal}"
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, hashlib.sha256(key_material.encode()).hexdigest()))


class LosesFirstResponses:
    """The real client, except that the first response for each key is lost after the service
    committed the row (a connection reset on the way back): the write must be retried."""

    def __init__(self, inner: MemoryClient) -> None:
        self.inner = inner
        self.lost: set[str] = set()

    def create_memory(self, org_id: Any, body: Any, idempotency_key: str) -> Any:
        outcome = self.inner.create_memory(org_id, body, idempotency_key)
        if idempotency_key not in self.lost:
            self.lost.add(idempotency_key)
            raise MemoryUnavailableError("connection reset after the commit")
        return outcome


def test_retries_and_redeliveries_leave_one_row_per_slot_under_the_documented_key(
    store: Any, db: Any, real_deps: StageDeps, client: MemoryClient
) -> None:
    sessions = [make_session(store, 3, org="acme"), make_session(store, 2, org="globex")]
    provider = FakeProvider(memories=2, reword=True)
    # The first LLM call of one turn fails; its retry (worded differently) is what is stored.
    provider.fail(sessions[0].session_id, 2, LLMUnavailableError("503 from the LLM"))
    real_deps.provider = provider
    real_deps.memory = LosesFirstResponses(client)
    real_deps.fault = crash_at("after_post", times=4)
    harness = Harness(real_deps)
    # Every write and every pointer step is delivered twice (ack lost after its follow-ups).
    harness.drain(
        scan(real_deps).sent,
        lose_ack=once_each(lambda m: m.actor_name in (ActorName.WRITE, ActorName.POINTER)),
    )
    assert len(harness.crashes) == 4
    assert provider.calls[(sessions[0].session_id, 2)] == 2
    real_deps.fault = None
    # Then every slot is written once more as if never recorded (a replay from scratch).
    db.execute_sql("DELETE FROM ibex_core.extraction_slots")
    db.execute_sql("UPDATE ibex_core.extraction_turns SET state = 'extracted'")
    for ref in sessions:
        for t in range(1, ref.turns + 1):
            for o in range(2):
                write_memory(real_deps, ref.org_id, ref.session_id, t, o)

    rows = db.execute_sql(
        "SELECT org_id, session_id, turn_index, ordinal, idempotency_key FROM ibex_memory.memories"
    ).fetchall()
    per_slot = Counter((str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows)
    expected = {
        (str(ref.org_id), str(ref.session_id), t, o)
        for ref in sessions
        for t in range(1, ref.turns + 1)
        for o in range(2)
    }
    assert set(per_slot) == expected
    assert all(n == 1 for n in per_slot.values()), per_slot
    for org_id, session_id, turn_index, ordinal, key in rows:
        assert key == documented_key(org_id, session_id, turn_index, ordinal)
    for ref in sessions:
        assert pointer_of(db, ref.session_id) == ref.turns
