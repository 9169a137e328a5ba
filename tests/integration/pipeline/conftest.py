"""Pipeline fixtures: stage dependencies over the real Postgres, with fake LLM and memory."""

from __future__ import annotations

from typing import Any

import pytest

from core.config import Settings
from extraction.stages import StageDeps
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    pipeline_settings,
)


@pytest.fixture
def settings(database_url: str, redis_server_url: str) -> Settings:
    return pipeline_settings(database_url, redis_server_url)


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(memories=2)


@pytest.fixture
def memory() -> FakeMemoryService:
    return FakeMemoryService()


@pytest.fixture
def deps(store: Any, settings: Settings, provider: FakeProvider, memory: FakeMemoryService):  # type: ignore[no-untyped-def]
    return StageDeps(store=store, settings=settings, provider=provider, memory=memory)


@pytest.fixture
def harness(deps: StageDeps) -> Harness:
    return Harness(deps)
