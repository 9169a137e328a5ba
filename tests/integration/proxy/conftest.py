"""The chat path over real servers: the fake upstream (bench.fake_llm), the proxy under uvicorn
in a thread, the test Postgres and Redis, and the record actor on a RedisBroker worker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dramatiq
import pytest
import redis
import uvicorn

from bench.fake_llm import FakeLLM
from cli.stack.processes import free_port
from core.config import Settings
from extraction.stages import StageDeps
from memory_service.app import make_web_pool
from proxy.app import ChatProxy, create_app
from tests.integration.memory_service.helpers import make_token
from tests.integration.pipeline.helpers import pipeline_settings

REPLY = "Noted: you like green tea."


@dataclass
class ProxyServer:
    url: str
    proxy: ChatProxy
    loop: asyncio.AbstractEventLoop

    def settle(self) -> None:
        """Wait until the spool writes of finished calls are done."""
        asyncio.run_coroutine_threadsafe(self.proxy.settle(), self.loop).result(10)


@contextmanager
def serve(app: Any, proxy: ChatProxy) -> Iterator[ProxyServer]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the proxy did not start"
        time.sleep(0.02)
    try:
        yield ProxyServer(f"http://127.0.0.1:{port}", proxy, loop)
    finally:
        server.should_exit = True
        thread.join(10)
        loop.close()


@contextmanager
def redis_worker(deps: StageDeps, redis_url: str) -> Iterator[dramatiq.Broker]:
    """The real actors on a RedisBroker over the test Redis, with a Worker running."""
    import actors  # noqa: F401 - declares the actors
    from actors.broker import current_broker, make_broker, use_broker
    from actors.middleware import install_deps

    previous = current_broker()
    client = redis.Redis.from_url(redis_url)
    broker = make_broker(deps.settings, client=client)
    use_broker(broker)
    install_deps(deps)
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        yield broker
    finally:
        worker.stop()
        install_deps(None)
        use_broker(previous)
        broker.close()
        client.close()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def upstream() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=0, reply=REPLY, stream_chunks=4) as llm:
        yield llm


@pytest.fixture
def proxy_settings(database_url: str, redis_url: str, upstream: FakeLLM) -> Settings:
    return Settings.from_env(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "UPSTREAM_LLM_BASE_URL": upstream.base_url,
            "RETRY_MIN_BACKOFF_MS": "100",
            "RETRY_MAX_BACKOFF_MS": "500",
        }
    )


@pytest.fixture
def proxy_db(database_url: str) -> Iterator[Any]:
    pool = make_web_pool(database_url, max_connections=8)
    yield pool
    pool.close_all()


@pytest.fixture
def proxy_server(proxy_settings: Settings, proxy_db: Any, db: Any) -> Iterator[ProxyServer]:
    app, proxy = create_app(proxy_settings, db=proxy_db, token_cache_seconds=0)
    with serve(app, proxy) as server:
        yield server


@pytest.fixture
def worker(store: Any, database_url: str, redis_url: str) -> Iterator[dramatiq.Broker]:
    settings = pipeline_settings(
        database_url,
        redis_url,
        RETRY_MIN_BACKOFF_MS="100",
        RETRY_MAX_BACKOFF_MS="500",
        MAX_RETRIES="50",
    )
    deps = StageDeps(store=store, settings=settings)
    with redis_worker(deps, redis_url) as broker:
        yield broker


@dataclass(frozen=True)
class Org:
    org_id: Any
    token: str  # sessions:write + memory:read


@pytest.fixture
def acme(store: Any, db: Any) -> Org:
    org_id = store.ensure_org("acme")
    # The chat path records only for an agent the org has (an unknown one is 404).
    for agent in ("support-bot", "bot"):
        store.ensure_agent(org_id, agent)
    token, _ = make_token(db, org_id, ["sessions:write", "memory:read"])
    return Org(org_id, token)
