"""Chaos suite fixtures: the seed, and the real stack torn down whatever happens.

Every test under ``tests/chaos`` is marked ``chaos`` (and ``integration``, ``slow``): it starts
real processes against the test Postgres (``database_url``) and a private Redis.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memory_service.tokens import TokenStore
from tests.chaos.stack import ChaosConfig, ChaosStack

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
def make_stack(
    db: Any, database_url: str, tmp_path: Path
) -> Iterator[Callable[[ChaosConfig], ChaosStack]]:
    """Start a :class:`ChaosStack` with a config; every process is stopped at teardown."""
    stacks: list[ChaosStack] = []
    _, token = TokenStore(db).issue(
        org_id=None, name="chaos", scopes=["memory:read", "memory:write"]
    )

    def make(config: ChaosConfig) -> ChaosStack:
        stack = ChaosStack(database_url, tmp_path / f"stack{len(stacks)}", config, token)
        stacks.append(stack)
        return stack.start()

    try:
        yield make
    finally:
        for stack in stacks:
            stack.stop()
