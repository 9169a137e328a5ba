"""The races each row lock exists for, forced open on every run.

Each test holds one transaction at a named point of the stage functions
(``ibex_core.stage_pause``, migration 000010: between the locking read and the write it
decides), starts a second transaction on the same rows in another thread, and waits on the
observable state (the second backend waiting on a lock in ``pg_stat_activity``, or the second
thread finished) before it lets the first one go. With the lock, the second transaction waits
and the end state is right; with the lock removed, the second one runs through the window and
the end state is wrong, every run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.errors import TurnBusyError
from extraction.dispatch import run_message
from extraction.result import ExtractionResult
from extraction.stages import Send, StageDeps, complete_turn, extract_turn, scan, write_memory
from schema.messages import ActorName
from sessions.turns import TurnRecord
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    SessionRef,
    make_session,
    pipeline_settings,
    pointer_of,
    turn_rows,
    wait_for,
)

TIMEOUT = 10.0
FIRST, SECOND = "race-first", "race-second"


@pytest.fixture
def deps(
    store: Any,
    database_url: str,
    redis_server_url: str,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> StageDeps:
    # A claim that cannot expire within a test however slow the machine: the tests, not the
    # clock, decide when each delivery runs.
    long_claim = pipeline_settings(database_url, redis_server_url, EXTRACTION_CLAIM_SECONDS="60")
    return StageDeps(store=store, settings=long_claim, provider=provider, memory=memory)


def waiting_on_lock(db: Any, pid: int | None) -> bool:
    if pid is None:
        return False
    row = db.execute_sql(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


#: The advisory lock the test holds while the first transaction waits at its point.
PAUSE_LOCK = 0x1BE7_7E57

#: The seam as a race test replaces it: the backend whose session names ``point`` in
#: ``ibex_test.pause_at`` waits there until the test lets go of :data:`PAUSE_LOCK`.
HOLDING_PAUSE = f"""
CREATE OR REPLACE FUNCTION ibex_core.stage_pause(p_point text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_point = current_setting('ibex_test.pause_at', true) THEN
        PERFORM pg_advisory_xact_lock({PAUSE_LOCK});
    END IF;
END
$$
"""


def waiting_at_pause(db: Any, pid: int | None) -> bool:
    if pid is None:
        return False
    row = db.execute_sql(
        "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and tuple(row) == ("Lock", "advisory")


@dataclass
class Race:
    """Run ``first`` until it holds at ``point``, then ``second``; release ``first`` once
    ``second`` waits on a lock or has finished. Every thread is joined and checked, and the
    seam is restored to its no-op."""

    deps: StageDeps
    db: Any
    point: str
    results: dict[str, Any] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    second_done: threading.Event = field(default_factory=threading.Event)
    second_waited_on_lock: bool = False

    def _run(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            db = self.deps.store.db
            if name == FIRST:
                db.execute_sql("SELECT set_config('ibex_test.pause_at', %s, false)", (self.point,))
            self.pids[name] = int(db.execute_sql("SELECT pg_backend_pid()").fetchone()[0])
            self.results[name] = fn()
        except BaseException as exc:  # surfaced by run()
            self.errors.append(exc)
        finally:
            self.deps.store.db.close()  # a connection of its own: the setting ends with it
            if name == SECOND:
                self.second_done.set()

    def run(self, first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
        no_op = self.db.execute_sql(
            "SELECT pg_get_functiondef('ibex_core.stage_pause(text)'::regprocedure)"
        ).fetchone()[0]
        self.db.execute_sql(HOLDING_PAUSE)
        self.db.execute_sql("SELECT pg_advisory_lock(%s)", (PAUSE_LOCK,))
        a = threading.Thread(target=self._run, args=(FIRST, first), name=FIRST)
        b = threading.Thread(target=self._run, args=(SECOND, second), name=SECOND)
        try:
            a.start()
            wait_for(
                lambda: waiting_at_pause(self.db, self.pids.get(FIRST)) or not a.is_alive(),
                f"{FIRST} to reach {self.point}",
                timeout=TIMEOUT,
            )
            assert a.is_alive(), f"{FIRST} never reached {self.point}: {self.errors}"
            b.start()
            wait_for(
                lambda: (
                    self.second_done.is_set() or waiting_on_lock(self.db, self.pids.get(SECOND))
                ),
                "the second transaction to wait on a lock or finish",
                timeout=TIMEOUT,
            )
            self.second_waited_on_lock = not self.second_done.is_set()
        finally:
            self.db.execute_sql("SELECT pg_advisory_unlock(%s)", (PAUSE_LOCK,))
            for t in (a, b):
                if t.ident is not None:
                    t.join(TIMEOUT)
            self.db.execute_sql(no_op)
        assert not a.is_alive() and not b.is_alive(), "a race thread did not finish"
        assert not self.errors, self.errors
        return self.results[FIRST], self.results[SECOND]


def _all_but_the_pointer(deps: StageDeps, store: Any, turns: int) -> SessionRef:
    """A session whose turns are extracted and written, each waiting for advance_pointer."""
    ref = make_session(store, turns)
    pending: list[Send] = []
    queue = list(scan(deps).sent)
    while queue:
        message = queue.pop(0)
        for follow in run_message(deps, message.actor_name, message.kwargs):
            (pending if follow.actor_name == ActorName.POINTER else queue).append(follow)
    assert sorted(m.kwargs["turn_index"] for m in pending) == list(range(1, turns + 1))
    return ref


def test_the_session_lock_serializes_two_turns_completing_at_once(
    store: Any, db: Any, deps: StageDeps
) -> None:
    # Window: turn 1 is marked done and the pointer walk has seen turn 2 not done; its
    # transaction has not committed. Without the session row's lock, turn 2 completes now, its
    # walk cannot see turn 1 done, and the pointer stops at 1 for good.
    ref = _all_but_the_pointer(deps, store, 2)
    race = Race(deps, db, "complete_turn.walked")
    race.run(
        lambda: complete_turn(deps, ref.org_id, ref.session_id, 1),
        lambda: complete_turn(deps, ref.org_id, ref.session_id, 2),
    )
    assert pointer_of(db, ref.session_id) == 2
    assert {t: r["state"] for t, r in turn_rows(db, ref.session_id).items()} == {
        1: "done",
        2: "done",
    }
    assert race.second_waited_on_lock


def test_the_turn_lock_has_exactly_one_of_two_last_writes_send_the_pointer_step(
    store: Any, db: Any, deps: StageDeps
) -> None:
    # Window: the write of slot 0 is inserted and counted (1 of 2), not committed. Without the
    # turn row's lock, the write of slot 1 counts 1 of 2 as well, and no one sends the step
    # that completes the turn.
    ref = make_session(store, 1)
    [extract] = scan(deps).sent
    writes = run_message(deps, ActorName.EXTRACT, extract.kwargs)
    assert [m.kwargs["ordinal"] for m in writes] == [0, 1]
    race = Race(deps, db, "record_slot.counted")
    first, second = race.run(
        lambda: write_memory(deps, ref.org_id, ref.session_id, 1, 0),
        lambda: write_memory(deps, ref.org_id, ref.session_id, 1, 1),
    )
    follow = [*first, *second]
    assert [m.actor_name for m in follow] == [ActorName.POINTER]
    Harness(deps).drain(follow)
    assert pointer_of(db, ref.session_id) == 1
    assert turn_rows(db, ref.session_id)[1]["slots"] == 2
    assert race.second_waited_on_lock


class HeldProvider(FakeProvider):
    """A provider whose calls from one thread wait until ``go`` is set."""

    def __init__(self, held_thread: str, go: threading.Event | None = None) -> None:
        super().__init__(memories=2)
        self.held_thread = held_thread
        self.inside = threading.Event()
        self.go = go if go is not None else threading.Event()

    def extract(self, turn: TurnRecord, context: Any, related: Any = ()) -> ExtractionResult:
        if threading.current_thread().name == self.held_thread:
            self.inside.set()
            assert self.go.wait(TIMEOUT), "the held LLM call was never let go"
        return super().extract(turn, context, related)


def _busy_or_sends(deps: StageDeps, ref: SessionRef) -> list[Send] | str:
    try:
        return extract_turn(deps, ref.org_id, ref.session_id, 1)
    except TurnBusyError:
        return "busy"


def test_a_live_claim_keeps_a_second_delivery_from_calling_the_llm(
    store: Any, db: Any, deps: StageDeps
) -> None:
    # Window: the first delivery holds the claim and is inside its LLM call. A second delivery
    # of the same message (a redelivery, or a second worker) must wait, not call the LLM too.
    ref = make_session(store, 1)
    scan(deps)
    provider = HeldProvider(FIRST)
    deps.provider = provider
    errors: list[BaseException] = []

    def first() -> None:
        try:
            extract_turn(deps, ref.org_id, ref.session_id, 1)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            deps.store.db.close()

    a = threading.Thread(target=first, name=FIRST)
    a.start()
    try:
        assert provider.inside.wait(TIMEOUT), "the first delivery never called the LLM"
        second = _busy_or_sends(deps, ref)
    finally:
        provider.go.set()
        a.join(TIMEOUT)
    assert not a.is_alive() and not errors, errors
    assert second == "busy"
    assert provider.total_calls == 1
    # The second delivery's retry, after the first persisted: the stored result, no LLM call.
    writes = extract_turn(deps, ref.org_id, ref.session_id, 1)
    Harness(deps).drain(writes)
    assert provider.total_calls == 1
    row = turn_rows(db, ref.session_id)[1]
    assert (row["state"], row["llm_calls"], row["slots"]) == ("done", 1, 2)


def test_the_turn_lock_lets_one_of_two_deliveries_take_the_claim(
    store: Any, db: Any, deps: StageDeps
) -> None:
    # Window: the first delivery has read the turn under its lock (no result, no claim) and has
    # not yet written its claim. Without the lock, the second delivery reads the same and takes
    # a claim too: two LLM calls for one turn.
    ref = make_session(store, 1)
    scan(deps)
    race = Race(deps, db, "begin_extract.locked")
    # The first LLM call waits until the second delivery has decided, so that decision never
    # depends on whether the first one has persisted yet.
    provider = HeldProvider(FIRST, go=race.second_done)
    deps.provider = provider
    first, second = race.run(lambda: _busy_or_sends(deps, ref), lambda: _busy_or_sends(deps, ref))
    assert second == "busy"
    assert provider.total_calls == 1
    assert [m.actor_name for m in first] == [ActorName.WRITE, ActorName.WRITE]
    assert turn_rows(db, ref.session_id)[1]["llm_calls"] == 1
    assert race.second_waited_on_lock
