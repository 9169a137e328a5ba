"""Database outages while a turn is in flight: the answer in hand is never thrown away.

Each test injects the fault deterministically at one crash point of ``extract_turn``, between
the LLM's answer and the commit of its result (``after_llm_call``): the stage's own backend is
terminated there (as a restart or failover ends it), or the persist step finds the database
unavailable for a number of attempts. The end state must be that of a fault-free run with one
LLM call per turn, and the stored result must be the one answer the LLM gave (the provider
rewords every call, so a second call would show). Claims last 120 s here, so a retry that
waited for one would time the test out.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core.config import Settings
from core.db import make_pool
from core.errors import DatabaseUnavailableError, TurnBusyError
from extraction.dispatch import run_message
from extraction.stages import Delivery, Send, StageDeps, scan
from extraction.values import TurnRef
from schema.messages import ActorName
from sessions.store import SessionStore
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    SessionRef,
    assert_complete,
    make_session,
    pipeline_settings,
    terminate_backends,
    turn_rows,
    wait_for,
)

TURNS = 2
MEMORIES = 2
CLAIM_SECONDS = 120


@pytest.fixture
def settings(database_url: str, redis_server_url: str) -> Settings:
    return pipeline_settings(
        database_url, redis_server_url, EXTRACTION_CLAIM_SECONDS=str(CLAIM_SECONDS)
    )


@pytest.fixture
def app_name() -> str:
    return f"ibex-outage-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pool(database_url: str, app_name: str, db: Any) -> Iterator[Any]:
    """The stages' own pooled connections, as a worker process has them."""
    pooled = make_pool(database_url, max_connections=4, application_name=app_name)
    yield pooled
    pooled.close_all()


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(memories=MEMORIES, reword=True)


@pytest.fixture
def deps(pool: Any, settings: Settings, provider: FakeProvider, memory: FakeMemoryService):  # type: ignore[no-untyped-def]
    return StageDeps(store=SessionStore(pool), settings=settings, provider=provider, memory=memory)


def first_answers(ref: SessionRef) -> dict[tuple[str, int, int], str]:
    """The provider's first wording of every slot: what a run with one call per turn stores."""
    return {
        (str(ref.session_id), t, o): (
            f"Session {str(ref.session_id)[:8]} turn {t} fact {o} (wording 1)."
        )
        for t in range(1, ref.turns + 1)
        for o in range(MEMORIES)
    }


