"""Recovery: a worker killed mid-batch, a dead-lettered turn, a rewording LLM with a lost
response, and the scan's leases as the backstop for messages the broker lost."""

from __future__ import annotations

from typing import Any

from core.errors import LLMRejectedError, PermanentError
from extraction.stages import Send, scan
from extraction.values import TurnRef
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    assert_complete,
    assert_pointer_invariant,
    expire_leases,
    key_of,
    make_session,
    once_each,
    pointer_of,
    pointers,
    turn_rows,
)


def test_a_crash_mid_batch_leaves_the_pointer_over_completed_turns_only_and_a_rescan_finishes(
    store: Any, db: Any, deps: Any, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    # Crash point: the worker dies after 9 deliveries and every queued message is lost with it
    # (the worst case for the broker: nothing is redelivered).
    ref = make_session(store, 5)
    harness = Harness(deps)
    lost = harness.drain(scan(deps).sent, limit=9)
    assert lost, "the batch should have been cut mid-way"
    rows = turn_rows(db, ref.session_id)
    done = [t for t, r in sorted(rows.items()) if r["state"] == "done"]
    contiguous = 0
    while contiguous + 1 in done:
        contiguous += 1
    assert pointer_of(db, ref.session_id) == contiguous < 5
    assert_pointer_invariant(db)

    # While the leases are live a scan sends nothing; once they expire it re-sends exactly the
    # unfinished turns, and extraction completes with one LLM call per turn.
    assert scan(deps).sent == []
    expire_leases(db)
    resent = scan(deps).sent
    assert {m.kwargs["turn_index"] for m in resent} == {
        t for t, r in rows.items() if r["state"] != "done"
    }
    Harness(deps).drain(resent)
    assert_complete(db, memory, [ref])
    assert all(n == 1 for n in provider.calls.values()) and provider.total_calls == 5


def test_a_dead_lettered_turn_holds_its_pointer_until_its_message_is_replayed(
    store: Any, db: Any, deps: Any, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    ref = make_session(store, 4)
    other = make_session(store, 3, org="globex")
    provider.reject_always(ref.session_id, 2)
    dead: list[tuple[Send, BaseException]] = []

    def dead_letter(message: Send, exc: BaseException) -> bool:
        # What the worker's dead-letter mirror does: keep the message, mark its turn failed.
        assert isinstance(exc, PermanentError)
        dead.append((message, exc))
        k = message.kwargs
        deps.turns.mark_failed(
            TurnRef.of(k["org_id"], k["session_id"], k["turn_index"]),
            f"{type(exc).__name__}: {exc}",
        )
        return True

    Harness(deps).drain(scan(deps).sent, dead_letter=dead_letter)
    assert [(m.actor_name, m.kwargs["turn_index"]) for m, _ in dead] == [("extract_turn", 2)]
    assert isinstance(dead[0][1], LLMRejectedError)
    rows = turn_rows(db, ref.session_id)
    assert rows[2]["state"] == "failed" and "LLMRejectedError" in rows[2]["last_error"]
    assert rows[3]["state"] == rows[4]["state"] == "done"
    assert pointer_of(db, ref.session_id) == 1  # waits below the failed turn
    assert pointer_of(db, other.session_id) == 3  # invariant 7: other sessions move on
    assert provider.calls[(ref.session_id, 2)] == 1  # a permanent error is not retried

    # The scan does not resend a failed turn: only the operator's replay does.
    assert scan(deps).sent == []
    expire_leases(db)
    assert scan(deps).sent == []

    provider.always_fail.clear()  # the operator fixed the configuration
    Harness(deps).drain([dead[0][0]])  # the replayed dead message
    assert_complete(db, memory, [ref, other])
    assert pointer_of(db, ref.session_id) == 4


def test_a_rewording_llm_and_a_lost_response_write_each_memory_once_from_the_stored_result(
    store: Any, db: Any, deps: Any, memory: FakeMemoryService
) -> None:
    provider = FakeProvider(memories=2, reword=True)
    deps.provider = provider
    ref = make_session(store, 2)
    # The memory service commits the first memory of turn 1, then the response is lost.
    memory.lose_response_for.add(key_of(ref, 1, 0))
    harness = Harness(deps)
    # ...and every extract_turn is delivered twice (an ack lost after it sent its writes).
    harness.drain(scan(deps).sent, lose_ack=once_each(lambda m: m.actor_name == "extract_turn"))
    contents = assert_complete(db, memory, [ref])
    assert memory.conflicts == 0 and memory.duplicates == 0
    assert memory.replays >= 1  # the retry of the lost response was answered by a replay
    assert len(memory.rows) == 4
    assert all(n == 1 for n in provider.calls.values())  # the stored result was reused
    assert all(text.endswith("(wording 1).") for text in contents.values())
    for bodies in memory.bodies.values():
        assert len(set(bodies)) == 1  # byte-for-byte the same body on every attempt


def test_an_unparseable_answer_retries_a_bounded_number_of_times_then_dead_letters(
    store: Any, db: Any, deps: Any, provider: FakeProvider
) -> None:
    from core.errors import LLMUnavailableError

    ref = make_session(store, 1)
    attempts = deps.max_attempts
    provider.fail(ref.session_id, 1, *[LLMUnavailableError("unparseable LLM output")] * 50)
    dead: list[BaseException] = []

    def dead_letter(message: Send, exc: BaseException) -> bool:
        dead.append(exc)
        return True

    Harness(deps).drain(scan(deps).sent, dead_letter=dead_letter, max_retries=50)
    assert provider.calls[(ref.session_id, 1)] == attempts
    assert dead and "gave up after" in str(dead[0]) and "unparseable" in str(dead[0])
    rows = turn_rows(db, ref.session_id)
    assert rows[1]["result"] is None and rows[1]["memory_count"] is None  # never "no memories"
    assert pointer_of(db, ref.session_id) == 0


def test_a_transient_llm_failure_is_retried_and_then_succeeds(
    store: Any, db: Any, deps: Any, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    from core.errors import LLMUnavailableError

    ref = make_session(store, 2)
    provider.fail(ref.session_id, 2, LLMUnavailableError("429"), LLMUnavailableError("500"))
    Harness(deps).drain(scan(deps).sent)
    assert_complete(db, memory, [ref])
    assert provider.calls[(ref.session_id, 2)] == 3
    assert turn_rows(db, ref.session_id)[2]["attempts"] == 3


def test_zero_memories_still_complete_the_turn(
    store: Any, db: Any, deps: Any, memory: FakeMemoryService
) -> None:
    deps.provider = FakeProvider(memories=lambda turn: 0 if turn.turn_index % 2 else 1)
    ref = make_session(store, 4)
    Harness(deps).drain(scan(deps).sent)
    assert_complete(db, memory, [ref])
    assert len(memory.rows) == 2
    assert pointers(db)[ref.session_id][0] == 4


def test_the_scan_respects_the_per_agent_budget_and_pages_through_candidates(
    store: Any,
    db: Any,
    database_url: str,
    redis_server_url: str,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> None:
    from extraction.stages import StageDeps
    from tests.integration.pipeline.helpers import pipeline_settings

    settings = pipeline_settings(
        database_url, redis_server_url, SCAN_MAX_TURNS_PER_AGENT="3", SCAN_BATCH_SIZE="2"
    )
    deps = StageDeps(store=store, settings=settings, provider=provider, memory=memory)
    busy = [make_session(store, 4, agent="busy") for _ in range(3)]
    quiet = [make_session(store, 1, agent=f"quiet{i}", org="globex") for i in range(3)]
    first = scan(deps)
    assert first.sessions == 6
    by_session = [m.kwargs["session_id"] for m in first.sent]
    assert sum(by_session.count(str(s.session_id)) for s in busy) == 3
    assert all(str(q.session_id) in by_session for q in quiet)  # not starved by "busy"
    # Draining and rescanning a few times finishes everything.
    for _ in range(10):
        report = scan(deps)
        if not report.sent and all(p[0] == p[1] for p in pointers(db).values()):
            break
        Harness(deps).drain(first.sent + report.sent)
        first = type(first)()
    assert_complete(db, memory, busy + quiet)


def test_a_retrying_write_keeps_the_turn_leased_so_the_scan_does_not_fan_it_out_again(
    store: Any, db: Any, deps: Any, memory: FakeMemoryService
) -> None:
    # The memory service is down: the write fails with a retryable error. Its retry is the
    # write message's job; the turn's lease is pushed forward so that a scan meanwhile sends
    # nothing more (without it, each lease expiry would add another round of writes).
    from core.errors import MemoryUnavailableError
    from extraction.stages import extract_turn, write_memory

    ref = make_session(store, 1)
    (extract,) = scan(deps).sent
    writes = extract_turn(deps, ref.org_id, ref.session_id, 1)
    expire_leases(db)  # as if the writes took longer than the lease
    memory.fail_next = [MemoryUnavailableError("503 unavailable", status=503)]
    first = writes[0].kwargs
    try:
        write_memory(deps, first["org_id"], first["session_id"], 1, first["ordinal"])
    except MemoryUnavailableError:
        pass
    else:  # pragma: no cover - the fake must fail this write
        raise AssertionError("the write should have failed")
    assert turn_rows(db, ref.session_id)[1]["state"] == "extracted"
    assert scan(deps).sent == []  # leased again by the failed write
    assert "503 unavailable" in (turn_rows(db, ref.session_id)[1]["last_error"] or "")
    Harness(deps).drain(writes)
    assert_complete(db, memory, [ref])
    assert extract.kwargs["turn_index"] == 1
