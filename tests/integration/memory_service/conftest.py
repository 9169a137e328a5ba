"""The memory service in-process (httpx WSGITransport) over the real Postgres and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from core.config import Settings
from memory_service.app import create_app, make_web_pool
from tests.integration.memory_service.helpers import BASE_URL, Tenant, make_tenant


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    return Settings.from_env(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "IDEMPOTENCY_LEASE_SECONDS": "30",
            "MEMORY_MAX_BODY_BYTES": "4096",
        }
    )


@pytest.fixture
def app_db(database_url: str) -> Iterator[Any]:
    """The service's own pool (separate from the test's connection), at most 8 connections."""
    pool = make_web_pool(database_url, max_connections=8)
    yield pool
    pool.close_all()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def app(settings: Settings, db: Any, app_db: Any, redis_client: redis.Redis):  # type: ignore[no-untyped-def]
    return create_app(settings, db=app_db, redis_client=redis_client, token_cache_seconds=0.5)


@pytest.fixture
def http(app) -> Iterator[httpx.Client]:  # type: ignore[no-untyped-def]
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as client:
        yield client


@pytest.fixture
def acme(store) -> Tenant:  # type: ignore[no-untyped-def]
    return make_tenant(store, "acme")


@pytest.fixture
def globex(store) -> Tenant:  # type: ignore[no-untyped-def]
    return make_tenant(store, "globex")
