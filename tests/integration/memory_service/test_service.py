"""MemoryService.create on the real Postgres function and the real Redis scripts, no HTTP."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis

from memories.idempotency import IdempotencyStore
from memories.outcomes import Created, DuplicateContent, Invalid, Replayed
from memories.service import MemoryService
from memories.store import MemoryStore
from memory_service.metrics import Metrics
from tests.integration.memory_service.helpers import Tenant, memory_body, memory_count


@pytest.fixture
def service(app_db: Any, redis_client: redis.Redis) -> MemoryService:
    idempotency = IdempotencyStore(redis_client, ttl_seconds=600, lease_seconds=30)
    return MemoryService(MemoryStore(app_db), idempotency, Metrics())


def test_a_key_whose_record_redis_lost_replays_from_the_row(
    service: MemoryService, redis_client: redis.Redis, acme: Tenant, db: Any
) -> None:
    body = memory_body(acme.agent_id)
    created = service.create(acme.org_id, "k1", body)
    assert isinstance(created, Created)
    from_redis = service.create(acme.org_id, "k1", body)
    assert isinstance(from_redis, Replayed) and from_redis.source == "redis"
    # Crash point: Redis loses every record (FLUSHALL, failover) between the two requests.
    redis_client.flushall()
    from_row = service.create(acme.org_id, "k1", body)
    assert isinstance(from_row, Replayed) and from_row.source == "postgres"
    assert from_row.response().body == from_redis.response().body == created.response().body
    duplicate = service.create(acme.org_id, "k2", body)
    assert duplicate == DuplicateContent(created.row.id)
    assert memory_count(db, acme.org_id) == 1


def test_another_orgs_agent_and_an_unknown_session_are_invalid_and_write_nothing(
    service: MemoryService, acme: Tenant, globex: Tenant, db: Any
) -> None:
    theirs = service.create(acme.org_id, "k1", memory_body(globex.agent_id))
    assert theirs == Invalid({"agent_id": ["unknown agent for this org"]})
    stray_source = {"session_id": str(uuid.uuid4()), "turn_index": 1, "ordinal": 0}
    no_session = service.create(acme.org_id, "k2", memory_body(acme.agent_id, source=stray_source))
    assert no_session == Invalid({"source": {"session_id": ["unknown session for this org"]}})
    assert json.loads(no_session.response().body)["error"]["code"] == "VALIDATION_FAILED"
    assert memory_count(db) == 0
    # Neither consumed its key.
    assert isinstance(service.create(acme.org_id, "k1", memory_body(acme.agent_id)), Created)
