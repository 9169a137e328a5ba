"""The real actors on a StubBroker + Worker over the real Postgres (fake LLM and memory)."""

from __future__ import annotations

import uuid
from typing import Any

from core.errors import MemoryUnavailableError
from extraction.stages import StageDeps
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    assert_complete,
    dead_letter_rows,
    key_of,
    make_session,
    pointer_of,
    turn_rows,
)
from tests.unit.actors.helpers import drain, stub_worker


def test_the_actors_extract_everything_from_one_scan_message(
    store: Any, db: Any, deps: StageDeps, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    sessions = [make_session(store, 3), make_session(store, 2, org="globex")]
    with stub_worker(deps.settings, deps) as stub:
        stub.get_actor("scan_sessions").send()
        drain(stub)
        assert stub.dead_letters == []
    assert_complete(db, memory, sessions)
    assert provider.total_calls == 5 and all(n == 1 for n in provider.calls.values())


def test_invalid_payloads_and_permanent_errors_dead_letter_at_once_into_the_mirror(
    store: Any, db: Any, deps: StageDeps, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    ref = make_session(store, 3)
    provider.reject_always(ref.session_id, 2)
    with stub_worker(deps.settings, deps) as stub:
        stub.get_actor("extract_turn").send_with_options(
            kwargs={"org_id": str(ref.org_id), "session_id": "garbage", "turn_index": 1}
        )
        stub.get_actor("scan_sessions").send()
        drain(stub)
        dead = {m.actor_name: m for m in stub.dead_letters}
        assert len(stub.dead_letters) == 2
    assert all(m.options.get("retries", 0) == 0 for m in dead.values())  # never retried
    rows = {r["exception_type"]: r for r in dead_letter_rows(db)}
    assert set(rows) == {"InvalidMessageError", "LLMRejectedError"}
    invalid, rejected = rows["InvalidMessageError"], rows["LLMRejectedError"]
    assert "session_id" in invalid["exception_message"] and invalid["session_id"] is None
    assert invalid["payload"]["kwargs"]["session_id"] == "garbage"
    assert (rejected["actor"], rejected["queue"], rejected["turn_index"]) == (
        "extract_turn",
        "extract",
        2,
    )
    assert uuid.UUID(str(rejected["session_id"])) == ref.session_id
    assert rejected["attempts"] == 1 and "LLMRejectedError" in rejected["traceback"]
    turns = turn_rows(db, ref.session_id)
    assert turns[2]["state"] == "failed" and "400 bad request" in turns[2]["last_error"]
    assert turns[3]["state"] == "done" and pointer_of(db, ref.session_id) == 1
    assert provider.calls[(ref.session_id, 2)] == 1

    # Replaying the dead message (the same payload, sent again) finishes the session.
    provider.always_fail.clear()
    with stub_worker(deps.settings, deps) as stub:
        stub.get_actor("extract_turn").send_with_options(kwargs=dead["extract_turn"].kwargs)
        drain(stub)
        assert stub.dead_letters == []
    assert_complete(db, memory, [ref])


def test_transient_memory_failures_retry_and_then_write_once(
    store: Any, db: Any, deps: StageDeps, memory: FakeMemoryService
) -> None:
    ref = make_session(store, 2)
    memory.fail_next = [MemoryUnavailableError("503", status=503) for _ in range(3)]
    memory.lose_response_for.add(key_of(ref, 2, 1))
    with stub_worker(deps.settings, deps) as stub:
        stub.get_actor("scan_sessions").send()
        drain(stub)
        assert stub.dead_letters == []
    assert_complete(db, memory, [ref])
    assert memory.replays == 1 and memory.conflicts == 0
    assert dead_letter_rows(db) == []


def test_a_dead_letter_is_mirrored_together_with_its_failed_turn_or_not_at_all(
    store: Any,
    db: Any,
    deps: StageDeps,
    provider: FakeProvider,
    memory: FakeMemoryService,
    monkeypatch: Any,
) -> None:
    """Crash point simulated: the worker dies after inserting the dead letter's mirror row and
    before marking its turn failed (here the turn update raises). The two are one transaction,
    so neither is left: no mirrored dead letter whose turn the scan would send again as
    pending. The Redis dead letter stays, and a later run of the same failure records both."""
    ref = make_session(store, 2)
    provider.reject_always(ref.session_id, 2)

    def crash(*_: Any, **__: Any) -> bool:
        raise RuntimeError("worker killed between the mirror and the turn update")

    with monkeypatch.context() as patch:
        patch.setattr(deps.turns, "mark_failed", crash)
        with stub_worker(deps.settings, deps) as stub:
            stub.get_actor("scan_sessions").send()
            drain(stub)
            assert len(stub.dead_letters) == 1
    assert dead_letter_rows(db) == []
    assert turn_rows(db, ref.session_id)[2]["state"] == "pending"

    with stub_worker(deps.settings, deps) as stub:
        stub.get_actor("extract_turn").send_with_options(
            kwargs={"org_id": str(ref.org_id), "session_id": str(ref.session_id), "turn_index": 2}
        )
        drain(stub)
        assert len(stub.dead_letters) == 1
    assert [r["turn_index"] for r in dead_letter_rows(db)] == [2]
    assert turn_rows(db, ref.session_id)[2]["state"] == "failed"
