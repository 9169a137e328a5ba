"""The stage functions end to end over the real Postgres (fake LLM and memory service)."""

from __future__ import annotations

from typing import Any

from extraction.stages import scan
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    assert_complete,
    make_session,
    pointer_of,
    turn_rows,
)


def test_a_scan_extracts_every_turn_once_and_moves_the_pointer_to_the_end(
    store: Any,
    db: Any,
    deps: Any,
    harness: Harness,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> None:
    a = make_session(store, 4)
    b = make_session(store, 2, org="globex")
    report = scan(deps)
    assert report.turns == 6
    harness.drain(report.sent)
    assert_complete(db, memory, [a, b])
    assert all(n == 1 for n in provider.calls.values()) and provider.total_calls == 6
    assert memory.posts == 12
    rows = turn_rows(db, a.session_id)
    assert [r["llm_calls"] for r in rows.values()] == [1, 1, 1, 1]


def test_two_runs_in_a_row_the_second_sends_writes_and_calls_nothing(
    store: Any,
    db: Any,
    deps: Any,
    harness: Harness,
    provider: FakeProvider,
    memory: FakeMemoryService,
) -> None:
    a = make_session(store, 3)
    harness.drain(scan(deps).sent)
    calls, posts, pointer = provider.total_calls, memory.posts, pointer_of(db, a.session_id)
    second = scan(deps)
    assert second.sent == [] and second.sessions == 0
    harness.drain(second.sent)
    assert (provider.total_calls, memory.posts, pointer_of(db, a.session_id)) == (
        calls,
        posts,
        pointer,
    )