def check_one_call_per_turn(
    db: Any, ref: SessionRef, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    assert assert_complete(db, memory, [ref]) == first_answers(ref)
    assert dict(provider.calls) == {(ref.session_id, t): 1 for t in range(1, ref.turns + 1)}
    rows = turn_rows(db, ref.session_id)
    assert [r["llm_calls"] for r in rows.values()] == [1] * ref.turns
    assert memory.conflicts == 0 and memory.duplicates == 0


class FailingPersist:
    """Make ``persist_result`` find the database unavailable for its first ``times`` calls."""

    def __init__(self, deps: StageDeps, times: int) -> None:
        self.real = deps.turns.persist_result
        self.times = times
        self.calls = 0
        deps.turns.persist_result = self  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls <= self.times:
            raise DatabaseUnavailableError("database unavailable: server closed the connection")
        return self.real(*args, **kwargs)


def backend_gone(db: Any, pid: int) -> bool:
    row = db.execute_sql("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
    return not row.fetchone()[0]


def test_a_backend_terminated_before_the_persist_costs_no_llm_call(
    db: Any, deps: StageDeps, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    # Crash point after_llm_call: the stage's own backend is terminated while it holds the
    # answer; its pooled connection is dead when the persist transaction begins.
    ref = make_session(deps.store, TURNS)
    killed: list[int] = []

    def fault(name: str) -> None:
        if name == "after_llm_call":
            pid = deps.store.db.connection().get_backend_pid()
            db.execute_sql("SELECT pg_terminate_backend(%s)", (pid,))
            wait_for(lambda: backend_gone(db, pid), f"backend {pid} to end")
            killed.append(pid)

    deps.fault = fault
    harness = Harness(deps)
    harness.drain(scan(deps).sent, max_retries=0)  # any failed message would raise here
    assert len(killed) == TURNS
    assert deps.store.db.connection().get_backend_pid() not in killed
    check_one_call_per_turn(db, ref, provider, memory)


def test_a_backend_terminated_inside_the_persist_transaction_costs_no_llm_call(
    db: Any, deps: StageDeps, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    # Crash point: inside the persist transaction (one statement, ibex_core.persist_result),
    # before the UPDATE that stores the answer, the stage's backend is terminated: another
    # transaction holds the turn row, so the UPDATE waits, and the backend is ended while it
    # waits. The transaction rolls back; the stage persists the answer again on a fresh
    # connection in the same delivery.
    ref = make_session(deps.store, TURNS)
    real_call = deps.turns._call
    killed: list[int] = []
    errors: list[BaseException] = []

    def hold_and_kill(turn_index: int, pid: int, locked: threading.Event) -> None:
        try:
            with db.atomic():
                db.execute_sql(
                    "SELECT 1 FROM ibex_core.extraction_turns"
                    " WHERE session_id = %s AND turn_index = %s FOR UPDATE",
                    (str(ref.session_id), turn_index),
                )
                locked.set()
                wait_for(lambda: waits_on_lock(db, pid), f"backend {pid} to wait on the row")
                db.execute_sql("SELECT pg_terminate_backend(%s)", (pid,))
                wait_for(lambda: ended(db, pid), f"backend {pid} to end")
                killed.append(pid)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            locked.set()
        finally:
            db.close()

    def call(statement: str, params: Any, **kwargs: Any) -> Any:
        if "persist_result" in statement and len(killed) < TURNS:
            pid = deps.store.db.connection().get_backend_pid()
            locked = threading.Event()
            killer = threading.Thread(target=hold_and_kill, args=(params[2], pid, locked))
            killer.start()
            assert locked.wait(10), "the turn row was never locked"
            try:
                return real_call(statement, params, **kwargs)
            finally:
                killer.join(10)
        return real_call(statement, params, **kwargs)

    deps.turns._call = call  # type: ignore[method-assign]
    Harness(deps).drain(scan(deps).sent, max_retries=0)
    assert not errors, errors
    assert len(killed) == TURNS
    check_one_call_per_turn(db, ref, provider, memory)


def waits_on_lock(db: Any, pid: int) -> bool:
    """Whether backend ``pid`` waits on a lock, seen from inside a transaction (the activity
    snapshot is taken afresh on each call)."""
    db.execute_sql("SELECT pg_stat_clear_snapshot()")
    row = db.execute_sql(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


def ended(db: Any, pid: int) -> bool:
    """:func:`backend_gone`, seen from inside a transaction."""
    db.execute_sql("SELECT pg_stat_clear_snapshot()")
    return backend_gone(db, pid)


def test_the_persist_retries_through_a_short_outage_in_the_same_delivery(
    db: Any, deps: StageDeps, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    # Crash point after_llm_call: the database is unavailable for the next three persist
    # attempts (a restart of a few seconds), then back.
    ref = make_session(deps.store, TURNS)
    failing = FailingPersist(deps, times=3)
    harness = Harness(deps)
    harness.drain(scan(deps).sent, max_retries=0)
    assert failing.calls == 3 + TURNS
    assert len(deps.turns.answers) == 0
    check_one_call_per_turn(db, ref, provider, memory)


def test_an_outage_longer_than_the_retries_keeps_the_answer_for_the_same_messages_retry(
    db: Any, deps: StageDeps, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    # Crash point after_llm_call: the database stays unavailable longer than the stage's
    # bounded persist retries. The delivery fails holding the answer and a claim it cannot
    # release.
    ref = make_session(deps.store, 1)
    (message,) = scan(deps).sent
    deps.persist_retry_seconds = 0.3
    failing = FailingPersist(deps, times=1000)
    first = Delivery(message_id="message-1")
    with pytest.raises(DatabaseUnavailableError):
        run_message(deps, ActorName.EXTRACT, message.kwargs, delivery=first)
    assert failing.calls >= 2  # it did retry before giving up
    assert first.abandoned_claim is not None
    turn = TurnRef(ref.org_id, ref.session_id, 1)
    status = deps.turns.turn_status(turn)
    assert status is not None and status.claim_live and status.memory_count is None
    assert len(deps.turns.answers) == 1

    # The database is back. Another message for the same turn (another message id, no claim
    # carried) must still wait for the live claim: the lock is not weakened.
    failing.times = 0
    with pytest.raises(TurnBusyError) as busy:
        run_message(
            deps, ActorName.EXTRACT, message.kwargs, delivery=Delivery(message_id="message-2")
        )
    assert busy.value.retry_after is not None and busy.value.retry_after > CLAIM_SECONDS - 30

    # The retry of the same message carries the claim it left: taken over at once, and the
    # kept answer is stored without calling the LLM again.
    retry = Delivery(message_id="message-1", abandoned_claim=first.abandoned_claim)
    started = time.monotonic()
    follow = run_message(deps, ActorName.EXTRACT, message.kwargs, delivery=retry)
    assert time.monotonic() - started < 5
    assert [s.actor_name for s in follow] == ["write_memory"] * MEMORIES
    assert len(deps.turns.answers) == 0
    Harness(deps).drain(follow, max_retries=0)
    check_one_call_per_turn(db, ref, provider, memory)
    (row,) = turn_rows(db, ref.session_id).values()
    assert row["attempts"] == 1 and row["last_error"] is None


def test_a_retry_in_another_process_takes_its_claim_over_at_once_and_asks_again(
    db: Any,
    deps: StageDeps,
    settings: Settings,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> None:
    # Crash point after_llm_call with an outage longer than the persist retries; the message's
    # retry runs in another worker process, which does not hold the answer: it takes the claim
    # over at once (no wait for the claim's expiry) and pays the one extra call.
    ref = make_session(deps.store, 1)
    (message,) = scan(deps).sent
    deps.persist_retry_seconds = 0.1
    FailingPersist(deps, times=1000)
    first = Delivery(message_id="message-1")
    with pytest.raises(DatabaseUnavailableError):
        run_message(deps, ActorName.EXTRACT, message.kwargs, delivery=first)

    other = StageDeps(store=deps.store, settings=settings, provider=provider, memory=memory)
    retry = Delivery(message_id="message-1", abandoned_claim=first.abandoned_claim)
    started = time.monotonic()
    follow = run_message(other, ActorName.EXTRACT, message.kwargs, delivery=retry)
    assert time.monotonic() - started < 5
    Harness(other).drain(follow, max_retries=0)
    assert provider.calls[(ref.session_id, 1)] == 2
    contents = assert_complete(db, memory, [ref])
    assert set(contents.values()) == {
        f"Session {str(ref.session_id)[:8]} turn 1 fact {o} (wording 2)." for o in range(MEMORIES)
    }
    (row,) = turn_rows(db, ref.session_id).values()
    assert row["llm_calls"] == 2


def test_every_pooled_backend_terminated_between_stage_calls_is_replaced_without_a_failure(
    db: Any,
    deps: StageDeps,
    app_name: str,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> None:
    # Between any two messages every backend of the stages' pool is terminated, as a server
    # restart does: each stage's first transaction meets a dead pooled connection.
    ref = make_session(deps.store, TURNS)
    queue: list[Send] = list(scan(deps).sent)
    killed: list[int] = []
    while queue:
        killed += terminate_backends(db, app_name)
        message = queue.pop(0)
        queue += run_message(deps, message.actor_name, message.kwargs)  # no failure at all
    assert len(killed) >= 1 + TURNS * (MEMORIES + 1)
    check_one_call_per_turn(db, ref, provider, memory)


def test_a_stalled_attempt_redelivered_under_the_same_message_id_makes_no_second_call(
    db: Any, deps: StageDeps, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    # A worker stalls (SIGSTOP, a GC pause) while its LLM call is in flight, and the broker
    # redelivers the message elsewhere: same message id, but without a claim carried (the
    # stalled attempt has not failed). The redelivery must wait on the live claim; the stalled
    # attempt, when it resumes, stores its answer, and nothing is written twice.
    ref = make_session(deps.store, 1)
    (message,) = scan(deps).sent
    entered, resume = threading.Event(), threading.Event()
    real_extract = provider.extract

    def stalled_extract(turn: Any, context: Any, related: Any = ()) -> Any:
        entered.set()
        assert resume.wait(10)
        return real_extract(turn, context, related)

    provider.extract = stalled_extract  # type: ignore[method-assign]
    stalled: list[list[Send]] = []
    worker = threading.Thread(
        target=lambda: stalled.append(
            run_message(
                deps, ActorName.EXTRACT, message.kwargs, delivery=Delivery(message_id="m-1")
            )
        )
    )
    worker.start()
    assert entered.wait(10)
    with pytest.raises(TurnBusyError):
        run_message(deps, ActorName.EXTRACT, message.kwargs, delivery=Delivery(message_id="m-1"))
    resume.set()
    worker.join(10)
    assert not worker.is_alive(), "the stalled delivery did not finish"
    assert stalled and [s.actor_name for s in stalled[0]] == ["write_memory"] * MEMORIES
    # The redelivery's retry now finds the stored result: it fans out again, harmlessly.
    again = run_message(
        deps, ActorName.EXTRACT, message.kwargs, delivery=Delivery(message_id="m-1")
    )
    assert [s.actor_name for s in again] == ["write_memory"] * MEMORIES
    Harness(deps).drain(stalled[0] + again, max_retries=0)
    check_one_call_per_turn(db, ref, provider, memory)
    assert memory.posts == MEMORIES  # the duplicate writes found their slots recorded


def test_the_persist_retries_stop_before_the_claim_could_expire(
    db: Any,
    pool: Any,
    database_url: str,
    redis_server_url: str,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> None:
    # Crash point after_llm_call with a 1 s claim and the database unavailable for good: the
    # stage stops retrying within the claim (another delivery may take an expired claim and
    # call the LLM), not after PERSIST_RETRY_SECONDS, and keeps the answer.
    short = pipeline_settings(database_url, redis_server_url, EXTRACTION_CLAIM_SECONDS="1")
    deps = StageDeps(store=SessionStore(pool), settings=short, provider=provider, memory=memory)
    make_session(deps.store, 1)
    (message,) = scan(deps).sent
    failing = FailingPersist(deps, times=1000)
    delivery = Delivery(message_id="message-1")
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError):
        run_message(deps, ActorName.EXTRACT, message.kwargs, delivery=delivery)
    assert time.monotonic() - started < 1.5
    assert failing.calls >= 2 and len(deps.turns.answers) == 1
    assert delivery.abandoned_claim is not None
