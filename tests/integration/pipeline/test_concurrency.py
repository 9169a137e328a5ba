"""Concurrent and duplicated deliveries: at-least-once, any order, several threads at once."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import TurnBusyError
from extraction.dispatch import run_message
from extraction.stages import Send, StageDeps, scan, write_memory
from schema.messages import ActorName
from tests.conftest import examples, truncate_all
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    assert_complete,
    assert_pointer_invariant,
    make_session,
    pipeline_settings,
    pointer_of,
    turn_rows,
)


def _run_threads(targets: list[Any]) -> None:
    errors: list[BaseException] = []

    def wrap(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not errors, errors


def test_the_last_two_writes_of_a_turn_finishing_at_once_send_the_pointer_step_once(
    store: Any, db: Any, deps: StageDeps, memory: FakeMemoryService
) -> None:
    ref = make_session(store, 1)
    extracted = scan(deps).sent
    writes = run_message(deps, ActorName.EXTRACT, extracted[0].kwargs)
    assert [m.kwargs["ordinal"] for m in writes] == [0, 1]
    barrier = threading.Barrier(2)
    sent: list[list[Send]] = []

    def write(ordinal: int) -> Any:
        def run() -> None:
            barrier.wait()
            sent.append(write_memory(deps, ref.org_id, ref.session_id, 1, ordinal))
            deps.store.db.close()

        return run

    _run_threads([write(0), write(1)])
    follow = [m for batch in sent for m in batch]
    assert [m.actor_name for m in follow] == ["advance_pointer"]
    Harness(deps).drain(follow)
    assert pointer_of(db, ref.session_id) == 1


def _deliver_concurrently(
    deps: StageDeps, first: list[Send], rng: random.Random, threads: int, db: Any
) -> None:
    """A pool of deliveries taken in random order by ``threads`` threads; every message is
    delivered 1-3 times; the pointer invariant is checked after every delivery."""
    pool: list[Send] = []
    lock = threading.Lock()
    in_flight = [0]
    violations: list[str] = []

    def add(messages: list[Send]) -> None:
        with lock:
            for message in messages:
                pool.extend([message] * rng.randint(1, 3))

    def take() -> Send | None:
        with lock:
            if not pool:
                return None
            in_flight[0] += 1
            return pool.pop(rng.randrange(len(pool)))

    def worker() -> None:
        idle_since = time.monotonic()
        try:
            while True:
                message = take()
                if message is None:
                    with lock:
                        finished = not pool and in_flight[0] == 0
                    if finished or time.monotonic() - idle_since > 20:
                        return
                    time.sleep(0.005)
                    continue
                idle_since = time.monotonic()
                try:
                    add(run_message(deps, message.actor_name, message.kwargs))
                except TurnBusyError:
                    time.sleep(0.02)  # dramatiq.Retry: the same message again, later
                    with lock:
                        pool.append(message)
                try:
                    assert_pointer_invariant(deps.store.db)
                except AssertionError as exc:
                    violations.append(str(exc))
                with lock:
                    in_flight[0] -= 1
        finally:
            deps.store.db.close()

    add(first)
    _run_threads([worker for _ in range(threads)])
    assert not violations, violations
    assert not pool


@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1), threads=st.integers(2, 4))
def test_any_order_any_duplication_across_threads_converges_to_one_memory_per_slot(
    seed: int, threads: int, store: Any, db: Any, database_url: str, redis_server_url: str
) -> None:
    truncate_all(db)
    rng = random.Random(seed)
    provider = FakeProvider(memories=lambda turn: (turn.turn_index * 7 + seed) % 4)
    memory = FakeMemoryService()
    deps = StageDeps(
        store=store,
        settings=pipeline_settings(database_url, redis_server_url),
        provider=provider,
        memory=memory,
    )
    sessions = [
        make_session(store, rng.randint(1, 4), org=rng.choice(["acme", "globex"])) for _ in range(3)
    ]
    _deliver_concurrently(deps, scan(deps).sent, rng, threads, db)
    assert_complete(db, memory, sessions)
    for ref in sessions:
        rows = turn_rows(db, ref.session_id)
        assert all(r["llm_calls"] == 1 for r in rows.values()), rows
    assert all(n == 1 for n in provider.calls.values())
    assert memory.conflicts == 0
