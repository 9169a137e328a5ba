"""Shared fixtures. Integration tests use the real Postgres and Redis.

``IBEX_TEST_DATABASE_URL`` (default: the ``ibex_test`` database on 127.0.0.1:5432) names a
database that is dropped and rebuilt from the migrations once per run; ``IBEX_TEST_REDIS_URL``
(default: Redis db 15 on 127.0.0.1) is flushed before each test that uses it. An unreachable
service skips those tests locally and fails them when ``CI=true``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import urlparse, urlunparse

import psycopg2
import pytest

TEST_DATABASE_URL = os.environ.get(
    "IBEX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/ibex_test"
)
TEST_REDIS_URL = os.environ.get("IBEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

# Every table, children first; TRUNCATE ... CASCADE takes care of the order anyway.
TABLES = (
    "ibex_memory.memories",
    "ibex_memory.api_tokens",
    "ibex_core.dead_letters",
    "ibex_core.extraction_slots",
    "ibex_core.extraction_turns",
    "ibex_core.checkpoint_payloads",
    "ibex_core.checkpoints",
    "ibex_core.sessions",
    "ibex_core.directive_versions",
    "ibex_core.directives",
    "ibex_core.agents",
    "ibex_core.orgs",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def _unavailable(what: str, exc: Exception) -> None:
    message = f"{what} unavailable: {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _admin_url(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    return urlunparse(parsed._replace(path="/postgres")), name


@pytest.fixture(scope="session")
def database_url() -> str:
    """A freshly migrated database for this test run."""
    from core.db import connect_params
    from core.migrate import migrate

    admin, name = _admin_url(TEST_DATABASE_URL)
    try:
        conn = psycopg2.connect(**connect_params(admin))  # type: ignore[arg-type]
    except psycopg2.OperationalError as exc:
        _unavailable("Postgres", exc)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    migrate(TEST_DATABASE_URL)
    return TEST_DATABASE_URL


@pytest.fixture(scope="session")
def session_db(database_url: str):  # type: ignore[no-untyped-def]
    from core.db import make_database
    from models import bind

    db = bind(make_database(database_url))
    yield db
    db.close()


def truncate_all(db) -> None:  # type: ignore[no-untyped-def]
    db.execute_sql(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")


@pytest.fixture
def db(session_db):  # type: ignore[no-untyped-def]
    """The test database, emptied before the test."""
    from models import bind

    bind(session_db)
    truncate_all(session_db)
    return session_db


@pytest.fixture
def store(db):  # type: ignore[no-untyped-def]
    from models.store import SessionStore

    return SessionStore(db)


@pytest.fixture
def redis_url() -> Iterator[str]:
    import redis

    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        _unavailable("Redis", exc)
    yield TEST_REDIS_URL
    client.close()
