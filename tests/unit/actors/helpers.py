"""A StubBroker + Worker running the real actors, and a drain that follows every queue."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name

from actors.broker import Queue, current_broker, make_broker, use_broker
from actors.middleware import install_deps
from core.config import Settings


@contextmanager
def stub_worker(settings: Settings, deps: Any, *, threads: int = 4) -> Iterator[StubBroker]:
    """The actors on a fresh StubBroker with the pipeline middleware, ``deps`` installed, and a
    Worker running; everything restored afterwards."""
    import actors  # noqa: F401 - declares the actors on the module broker

    previous = current_broker()
    stub = make_broker(settings, stub=True)
    assert isinstance(stub, StubBroker)
    use_broker(stub)
    install_deps(deps)
    worker = dramatiq.Worker(stub, worker_timeout=20, worker_threads=threads)
    worker.start()
    try:
        yield stub
    finally:
        worker.stop()
        install_deps(None)
        use_broker(previous)


def drain(stub: StubBroker, *, timeout: float = 20.0) -> None:
    """Wait until every queue (and its delay queue) is empty and nothing is in flight."""
    deadline = time.monotonic() + timeout
    names = [q.value for q in Queue]
    while True:
        for name in names:
            stub.join(
                name, fail_fast=False, timeout=int(max(0.1, deadline - time.monotonic()) * 1000)
            )
        idle = all(
            stub.queues[n].unfinished_tasks == 0 and stub.queues[dq_name(n)].unfinished_tasks == 0
            for n in names
        )
        if idle:
            return
        assert time.monotonic() < deadline, "the queues did not drain"


def dead_letters(stub: StubBroker) -> list[Any]:
    return list(stub.dead_letters)
