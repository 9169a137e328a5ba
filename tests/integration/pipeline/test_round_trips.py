"""Fewer transactions per turn, same results: the turns read in the claim's transaction, the
persisted result handed to the first write of each slot in-process, insert-and-count slots."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from core.errors import RowNotFoundError
from extraction.caches import SlotCache
from extraction.stages import extract_turn, scan, write_memory
from extraction.values import PersistedResult, StoredMemory, TurnRef
from schema.messages import ActorName
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    assert_complete,
    make_session,
    turn_rows,
)


class Spy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        self.calls = 0
        inner = getattr(owner, name)

        def spy(*a: Any, **kw: Any) -> Any:
            self.calls += 1
            return inner(*a, **kw)

        monkeypatch.setattr(owner, name, spy)


def test_extract_reads_the_turns_in_the_claim_transaction_with_their_context(
    store: Any, deps: Any, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = make_session(store, 5)
    seen: list[tuple[int, list[int]]] = []
    inner = provider.extract

    def recording(turn: Any, context: Any, related: Any = ()) -> Any:
        seen.append((turn.turn_index, [t.turn_index for t in context]))
        return inner(turn, context, related)

    monkeypatch.setattr(provider, "extract", recording)
    read_turns = Spy(monkeypatch, deps.store, "read_turns")
    extract_turn(deps, ref.org_id, ref.session_id, 4)
    extract_turn(deps, ref.org_id, ref.session_id, 1)
    assert read_turns.calls == 0  # no transaction of its own
    assert seen == [(4, [2, 3]), (1, [])]  # EXTRACTION_CONTEXT_TURNS = 2


def test_the_first_write_of_each_slot_needs_no_read_and_later_deliveries_read_as_before(
    store: Any,
    db: Any,
    deps: Any,
    memory: FakeMemoryService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = make_session(store, 1)
    scan(deps)
    writes = extract_turn(deps, ref.org_id, ref.session_id, 1)
    assert [w.actor_name for w in writes] == [ActorName.WRITE, ActorName.WRITE]
    load_slot = Spy(monkeypatch, deps.turns, "load_slot")
    first = write_memory(deps, ref.org_id, ref.session_id, 1, 0)
    assert first == [] and load_slot.calls == 0
    # A redelivery of the written slot reads its state: recorded, so no second POST.
    assert write_memory(deps, ref.org_id, ref.session_id, 1, 0) == []
    assert load_slot.calls == 1 and memory.posts == 1
    last = write_memory(deps, ref.org_id, ref.session_id, 1, 1)
    assert [m.actor_name for m in last] == [ActorName.POINTER] and load_slot.calls == 1
    Harness(deps).drain(last)
    assert_complete(db, memory, [ref])
    # A replay after the turn is done: the done short-cut, no POST, no pointer step.
    for ordinal in (0, 1):
        assert write_memory(deps, ref.org_id, ref.session_id, 1, ordinal) == []
    assert memory.posts == 2 and len(deps.turns.slot_cache) == 0
    # The bodies were built from the stored result, identical to the uncached path's.
    view = deps.turns.load_slot(TurnRef(ref.org_id, ref.session_id, 1), 1)
    assert view.result is not None and view.agent_id == ref.agent_id
    assert turn_rows(db, ref.session_id)[1]["slots"] == 2


def test_a_write_naming_another_org_never_uses_the_cached_result(
    store: Any, deps: Any, memory: FakeMemoryService
) -> None:
    ref = make_session(store, 1)
    scan(deps)
    extract_turn(deps, ref.org_id, ref.session_id, 1)
    other_org = store.ensure_org("globex")
    with pytest.raises(RowNotFoundError):
        write_memory(deps, other_org, ref.session_id, 1, 0)
    assert memory.posts == 0


def test_the_cached_result_is_exactly_the_stored_one(store: Any, db: Any, deps: Any) -> None:
    ref = make_session(store, 1)
    scan(deps)
    extract_turn(deps, ref.org_id, ref.session_id, 1)
    turn = TurnRef(ref.org_id, ref.session_id, 1)
    cached = deps.turns.slot_cache.take(turn, 0)
    stored = deps.turns.load_slot(turn, 0)
    assert cached == (stored.agent_id, stored.user_id, stored.result)


def test_the_slot_cache_hands_each_ordinal_out_once_and_is_bounded() -> None:
    cache = SlotCache(max_turns=2)
    result = PersistedResult((StoredMemory("a", "fact"), StoredMemory("b", "fact")), "p", "m", 1, 1)
    agent, user = uuid.uuid4(), uuid.uuid4()
    refs = [TurnRef(uuid.uuid4(), uuid.uuid4(), i) for i in range(1, 4)]
    for r in refs:
        cache.put(r, agent, user, result)
    assert len(cache) == 2 and cache.take(refs[0], 0) is None  # the oldest dropped
    assert cache.take(refs[1], 0) == (agent, user, result)
    assert cache.take(refs[1], 0) is None
    assert cache.take(refs[1], 1) == (agent, user, result)
    assert len(cache) == 1  # a turn leaves once every ordinal was handed out
    assert cache.take(TurnRef(uuid.uuid4(), refs[2].session_id, 3), 0) is None  # keyed by org


def test_extract_takes_the_claim_with_or_without_a_row_recorded_by_the_scan(
    store: Any, db: Any, deps: Any, provider: FakeProvider
) -> None:
    recorded = make_session(store, 2)
    scan(deps)
    unrecorded = make_session(store, 2)  # after the scan: no per-turn rows yet
    for ref in (recorded, unrecorded):
        assert len(extract_turn(deps, ref.org_id, ref.session_id, 2)) == 2
        assert turn_rows(db, ref.session_id)[2]["state"] == "extracted"
        with pytest.raises(RowNotFoundError):
            extract_turn(deps, ref.org_id, ref.session_id, 3)
    assert provider.total_calls == 2
