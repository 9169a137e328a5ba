"""The idempotency records on a Redis of their own (``IDEMPOTENCY_REDIS_URL``), run as a cache.

Each test starts a private ``redis-server`` with a ``maxmemory`` just above what it uses empty,
so that during the test it either evicts records (``allkeys-lru``) or refuses every write with
``OOM command not allowed`` (``noeviction``). Either way every POST keeps its guarantees: one
row per key and per content, a replay answers the first response, another body under a key is a
conflict; the answers come from the Postgres row when Redis has lost or never kept the record.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from core.config import Settings
from memories import idempotency
from memory_service.app import create_app
from tests.integration.memory_service.helpers import (
    BASE_URL,
    Tenant,
    memory_body,
    memory_count,
)
from tests.servers import PrivateRedis

REPLAYED = "Idempotent-Replayed"
POSTS = 120
#: The evicting test writes until Redis has evicted, at most this many POSTs.
MAX_POSTS = 3000


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "cache", appendonly=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cache_client(cache: PrivateRedis) -> Iterator[redis.Redis]:
    client = cache.client()
    yield client
    client.close()


@pytest.fixture
def cache_http(
    database_url: str, redis_url: str, cache: PrivateRedis, app_db: Any
) -> Iterator[httpx.Client]:
    """The service as the web process builds it: its Redis client made from the settings."""
    settings = Settings.from_env(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "IDEMPOTENCY_REDIS_URL": cache.url,
            "IDEMPOTENCY_LEASE_SECONDS": "30",
        }
    )
    app = create_app(settings, db=app_db, token_cache_seconds=0.5)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as client:
        yield client


def cap_memory(client: redis.Redis, policy: str, headroom: int) -> None:
    """``maxmemory`` = what the server uses now + ``headroom`` bytes, under ``policy``."""
    client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + headroom)


def post(http: httpx.Client, tenant_: Tenant, n: int, key: str, content: str | None = None):
    body = memory_body(tenant_.agent_id, content=content or f"fact number {n}")
    return http.post("/v1/memories", json=body, headers=tenant_.headers(key=key))


def test_records_go_to_idempotency_redis_url_and_not_to_the_broker(
    cache_http: httpx.Client, acme: Tenant, cache_client: redis.Redis, redis_client, db
) -> None:
    assert post(cache_http, acme, 1, "k").status_code == 201
    assert len(cache_client.keys("ibex:idem:*")) == 1
    assert redis_client.keys("ibex:idem:*") == []
    replay = post(cache_http, acme, 1, "k")
    assert (replay.status_code, replay.headers[REPLAYED]) == (201, "true")
    assert memory_count(db) == 1


def test_an_evicting_cache_loses_records_but_no_guarantee(
    cache_http: httpx.Client, acme: Tenant, cache_client: redis.Redis, db, monkeypatch
) -> None:
    """Crash point: none; the cache evicts records (allkeys-lru) while POSTs run.

    Redis may still refuse a write now and then (OOM when eviction cannot free enough at once:
    client buffers count against ``maxmemory`` too, and the headroom here is a few KB). The
    guarantees hold either way; the back-off that follows a refusal is switched off, so that
    one refusal costs one request its record instead of keeping every later request of the
    test (they all run within the back-off) from using Redis at all.
    """
    monkeypatch.setattr(idempotency, "REDIS_BACKOFF_SECONDS", 0.0)
    keys = [f"evict-{uuid.uuid4()}"]
    first = {keys[0]: post(cache_http, acme, 0, keys[0])}  # the service's connection is open
    # Room for about 400 records. Client buffers count against maxmemory and grow and shrink
    # by tens of KB (a query buffer is 16-32 KB while a client sends): with less room than
    # that, a growing buffer leaves nothing to evict, Redis refuses every write for a while
    # and no record survives to be replayed. The room actually left still varies by a few
    # hundred records, so the test writes until Redis has evicted.
    cap_memory(cache_client, "allkeys-lru", headroom=400 * 200)
    while len(keys) < POSTS or int(cache_client.info("stats")["evicted_keys"]) == 0:
        assert len(keys) < MAX_POSTS, "Redis never evicted"
        n, key = len(keys), f"evict-{uuid.uuid4()}"
        response = post(cache_http, acme, n, key)
        assert response.status_code == 201, response.text
        keys.append(key)
        first[key] = response
    assert len(cache_client.keys("ibex:idem:*")) < len(keys)  # evicted records are gone
    # Newest first: the records that survived are the latest ones, and every new record this
    # loop makes (the duplicates' keys) evicts the least recently used, so replaying oldest
    # first would leave the survivors' fate to the LRU's sampling.
    for n, key in reversed(list(enumerate(keys))):
        replay = post(cache_http, acme, n, key)
        assert (replay.status_code, replay.headers.get(REPLAYED)) == (201, "true")
        assert replay.content == first[key].content
        conflict = post(cache_http, acme, n, key, content=f"another fact {n}")
        assert conflict.status_code == 409
        assert conflict.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"
        duplicate = post(cache_http, acme, n, f"other-{key}")
        assert duplicate.json()["error"] == {
            "code": "DUPLICATE_CONTENT",
            "message": duplicate.json()["error"]["message"],
            "existing_id": first[key].json()["id"],
        }
    assert memory_count(db) == len(keys)
    metrics = cache_http.get("/metrics").text
    # Some replays were decided by a record that survived, others by the row alone.
    assert sample(metrics, 'ibex_memory_idempotent_replays_total{source="redis"}') > 0
    assert sample(metrics, 'ibex_memory_idempotent_replays_total{source="postgres"}') > 0


def sample(metrics: str, name: str) -> float:
    (line,) = [line for line in metrics.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])


def test_a_cache_out_of_memory_runs_posts_on_the_postgres_keys(
    cache_http: httpx.Client, acme: Tenant, cache_client: redis.Redis, db, monkeypatch
) -> None:
    """Crash point: none; the cache refuses every write with OOM (noeviction at maxmemory)."""
    monkeypatch.setattr(idempotency, "REDIS_BACKOFF_SECONDS", 0.0)  # every POST asks Redis
    cap_memory(cache_client, "noeviction", headroom=-1)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        cache_client.set("probe", "x")
    for n in range(20):
        key = f"oom-{n}"
        created = post(cache_http, acme, n, key)
        assert created.status_code == 201, created.text
        replay = post(cache_http, acme, n, key)
        assert (replay.status_code, replay.headers[REPLAYED]) == (201, "true")
        assert replay.content == created.content
        conflict = post(cache_http, acme, n, key, content=f"another fact {n}")
        assert (conflict.status_code, conflict.json()["error"]["code"]) == (
            409,
            "IDEMPOTENCY_CONFLICT",
        )
        assert conflict.json()["error"]["existing_id"] == created.json()["id"]
    assert cache_client.keys("ibex:idem:*") == []
    assert memory_count(db) == 20
    unavailable = cache_http.get("/metrics").text
    assert "ibex_memory_idempotency_unavailable_total 60.0" in unavailable
