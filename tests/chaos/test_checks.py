"""The chaos suite's checks catch what they claim to: a clean state passes, and each kind of
broken state (a mixed turn, a missing or duplicated slot, a pointer short of the end, an extra
LLM answer, a dead letter, a decreasing pointer) is reported. No processes: rows written
directly, so a check that silently passes everything cannot hide behind a green chaos run."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

import pytest

from sessions.store import SessionStore
from tests.chaos.checks import PointerSampler, _turn_keys, end_state, longest_wait
from tests.chaos.stack import FaultRecord
from tests.integration.pipeline.helpers import SessionRef, make_session


def _content(ref: SessionRef, turn: int, ordinal: int, wording: int = 1) -> str:
    return f"Fact {ordinal + 1} about turn {turn} of {ref.session_id} (wording {wording})"


def _memory(db: Any, ref: SessionRef, turn: int, ordinal: int, content: str) -> None:
    digest = hashlib.sha256(content.encode()).hexdigest()
    db.execute_sql(
        "INSERT INTO ibex_memory.memories (org_id, agent_id, session_id, turn_index, ordinal,"
        " content, content_hash, idempotency_key, request_fingerprint)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            str(ref.org_id),
            str(ref.agent_id),
            str(ref.session_id),
            turn,
            ordinal,
            content,
            digest,
            str(uuid.uuid4()),
            digest,
        ),
    )


def _extracted(db: Any, ref: SessionRef, memories: int = 2, pointer: int | None = None) -> None:
    """Every turn of ``ref`` done with ``memories`` memories and slots; the pointer at
    ``pointer`` (default: the end)."""
    for turn in range(1, ref.turns + 1):
        result = {"memories": [{"content": _content(ref, turn, o), "kind": "fact"}
                               for o in range(memories)]}  # fmt: skip
        db.execute_sql(
            "INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index, state,"
            " result, memory_count, llm_calls, attempts)"
            " VALUES (%s, %s, %s, 'done', %s::jsonb, %s, 1, 1)",
            (str(ref.org_id), str(ref.session_id), turn, json.dumps(result), memories),
        )
        db.execute_sql(
            "INSERT INTO ibex_core.turn_usage (org_id, agent_id, session_id, turn_index,"
            " llm_calls, input_tokens, output_tokens) VALUES (%s, %s, %s, %s, 1, 11, 7)",
            (str(ref.org_id), str(ref.agent_id), str(ref.session_id), turn),
        )
        for o in range(memories):
            db.execute_sql(
                "INSERT INTO ibex_core.extraction_slots (org_id, session_id, turn_index, ordinal,"
                " idempotency_key, outcome) VALUES (%s, %s, %s, %s, %s, 'created')",
                (str(ref.org_id), str(ref.session_id), turn, o, str(uuid.uuid4())),
            )
            _memory(db, ref, turn, o, _content(ref, turn, o))
    db.execute_sql(
        "UPDATE ibex_core.sessions SET last_extracted_turn = %s WHERE id = %s",
        (ref.turns if pointer is None else pointer, str(ref.session_id)),
    )


def _stats(store: SessionStore, db: Any, answers: int = 1) -> dict[str, Any]:
    sessions = db.execute_sql(
        "SELECT id::text, org_id, last_extracted_turn, turn_count FROM ibex_core.sessions"
    ).fetchall()
    keys = _turn_keys(store, sessions)
    return {
        "calls_per_turn": {k: answers for k in keys.values()},
        "answered_per_turn": {k: answers for k in keys.values()},
    }


@pytest.fixture
def ref(store: SessionStore, db: Any) -> SessionRef:
    ref = make_session(store, 3)
    _extracted(db, ref)
    return ref


def test_a_clean_state_has_no_violation(db: Any, store: SessionStore, ref: SessionRef) -> None:
    state = end_state(db, store, _stats(store, db), [])
    assert state.violations == []
    assert state.figures["memories"] == 6


def test_a_memory_from_another_answer_is_a_mixed_turn(
    db: Any, store: SessionStore, ref: SessionRef
) -> None:
    db.execute_sql(
        "UPDATE ibex_memory.memories SET content = %s WHERE session_id = %s AND turn_index = 2"
        " AND ordinal = 1",
        (_content(ref, 2, 1, wording=2), str(ref.session_id)),
    )
    violations = end_state(db, store, _stats(store, db), []).violations
    assert any("but result says" in v for v in violations), violations


def test_a_missing_and_a_duplicated_slot_are_reported(
    db: Any, store: SessionStore, ref: SessionRef
) -> None:
    db.execute_sql(
        "DELETE FROM ibex_memory.memories WHERE session_id = %s AND turn_index = 1 AND ordinal = 0",
        (str(ref.session_id),),
    )
    _memory(db, ref, 3, 1, "the same slot, written a second time")
    violations = end_state(db, store, _stats(store, db), []).violations
    assert any("no memory (missing)" in v for v in violations), violations
    assert any("more than one memory" in v for v in violations), violations


def test_a_pointer_short_of_the_end_and_a_dead_letter_are_reported(
    db: Any, store: SessionStore
) -> None:
    ref = make_session(store, 3)
    _extracted(db, ref, pointer=1)
    db.execute_sql(
        "INSERT INTO ibex_core.dead_letters (redis_message_id, message_id, queue_name,"
        " actor_name, payload) VALUES ('r1', 'm1', 'extract', 'extract_turn', '{}')"
    )
    violations = end_state(db, store, _stats(store, db), []).violations
    assert any("pointer 1, turn_count 3" in v for v in violations), violations
    assert any("open dead letters" in v for v in violations), violations
    expected = end_state(
        db, store, _stats(store, db), [], expected_dead_letters=1, redis_dead_letters=1
    )
    assert expected.violations == [f"session {ref.session_id}: pointer 1, turn_count 3"]


def test_a_second_answer_is_allowed_only_for_a_turn_a_fault_held(
    db: Any, store: SessionStore, ref: SessionRef
) -> None:
    stats = _stats(store, db, answers=2)
    db.execute_sql("UPDATE ibex_core.extraction_turns SET llm_calls = 2")
    db.execute_sql("UPDATE ibex_core.turn_usage SET llm_calls = 2")  # as persisted with them
    violations = end_state(db, store, stats, []).violations
    assert sum("LLM answers, allowed 1" in v for v in violations) == 3, violations
    held = frozenset((str(ref.session_id), t) for t in (1, 2, 3))
    fault = FaultRecord(1.0, "SIGKILL worker group", "3 LLM answers in flight", held)
    assert end_state(db, store, stats, [fault]).violations == []


def test_the_sampler_reports_a_decrease_and_a_pointer_past_a_pending_turn(db: Any) -> None:
    sampler = PointerSampler(db)
    session = uuid.uuid4()
    sampler._check({session: (2, 5, 3)})
    sampler._check({session: (1, 5, 2)})
    sampler._check({session: (3, 5, 3)})
    assert sampler.violations == [
        f"pointer of {session} went down: 2 -> 1",
        f"pointer of {session} is 3 but turn 3 is not done",
    ]


def test_the_longest_wait_is_measured_from_the_progress_timeline(db: Any) -> None:
    """After an outage that ended at 12.0 s: a session frozen until 31.0 s waited 19 s; one
    that stepped at 13, 20 and 31 s waited 11 s at most; a complete one did not wait; one that
    never moved again waited until the end of the run (40 s)."""
    sampler = PointerSampler(db)
    frozen, moving, complete, stuck = (uuid.uuid4() for _ in range(4))
    for at, pointers in [
        (10.0, {frozen: (1, 4, 2), moving: (1, 4, 2), complete: (4, 4, 5), stuck: (3, 4, 4)}),
        (13.0, {frozen: (1, 4, 2), moving: (2, 4, 3), complete: (4, 4, 5), stuck: (3, 4, 4)}),
        (20.0, {frozen: (1, 4, 2), moving: (3, 4, 4), complete: (4, 4, 5), stuck: (3, 4, 4)}),
        (31.0, {frozen: (4, 4, 5), moving: (4, 4, 5), complete: (4, 4, 5), stuck: (3, 4, 4)}),
    ]:
        sampler._check(pointers, at=at)
    assert longest_wait(sampler.timeline, sampler.turn_counts, 12.0, 40.0) == (28.0, stuck)
    del sampler.timeline[stuck]
    assert longest_wait(sampler.timeline, sampler.turn_counts, 12.0, 40.0) == (19.0, frozen)
    assert longest_wait(sampler.timeline, sampler.turn_counts, 31.0, 40.0) == (0.0, None)
    del sampler.timeline[frozen]
    assert longest_wait(sampler.timeline, sampler.turn_counts, 12.0, 40.0) == (11.0, moving)


def test_a_fault_that_hit_nothing_is_reported_as_proving_nothing(tmp_path: Any) -> None:
    from tests.chaos.stack import ChaosConfig, ChaosStack

    stack = ChaosStack("postgresql://unused/db", tmp_path, ChaosConfig(seed=1), token="t")
    stack.started_at = time.monotonic()
    stack._record("SIGKILL worker group", "hit 3 live LLM claims", hit=3)
    stack._record("LLM knobs", "{}")  # not a fault that must hit anything
    stack._record("pg_terminate_backend", "hit 0 backends mid-transaction", hit=0)
    assert stack.proved_nothing() == [
        "fault at 0.0s proved nothing: pg_terminate_backend: hit 0 backends mid-transaction"
    ]


def test_a_turn_whose_usage_is_missing_or_miscounted_is_a_violation(
    db: Any, store: SessionStore, ref: SessionRef
) -> None:
    db.execute_sql(
        "DELETE FROM ibex_core.turn_usage WHERE session_id = %s AND turn_index = 1",
        (str(ref.session_id),),
    )
    db.execute_sql(
        "UPDATE ibex_core.turn_usage SET llm_calls = 2 WHERE session_id = %s AND turn_index = 2",
        (str(ref.session_id),),
    )
    violations = end_state(db, store, _stats(store, db), []).violations
    assert violations == [
        f"turn {ref.session_id}/1: usage ledger says None calls, claims 1",
        f"turn {ref.session_id}/2: usage ledger says 2 calls, claims 1",
    ]
