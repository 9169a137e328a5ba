"""``POST /v1/memories`` with ``user_id`` (MemoryService.create on the real Postgres function and
Redis scripts): the user is part of the memory's scope, and a memory from a session with a
user must carry that user."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from memories.idempotency import IdempotencyStore
from memories.outcomes import Created, DuplicateContent, Invalid
from memories.service import MemoryService
from memories.store import MemoryStore
from memory_service.metrics import Metrics
from tests.integration.memory_service.helpers import Tenant, memory_body, source_session_of


@pytest.fixture
def service(app_db: Any, redis_client: redis.Redis) -> MemoryService:
    idempotency = IdempotencyStore(redis_client, ttl_seconds=600, lease_seconds=30)
    return MemoryService(MemoryStore(app_db), idempotency, Metrics())


def _user_of(db: Any, memory_id: Any) -> Any:
    return db.execute_sql(
        "SELECT user_id FROM ibex_memory.memories WHERE id = %s", (str(memory_id),)
    ).fetchone()[0]


def test_a_memory_carries_its_user_and_is_deduplicated_within_that_scope(
    service: MemoryService, store: Any, acme: Tenant, db: Any
) -> None:
    dana = store.resolve_user(acme.org_id, external_id="dana")
    grace = store.resolve_user(acme.org_id, external_id="grace")
    body = memory_body(acme.agent_id, source=None)
    shared = service.create(acme.org_id, "k0", body)
    danas = service.create(acme.org_id, "k1", {**body, "user_id": str(dana)})
    graces = service.create(acme.org_id, "k2", {**body, "user_id": str(grace)})
    assert isinstance(shared, Created) and isinstance(danas, Created)
    assert isinstance(graces, Created)
    assert [_user_of(db, o.row.id) for o in (shared, danas, graces)] == [None, dana, grace]
    again = service.create(acme.org_id, "k3", {**body, "user_id": str(dana)})
    assert again == DuplicateContent(danas.row.id)
    explicit_none = service.create(acme.org_id, "k4", {**body, "user_id": None})
    assert explicit_none == DuplicateContent(shared.row.id)


def test_a_users_session_refuses_a_memory_of_anyone_else_and_an_unknown_user_is_invalid(
    service: MemoryService, store: Any, acme: Tenant, globex: Tenant, db: Any
) -> None:
    dana = store.resolve_user(acme.org_id, external_id="dana")
    grace = store.resolve_user(acme.org_id, external_id="grace")
    theirs = store.resolve_user(globex.org_id, external_id="dana")
    store.set_session_user(acme.org_id, source_session_of(acme.agent_id), dana)
    body = memory_body(acme.agent_id)
    wrong = {"user_id": ["must be the user of the source session"]}
    assert service.create(acme.org_id, "k1", body) == Invalid(wrong)
    assert service.create(acme.org_id, "k2", {**body, "user_id": str(grace)}) == Invalid(wrong)
    # Another org's user is not this session's user either; without a source, it is unknown.
    assert service.create(acme.org_id, "k3", {**body, "user_id": str(theirs)}) == Invalid(wrong)
    unknown = {"user_id": ["unknown user for this org"]}
    sourceless = {**body, "source": None, "user_id": str(theirs)}
    assert service.create(acme.org_id, "k6", sourceless) == Invalid(unknown)
    assert db.execute_sql("SELECT count(*) FROM ibex_memory.memories").fetchone()[0] == 0
    # None of them consumed its key.
    right = service.create(acme.org_id, "k1", {**body, "user_id": str(dana)})
    assert isinstance(right, Created) and _user_of(db, right.row.id) == dana
    assert service.create(acme.org_id, "k5", {**body, "user_id": "not-a-uuid"}) == Invalid(
        {"user_id": ["Not a valid UUID."]}
    )
