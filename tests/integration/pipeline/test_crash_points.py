"""The crash-point matrix (every point where a stage can die between two of its effects).

Each case kills a stage right after one step (a ``Crash`` raised from the stage's fault hook,
which no ``except Exception`` can swallow, like kill -9), lets the queue redeliver the message,
and checks that the end state equals a fault-free run: every turn done, every slot written
exactly once with the first answer's wording, the pointer at the end, and one LLM call per turn.
The one documented exception: a kill after the LLM answered but before its result was persisted
costs that turn one extra call (the answer died with the worker).
"""

from __future__ import annotations

from typing import Any

import pytest

from extraction.stages import scan
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    SessionRef,
    assert_complete,
    assert_usage_counted_once,
    crash_at,
    make_session,
    once_each,
    turn_rows,
)

TURNS = 3
MEMORIES = 2


def fault_free_contents(ref: SessionRef) -> dict[tuple[str, int, int], str]:
    """What a fault-free run writes: the provider's first answer for every slot."""
    return {
        (str(ref.session_id), t, o): f"Session {str(ref.session_id)[:8]} turn {t} fact {o}."
        for t in range(1, TURNS + 1)
        for o in range(MEMORIES)
    }


def check_end_state(
    db: Any, ref: SessionRef, provider: FakeProvider, memory: FakeMemoryService, extra: int = 0
) -> None:
    contents = assert_complete(db, memory, [ref])
    assert contents == fault_free_contents(ref)
    assert len(memory.rows) == TURNS * MEMORIES
    assert memory.conflicts == 0 and memory.duplicates == 0
    calls = sorted(provider.calls.values())
    assert sum(calls) == TURNS + extra
    stored = turn_rows(db, ref.session_id)
    assert sum(r["llm_calls"] for r in stored.values()) == TURNS + extra
    # The usage ledger holds one row per turn, written with the result, whatever crashed.
    assert_usage_counted_once(db, ref.session_id)


@pytest.mark.parametrize(
    ("point", "extra_calls"),
    [
        ("after_llm_call", 1),  # the answer dies with the worker: one more call, documented
        ("after_persist", 0),
        ("after_post", 0),  # the memory service committed; the replay answers the retry
        ("after_record_slot", 0),
        ("after_mark_done", 0),  # inside the pointer transaction: it rolls back
        ("after_advance", 0),
    ],
)
def test_a_kill_after_each_step_ends_like_a_fault_free_run(
    point: str,
    extra_calls: int,
    store: Any,
    db: Any,
    deps: Any,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> None:
    ref = make_session(store, TURNS)
    deps.fault = crash_at(point, times=1)
    harness = Harness(deps)
    harness.drain(scan(deps).sent)
    assert harness.crashes, f"the crash point {point} was never reached"
    check_end_state(db, ref, provider, memory, extra_calls)


@pytest.mark.parametrize("actor", ["extract_turn", "write_memory", "advance_pointer"])
def test_a_kill_before_the_ack_redelivers_a_finished_message_harmlessly(
    actor: str, store: Any, db: Any, deps: Any, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    # Crash point "before the ack": the stage committed and its follow-ups were sent, then the
    # worker died before acking, so the broker delivers the same message again.
    ref = make_session(store, TURNS)
    harness = Harness(deps)
    harness.drain(scan(deps).sent, lose_ack=once_each(lambda m: m.actor_name == actor))
    assert harness.delivered[actor] >= 2 * TURNS
    check_end_state(db, ref, provider, memory)


def test_a_kill_at_every_step_of_every_turn_still_converges(
    store: Any, db: Any, deps: Any, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    ref = make_session(store, TURNS)
    points = ["after_persist", "after_post", "after_record_slot", "after_mark_done"]
    hooks = [crash_at(p, times=TURNS * MEMORIES) for p in points]

    def fault(name: str) -> None:
        for hook in hooks:
            hook(name)

    deps.fault = fault
    harness = Harness(deps)
    harness.drain(scan(deps).sent)
    assert len(harness.crashes) >= TURNS * 3
    check_end_state(db, ref, provider, memory)
