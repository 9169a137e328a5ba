"""Per-org token budgets: once an org's budget is spent its turns wait (no LLM call, never
dead-lettered, never lost) while other orgs go on, and raising the budget drains them.

The check sits in ``begin_extract`` (when an LLM call is claimed) and the count in
``persist_result`` (when a result is stored), so the overrun is at most the calls in flight
when the limit was reached: none with one delivery at a time, at most the other threads'
calls with several (the last test, where all three of them land)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from extraction.budgets import BudgetStore
from extraction.dispatch import run_message
from extraction.metrics import PipelineMetrics
from extraction.stages import extract_turn, scan
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    assert_complete,
    assert_usage_counted_once,
    expire_leases,
    make_session,
    turn_rows,
)

#: What one call of the fake provider costs: 11 input + 7 output tokens.
PER_CALL = 18


class Recorded(PipelineMetrics):
    def __init__(self) -> None:
        self.thresholds: list[tuple[str, int]] = []
        self.waits = 0

    def budget_threshold(self, org: str, percent: int) -> None:
        self.thresholds.append((org, percent))

    def budget_wait(self, org: str) -> None:
        self.waits += 1


def state_of(db: Any, ref: Any) -> dict[int, str]:
    rows = db.execute_sql(
        "SELECT turn_index, state FROM ibex_core.session_turns(%s, 0, 100)",
        (str(ref.session_id),),
    ).fetchall()
    return {int(t): str(s) for t, s in rows}


def test_a_spent_budget_holds_one_orgs_turns_while_another_goes_on_and_raising_it_drains_them(
    store: Any, db: Any, deps: Any, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    a = make_session(store, 6, org="acme")
    b = make_session(store, 6, org="globex")
    budgets = BudgetStore(store.db)
    budgets.set(a.org_id, 3 * PER_CALL - 1)  # spent by the third call
    deps.metrics = metrics = Recorded()
    harness = Harness(deps)
    harness.drain(scan(deps).sent)
    a_calls = sum(n for (sid, _), n in provider.calls.items() if sid == a.session_id)
    # The budget stops A's calls within the overrun (no call was in flight: 0 extra).
    assert a_calls == 3
    assert sum(n for (sid, _), n in provider.calls.items() if sid == b.session_id) == 6
    assert_complete(db, memory, [b])
    shown = budgets.get(a.org_id)
    assert shown is not None and shown.used == 3 * PER_CALL and shown.spent
    assert shown.waiting_turns == 3
    states = state_of(db, a)
    assert sorted(states.values()).count("waiting_for_budget") == 3
    rows = turn_rows(db, a.session_id)
    # Waiting is not failing: no attempt counted, nothing dead-lettered.
    assert all(r["state"] != "failed" for r in rows.values())
    assert all(r["attempts"] == 0 for r in rows.values() if r["result"] is None)
    assert not harness.dead
    # 100 % reported once (the call that crossed 80 % crossed 100 % too); each wait counted.
    assert metrics.thresholds == [(str(a.org_id), 100)] and metrics.waits == 3

    # Scanned again while the budget is spent (the short lease over): still no call.
    expire_leases(db)
    Harness(deps).drain(scan(deps).sent)
    assert sum(n for (sid, _), n in provider.calls.items() if sid == a.session_id) == 3

    # Raising the limit drains the waiting turns on the next scan: nothing lost, once each.
    budgets.set(a.org_id, 100 * PER_CALL)
    Harness(deps).drain(scan(deps).sent)
    assert_complete(db, memory, [a, b])
    assert all(n == 1 for n in provider.calls.values()) and provider.total_calls == 12
    assert_usage_counted_once(db, a.session_id)
    after = budgets.get(a.org_id)
    assert after is not None and after.used == 6 * PER_CALL and after.waiting_turns == 0


def test_a_zero_budget_holds_every_call_and_clearing_it_resumes_at_once(
    store: Any, db: Any, deps: Any, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    a = make_session(store, 2)
    budgets = BudgetStore(store.db)
    budgets.set(a.org_id, 0, "day")
    sent = scan(deps).sent
    assert extract_turn(deps, a.org_id, a.session_id, 1) == []  # no follow-up: it waits
    Harness(deps).drain(sent)
    assert provider.total_calls == 0
    assert set(state_of(db, a).values()) == {"waiting_for_budget"}
    assert scan(deps).sent == []  # waiting under a short lease, not sent in a loop
    assert budgets.clear(a.org_id) and budgets.get(a.org_id) is None
    Harness(deps).drain(scan(deps).sent)  # cleared: sent again at once
    assert_complete(db, memory, [a])
    assert provider.total_calls == 2


THREADS = 4


def test_concurrent_deliveries_overrun_the_budget_by_at_most_the_calls_in_flight(
    store: Any, db: Any, deps: Any, memory: FakeMemoryService
) -> None:
    """Four threads deliver at once (as one worker process with WORKER_THREADS=4), each LLM
    call taking 50 ms so calls overlap: once the limit is reached no new call is claimed, and
    the calls already in flight (at most the other threads') are the whole overrun."""
    deps.provider = provider = FakeProvider(memories=1, latency=0.05)
    a = make_session(store, 20, org="acme")
    b = make_session(store, 6, org="globex")
    budgets = BudgetStore(store.db)
    budgets.set(a.org_id, 2 * PER_CALL - 1)  # reached by the second stored result
    queue = deque(scan(deps).sent)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                if not queue:
                    return
                message = queue.popleft()
            try:
                follow = run_message(deps, message.actor_name, message.kwargs)
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                return
            with lock:
                queue.extend(follow)

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    a_calls = sum(n for (sid, _), n in provider.calls.items() if sid == a.session_id)
    assert 2 <= a_calls <= 2 + THREADS - 1, a_calls
    spent = budgets.get(a.org_id)
    assert spent is not None and spent.used - spent.limit <= THREADS * PER_CALL
    assert spent.waiting_turns == 20 - a_calls
    assert_complete(db, memory, [b])  # the other org went on

    budgets.set(a.org_id, 1000 * PER_CALL)
    Harness(deps).drain(scan(deps).sent)
    assert_complete(db, memory, [a, b])
    assert all(n == 1 for n in provider.calls.values()) and provider.total_calls == 26
