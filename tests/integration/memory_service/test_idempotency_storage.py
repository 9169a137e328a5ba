"""What idempotency costs in Redis, measured with ``MEMORY USAGE`` on the real server.

A record holds only the claim and the replay decision (state, owner, fingerprint, memory id,
answer), under a fixed-size key, so every POST leaves at most :data:`MAX_RECORD_BYTES` for the
idempotency TTL, whatever its body or key length.
"""

from __future__ import annotations

import hashlib
import uuid

import httpx
import redis

from memories.idempotency import IdempotencyStore
from tests.integration.memory_service.helpers import (
    Tenant,
    idempotency_record,
    memory_body,
    memory_count,
)

MAX_RECORD_BYTES = 200


def pipeline_key(tenant_: Tenant, turn_index: int, ordinal: int) -> str:
    """The key the extraction pipeline sends for a memory of a turn."""
    material = f"{tenant_.org_id}:{tenant_.session_id}:{turn_index}:{ordinal}"
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, hashlib.sha256(material.encode()).hexdigest()))


def usage(client: redis.Redis) -> dict[bytes, int]:
    return {key: int(client.memory_usage(key, samples=0)) for key in client.keys("ibex:idem:*")}


def test_every_post_leaves_at_most_200_bytes_of_redis(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db
) -> None:
    long_content = "Dana keeps a long diary. " * 150  # a body of several KB
    bodies = [
        (pipeline_key(acme, turn, 0), memory_body(acme.agent_id, content=f"fact {turn}"))
        for turn in range(30)
    ]
    bodies.append((pipeline_key(acme, 30, 0), memory_body(acme.agent_id, content=long_content)))
    bodies.append(("x" * 255, memory_body(acme.agent_id, content="a fact under a long key")))
    for key, body in bodies:
        response = http.post("/v1/memories", json=body, headers=acme.headers(key=key))
        assert response.status_code == 201, response.text
    # A duplicate under a new key and a conflict are kept by their keys as well.
    duplicate = http.post(
        "/v1/memories", json=bodies[0][1], headers=acme.headers(key=pipeline_key(acme, 99, 0))
    )
    assert duplicate.json()["error"]["code"] == "DUPLICATE_CONTENT"
    sizes = usage(redis_client)
    assert len(sizes) == len(bodies) + 1
    assert max(sizes.values()) <= MAX_RECORD_BYTES, sizes
    assert memory_count(db) == len(bodies)
    # The slim records still answer: a replay of the long body is the first response.
    key, body = bodies[-2]
    first_id = idempotency_record(redis_client, acme.org_id, key)["id"]
    replay = http.post("/v1/memories", json=body, headers=acme.headers(key=key))
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["content"] == long_content
    assert replay.json()["id"] == str(uuid.UUID(bytes=first_id))


def test_a_running_claim_is_within_the_bound_too(acme: Tenant, redis_client: redis.Redis) -> None:
    claims = IdempotencyStore(redis_client, ttl_seconds=86400, lease_seconds=30)
    fingerprint = hashlib.sha256(b"a request").hexdigest()
    assert claims.claim(acme.org_id, pipeline_key(acme, 1, 0), fingerprint).owned
    (size,) = usage(redis_client).values()
    assert size <= MAX_RECORD_BYTES
