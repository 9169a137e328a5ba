"""Usage per turn is counted once: the ledger row (``ibex_core.turn_usage``) is written by the
statement that persists the turn's result, and only by the call that stores it, so a crash, a
redelivery or a dead-letter replay never adds a second row nor a second count."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import PermanentError
from extraction.stages import Send, extract_turn, scan
from extraction.values import TurnRef
from sessions.turns import TurnInput
from tests.integration.pipeline.helpers import (
    Crash,
    FakeProvider,
    Harness,
    assert_usage_counted_once,
    crash_at,
    make_session,
    turn_rows,
    usage_rows,
)


def test_a_kill_between_persisting_and_writing_counts_the_turn_once(
    store: Any, db: Any, deps: Any, provider: FakeProvider
) -> None:
    """Crash point ``after_persist``: the result and its usage row are committed, the worker
    dies before sending the writes; the redelivery finds the result and counts nothing."""
    ref = make_session(store, 1)
    scan(deps)
    deps.fault = crash_at("after_persist")
    with pytest.raises(Crash):
        extract_turn(deps, ref.org_id, ref.session_id, 1)
    deps.fault = None
    first = usage_rows(db, ref.session_id)
    assert first[1]["llm_calls"] == 1
    assert (first[1]["input_tokens"], first[1]["output_tokens"]) == (11, 7)
    assert first[1]["model"] == "fake-1" and first[1]["latency_ms"] >= 0
    Harness(deps).drain(
        [Send("extract_turn", TurnRef.of(ref.org_id, ref.session_id, 1).as_message())]
    )
    assert usage_rows(db, ref.session_id) == first
    assert provider.total_calls == 1
    assert turn_rows(db, ref.session_id)[1]["state"] == "done"


def test_a_dead_letter_replay_counts_the_turn_once(
    store: Any, db: Any, deps: Any, provider: FakeProvider
) -> None:
    # The turn's first attempt is rejected (dead-lettered, no result, no usage); the replay
    # extracts it: one row, with the replay's call and the failed one counted.
    ref = make_session(store, 2)
    provider.reject_always(ref.session_id, 2)
    dead: list[Send] = []

    def dead_letter(message: Send, exc: BaseException) -> bool:
        assert isinstance(exc, PermanentError)
        dead.append(message)
        k = message.kwargs
        deps.turns.mark_failed(
            TurnRef.of(k["org_id"], k["session_id"], k["turn_index"]), type(exc).__name__
        )
        return True

    Harness(deps).drain(scan(deps).sent, dead_letter=dead_letter)
    assert set(usage_rows(db, ref.session_id)) == {1}
    provider.always_fail.clear()
    Harness(deps).drain(list(dead))
    Harness(deps).drain(list(dead))  # replayed twice by mistake: still counted once
    usage = usage_rows(db, ref.session_id)
    assert set(usage) == {1, 2} and usage[2]["llm_calls"] == 2  # the rejected call was paid
    assert_usage_counted_once(db, ref.session_id)


def test_a_repeated_turn_reused_without_a_call_records_zero(
    store: Any, db: Any, deps: Any, provider: FakeProvider
) -> None:
    org_id = store.ensure_org("acme")
    agent_id = store.ensure_agent(org_id, "bot")
    turn = TurnInput(
        messages=[{"role": "user", "content": "Hi, I am Dana and I like tea."}],
        completion={"role": "assistant", "content": "Hello Dana."},
    )
    sessions = []
    for n in range(2):
        session = store.create_session(org_id, agent_id, f"same-{n}", status="completed")
        store.append_turns(org_id, session.id, [turn])
        sessions.append(session.id)
    harness = Harness(deps)
    harness.drain(scan(deps, session_id=sessions[0]).sent)
    harness.drain(scan(deps, session_id=sessions[1]).sent)
    assert provider.total_calls == 1
    paid, reused = (usage_rows(db, s)[1] for s in sessions)
    assert paid["llm_calls"] == 1 and not paid["reused"]
    assert reused["reused"] and reused["llm_calls"] == 0
    assert (reused["input_tokens"], reused["output_tokens"], reused["embedding_tokens"]) == (
        0,
        0,
        0,
    )
