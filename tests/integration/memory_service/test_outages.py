"""A server restart between requests: the service's pooled connections are all dead, and the
next requests are served on fresh ones without an error."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from tests.integration.memory_service.helpers import Tenant, memory_body, memory_count
from tests.integration.pipeline.helpers import terminate_backends

APP_NAME = "ibex-memory"  # the service pool's application_name


def fill_pool(app_db: Any, connections: int) -> None:
    """Leave ``connections`` idle connections in the pool (one per thread, then given back)."""
    barrier = threading.Barrier(connections)

    def borrow() -> None:
        app_db.connect()
        app_db.execute_sql("SELECT 1")
        barrier.wait()
        app_db.close()

    threads = [threading.Thread(target=borrow) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), "a thread filling the pool did not finish"


def test_requests_after_every_pooled_backend_was_terminated_succeed(
    http: httpx.Client, acme: Tenant, app_db: Any, db: Any
) -> None:
    # Crash point: between two requests, every backend of the service's pool is terminated
    # (as a restart or failover ends them); each request below meets dead pooled connections.
    first = http.post(
        "/v1/memories", json=memory_body(acme.agent_id, "Dana likes tea."), headers=acme.headers()
    )
    assert first.status_code == 201, first.text
    fill_pool(app_db, 3)

    assert len(terminate_backends(db, APP_NAME)) == 3
    # The token is cached: the write is the request's first statement (the raw write path).
    second = http.post(
        "/v1/memories",
        json=memory_body(acme.agent_id, "Dana lives in Lyon."),
        headers=acme.headers(key="k-2"),
    )
    assert second.status_code == 201, second.text

    assert terminate_backends(db, APP_NAME)
    # A token not used before (not cached): the token lookup transaction goes first.
    listed = http.get("/v1/memories", headers=acme.headers(acme.reader))
    assert listed.status_code == 200, listed.text
    assert {m["content"] for m in listed.json()["items"]} == {
        "Dana likes tea.",
        "Dana lives in Lyon.",
    }

    assert terminate_backends(db, APP_NAME)
    ready = http.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert memory_count(db) == 2
