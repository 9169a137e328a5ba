"""write_memory against the real memory service (in-process over WSGITransport): 409
IDEMPOTENCY_CONFLICT and 409 DUPLICATE_CONTENT are success, a replay is success, and a permanent
4xx is not retried."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from core.config import Settings
from core.errors import MemoryRejectedError
from extraction.stages import StageDeps, extract_turn, memory_body, scan, write_memory
from extraction.values import TurnRef
from memory_service.app import create_app, make_pool
from memory_service.client import MemoryClient
from memory_service.tokens import TokenStore
from tests.integration.pipeline.helpers import (
    FakeProvider,
    Harness,
    key_of,
    make_session,
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
    pool = make_pool(service_settings.database_url, max_connections=4)
    r = redis.Redis.from_url(redis_url)
    app = create_app(service_settings, db=pool, redis_client=r, token_cache_seconds=0.5)
    memory = MemoryClient(BASE_URL, token, transport=httpx.WSGITransport(app=app))
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
    reader = MemoryClient(BASE_URL, token, transport=client._http._transport)
    real_deps.memory = reader
    with pytest.raises(MemoryRejectedError) as rejected:
        write_memory(real_deps, ref.org_id, ref.session_id, 1, 0)
    assert rejected.value.status == 403
    reader.close()
