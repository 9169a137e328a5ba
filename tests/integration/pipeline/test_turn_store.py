"""The transitions of :class:`extraction.turns.TurnStore` that only operators and dead letters
reach: failing a turn and reopening it for a replay."""

from __future__ import annotations

from typing import Any

from extraction.stages import StageDeps, extract_turn, scan
from extraction.values import TurnRef
from tests.integration.pipeline.helpers import Harness, make_session, pointer_of, turn_rows


def test_a_replay_reopens_only_a_failed_turn_where_its_stored_result_says(
    db: Any, store: Any, deps: StageDeps
) -> None:
    session = make_session(store, 3)
    scan(deps)
    refs = [TurnRef(session.org_id, session.session_id, t) for t in (1, 2, 3)]
    extract_turn(deps, session.org_id, session.session_id, 1)  # turn 1: a result is stored
    assert deps.turns.mark_failed(refs[0], "MemoryRejectedError: 422")
    assert deps.turns.mark_failed(refs[1], "LLMUnavailableError: 400")
    db.execute_sql(  # turn 2 had used attempts before it failed
        "UPDATE ibex_core.extraction_turns SET attempts = 4, lease_expires_at = NULL"
        " WHERE session_id = %s AND turn_index = 2",
        (str(session.session_id),),
    )

    assert deps.turns.reopen_for_replay(refs[0], 60)
    assert deps.turns.reopen_for_replay(refs[1], 60)
    assert not deps.turns.reopen_for_replay(refs[2], 60)  # pending, not failed: left alone
    assert not deps.turns.reopen_for_replay(refs[0], 60)  # no longer failed

    rows = turn_rows(db, session.session_id)
    assert (rows[1]["state"], rows[2]["state"], rows[3]["state"]) == (
        "extracted",  # its stored result is kept: the replay writes its slots, no LLM call
        "pending",
        "pending",
    )
    for t in (1, 2):
        assert (rows[t]["attempts"], rows[t]["last_error"]) == (0, None)
        status = deps.turns.turn_status(refs[t - 1])
        assert status is not None and status.lease_live  # the scan will not send it as well


def test_a_done_turn_is_neither_failed_nor_reopened(
    db: Any, store: Any, deps: StageDeps, harness: Harness
) -> None:
    session = make_session(store, 1)
    ref = TurnRef(session.org_id, session.session_id, 1)
    harness.drain(scan(deps).sent)
    assert pointer_of(db, session.session_id) == 1
    assert not deps.turns.mark_failed(ref, "late dead letter")
    assert not deps.turns.reopen_for_replay(ref, 60)
    row = turn_rows(db, session.session_id)[1]
    assert (row["state"], row["last_error"]) == ("done", None)
