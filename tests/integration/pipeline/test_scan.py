"""The scan's recording and leasing: one server call per batch, one statement per org in it."""

from __future__ import annotations

import threading
from typing import Any

from core.config import Settings
from extraction.stages import StageDeps, scan
from schema.messages import ActorName
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    expire_leases,
    make_session,
    pipeline_settings,
    turn_rows,
)


def _deps(store: Any, settings: Settings, provider: Any, memory: Any, **env: str) -> StageDeps:
    """The run's settings with ``env`` on top."""
    settings = pipeline_settings(settings.database_url, settings.redis_url, **env)
    return StageDeps(store=store, settings=settings, provider=provider, memory=memory)


def _sent(report: Any) -> list[tuple[str, int]]:
    assert all(m.actor_name == ActorName.EXTRACT for m in report.sent)
    return [(m.kwargs["session_id"], m.kwargs["turn_index"]) for m in report.sent]


def test_the_scan_records_every_turn_leases_lowest_turns_first_per_agent_across_orgs(
    store: Any, db: Any, settings: Settings, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    deps = _deps(
        store, settings, provider, memory, SCAN_MAX_TURNS_PER_AGENT="3", SCAN_BATCH_SIZE="50"
    )
    capped = [make_session(store, 2, agent="capped") for _ in range(3)]
    other = make_session(store, 2, agent="other", org="globex")
    first = scan(deps)
    assert first.sessions == 4
    sent = _sent(first)
    # The message identity: exactly org, session and turn.
    for m in first.sent:
        assert set(m.kwargs) == {"org_id", "session_id", "turn_index"}
    by_session = {str(s.session_id): s for s in [*capped, other]}
    assert all(
        m.kwargs["org_id"] == str(by_session[m.kwargs["session_id"]].org_id) for m in first.sent
    )
    # The capped agent: its 3 lowest turns (turn 1 of each session), never turn 2.
    assert sorted(t for s, t in sent if s != str(other.session_id)) == [1, 1, 1]
    assert sorted(t for s, t in sent if s == str(other.session_id)) == [1, 2]
    # Every unextracted turn is recorded, leased or not.
    for s in [*capped, other]:
        assert sorted(turn_rows(db, s.session_id)) == [1, 2]
    # The next scan: the leased turns stay in flight; a new budget takes the rest.
    second = _sent(scan(deps))
    assert sorted(second) == sorted((str(s.session_id), 2) for s in capped)
    assert _sent(scan(deps)) == []


def test_expired_leases_are_sent_again_but_failed_and_done_turns_never(
    store: Any, db: Any, settings: Settings, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    deps = _deps(store, settings, provider, memory, SCAN_BATCH_SIZE="2")
    a = make_session(store, 3)
    b = make_session(store, 2, org="globex")
    assert len(_sent(scan(deps))) == 5
    assert _sent(scan(deps)) == []  # leases live: nothing
    db.execute_sql(
        "UPDATE ibex_core.extraction_turns SET state = 'failed'"
        " WHERE session_id = %s AND turn_index = 2",
        (str(a.session_id),),
    )
    db.execute_sql(
        "UPDATE ibex_core.extraction_turns SET state = 'done', result = '{\"memories\": []}',"
        " memory_count = 0 WHERE session_id = %s AND turn_index = 1",
        (str(b.session_id),),
    )
    expire_leases(db)
    again = _sent(scan(deps))
    assert sorted(again) == sorted(
        [(str(a.session_id), 1), (str(a.session_id), 3), (str(b.session_id), 2)]
    )
    assert _sent(scan(deps)) == []


def test_the_turns_are_sent_by_agent_in_candidate_order_then_by_turn_and_session(
    store: Any, db: Any, settings: Settings, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    deps = _deps(store, settings, provider, memory)
    sessions = [
        make_session(store, 2, agent=agent, org=org)
        for org, agent in [("acme", "a"), ("globex", "b"), ("acme", "a"), ("initech", "c")]
    ]
    report = scan(deps)
    agent_of = {str(s.session_id): s.agent_id for s in sessions}
    # Candidates come by (agent, session): the agents' first appearance is their id order.
    expected = sorted(
        ((s.agent_id, turn, str(s.session_id)) for s in sessions for turn in (1, 2)),
    )
    assert [(agent_of[s], t, s) for s, t in _sent(report)] == expected


def test_record_and_lease_applies_row_level_security_per_org_whoever_calls(
    store: Any, db: Any
) -> None:
    """The function switches to the tenant role itself: a session listed under another org
    (here by the test's superuser connection, which row-level security would not stop) is
    invisible to that org's statement, so it is neither recorded nor leased."""
    mine = make_session(store, 2)
    theirs = make_session(store, 2, org="globex")
    rows = db.execute_sql(
        "SELECT session_id, turn_index FROM ibex_core.scan_record_and_lease("
        " %s::uuid[], %s::int[], %s::uuid[], %s::int[], %s::uuid[], %s::int[], 60)",
        (
            [str(mine.org_id)],
            [2],
            [str(mine.session_id), str(theirs.session_id)],
            [2],
            [str(mine.agent_id), str(theirs.agent_id)],
            [10, 10],
        ),
    ).fetchall()
    assert sorted((str(s), t) for s, t in rows) == [
        (str(mine.session_id), 1),
        (str(mine.session_id), 2),
    ]
    assert sorted(turn_rows(db, mine.session_id)) == [1, 2]
    assert turn_rows(db, theirs.session_id) == {}


def test_two_scans_at_once_send_every_turn_once_new_or_expired(
    store: Any, db: Any, settings: Settings, provider: FakeProvider, memory: FakeMemoryService
) -> None:
    """Two scans started together (each on its own connection) over the same sessions: the
    new turns are inserted by one of them (the other's insert conflicts and leaves the row to
    its lease), and after the leases expire the recorded rows are taken with SKIP LOCKED and
    leased by one of them. Either way no turn is sent twice and none is left out."""
    deps = _deps(store, settings, provider, memory, SCAN_BATCH_SIZE="4")
    sessions = [
        make_session(store, 3, org=f"org-{n % 3}", agent=f"agent-{n % 2}") for n in range(12)
    ]
    everything = sorted((str(s.session_id), t) for s in sessions for t in (1, 2, 3))

    def both() -> list[tuple[str, int]]:
        barrier = threading.Barrier(2)
        found: list[list[tuple[str, int]]] = []

        def run() -> None:
            barrier.wait()
            try:
                found.append(_sent(scan(deps)))
            finally:
                db.close()

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(found) == 2
        return found[0] + found[1]

    first = both()
    assert sorted(first) == everything
    expire_leases(db)
    again = both()
    assert sorted(again) == everything
