"""Shared fixtures. Integration tests use real Postgres and Redis, and only their own.

Which servers, and how the run keeps to its own databases on them, is in :mod:`tests.servers`:
a database created for the run (dropped at the end) on the Postgres of
``IBEX_TEST_DATABASE_URL`` (default 127.0.0.1:5432; an embedded one when nothing answers
there), and a private ``redis-server`` unless ``IBEX_TEST_REDIS_URL`` hands one over. The
header of the run names both. A configured server that does not answer skips those tests
locally and fails them when ``CI=true``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
from hypothesis import settings as hypothesis_settings

from tests.servers import RunPostgres, RunRedis, ServerUnavailable, temp_folder

# Every table, children first; TRUNCATE ... CASCADE takes care of the order anyway.
TABLES = (
    "ibex_memory.memory_embeddings",
    "ibex_memory.embedding_models",
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


# Hypothesis budgets. "ci", the default, keeps every run fast; "thorough"
# (`pytest --hypothesis-profile=thorough`, loaded before the tests are collected) is the run
# before a release: every property test gets twenty times its budget.
CI_EXAMPLES = 100
hypothesis_settings.register_profile("ci", max_examples=CI_EXAMPLES, print_blob=True)
hypothesis_settings.register_profile("thorough", max_examples=20 * CI_EXAMPLES, print_blob=True)
hypothesis_settings.load_profile("ci")


def examples(ci_budget: int) -> int:
    """A property test's example budget: ``ci_budget`` under the ci profile, scaled like the
    profile's own budget under any other (for tests whose claim needs more or fewer examples
    than the profile's default)."""
    return max(1, ci_budget * hypothesis_settings().max_examples // CI_EXAMPLES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def _unavailable(what: str, exc: Exception) -> None:
    message = f"{what} unavailable: {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class _Servers:
    """Started on first use, stopped when the run ends."""

    def __init__(self) -> None:
        self.folder = temp_folder()
        self.postgres: RunPostgres | Exception | None = None
        self.redis: RunRedis | Exception | None = None

    def pg(self) -> RunPostgres:
        if self.postgres is None:
            try:
                self.postgres = RunPostgres.find(self.folder)
                self.postgres.sweep()
            except Exception as exc:
                self.postgres = exc
        if isinstance(self.postgres, Exception):
            _unavailable("Postgres", self.postgres)
        assert isinstance(self.postgres, RunPostgres)
        return self.postgres

    def rd(self) -> RunRedis:
        if self.redis is None:
            try:
                self.redis = RunRedis.find(self.folder)
            except (ServerUnavailable, RuntimeError, OSError) as exc:
                self.redis = exc
        if isinstance(self.redis, Exception):
            _unavailable("Redis", self.redis)
        assert isinstance(self.redis, RunRedis)
        return self.redis

    def close(self) -> None:
        for server in (self.postgres, self.redis):
            if server is not None and not isinstance(server, Exception):
                server.close()


_SERVERS = _Servers()


def pytest_report_header(config: pytest.Config) -> list[str]:
    from tests.servers import embedded_name, postgres_choice

    choice = postgres_choice()
    if choice.kind == "configured":
        where = urlparse(choice.url).netloc.rpartition("@")[2] or "local socket"
        pg = f"the server at {where} ({choice.reason}), own databases"
    elif choice.kind == "embedded":
        pg = f"{embedded_name()}, {choice.reason}"
    else:
        pg = choice.reason
    rd = (
        "IBEX_TEST_REDIS_URL (that database is flushed)"
        if os.environ.get("IBEX_TEST_REDIS_URL")
        else "a private redis-server on a free port"
    )
    return [f"test servers: postgres {pg}; redis {rd}"]


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    used = [s.describe() for s in (_SERVERS.postgres, _SERVERS.redis) if hasattr(s, "describe")]
    if used:
        terminalreporter.write_line("test servers used: " + "; ".join(used))


def pytest_unconfigure(config: pytest.Config) -> None:
    _SERVERS.close()


@pytest.fixture(scope="session")
def postgres_server() -> RunPostgres:
    """The run's Postgres server: create and drop databases of the run on it."""
    return _SERVERS.pg()


@pytest.fixture(scope="session")
def database_url(postgres_server: RunPostgres) -> str:
    """A freshly migrated database of this run."""
    from core.migrate import migrate

    url = postgres_server.create()
    migrate(url)
    return url


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
    from sessions.store import SessionStore

    return SessionStore(db)


@pytest.fixture(scope="session")
def redis_server_url() -> str:
    """The run's Redis, not flushed: for settings that name a Redis they never use."""
    return _SERVERS.rd().url


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The run's Redis database, emptied before the test."""
    server = _SERVERS.rd()
    server.flush()
    yield server.url
