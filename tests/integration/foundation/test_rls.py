"""Row-level security: the tenant role sees its own org only, even via a superuser URL."""

from __future__ import annotations

import uuid

import peewee
import pytest

from core.db import tenant
from extraction.scan_queries import ScanQueries
from tests.integration.foundation.helpers import make_session


@pytest.fixture
def two_orgs(store):
    a = make_session(store, "org-a", external_id="a1", turns=2)
    b = make_session(store, "org-b", external_id="b1", turns=3)
    return a, b


def _count(db, table: str) -> int:
    return db.execute_sql(f"SELECT count(*) FROM ibex_core.{table}").fetchone()[0]


def test_the_test_connection_is_a_superuser(db) -> None:
    # The point of the following tests: RLS holds although DATABASE_URL names a superuser.
    assert db.execute_sql("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[
        0
    ]


def test_with_org_a_set_only_a_is_visible(db, two_orgs) -> None:
    (org_a, _, session_a), (org_b, _, _session_b) = two_orgs
    with tenant(db, org_a):
        assert db.execute_sql("SELECT current_user").fetchone()[0] == "ibex_app"
        sessions = db.execute_sql("SELECT id, org_id FROM ibex_core.sessions").fetchall()
        assert [(str(s), str(o)) for s, o in sessions] == [(str(session_a), str(org_a))]
        assert _count(db, "checkpoints") == 2
        assert _count(db, "checkpoint_payloads") == 2
        assert _count(db, "agents") == 1
    with tenant(db, org_b):
        assert _count(db, "checkpoints") == 3


def test_with_no_org_set_nothing_is_visible(db, two_orgs) -> None:
    with db.atomic():
        db.execute_sql("SET LOCAL ROLE ibex_app")
        for table in ("sessions", "checkpoints", "checkpoint_payloads", "agents"):
            assert _count(db, table) == 0, table


def test_the_role_does_not_outlive_the_transaction(db, two_orgs) -> None:
    (org_a, _, _), _ = two_orgs
    with tenant(db, org_a):
        pass
    row = db.execute_sql("SELECT current_user, current_setting('ibex.org_id', true)").fetchone()
    assert row[0] != "ibex_app"
    assert row[1] in (None, "")


def test_inserting_a_row_for_another_org_is_refused(db, two_orgs) -> None:
    (org_a, _, _), (org_b, agent_b, _) = two_orgs
    with pytest.raises(peewee.ProgrammingError, match="row-level security"), tenant(db, org_a):
        db.execute_sql(
            "INSERT INTO ibex_core.sessions (org_id, agent_id, external_id) VALUES (%s, %s, 'x')",
            (str(org_b), str(agent_b)),
        )


def test_updating_another_orgs_session_touches_nothing(db, two_orgs) -> None:
    (org_a, _, _), (org_b, _, session_b) = two_orgs
    with tenant(db, org_a):
        updated = db.execute_sql(
            "UPDATE ibex_core.sessions SET status = 'error' WHERE id = %s", (str(session_b),)
        ).rowcount
    assert updated == 0
    with tenant(db, org_b):
        status = db.execute_sql(
            "SELECT status FROM ibex_core.sessions WHERE id = %s", (str(session_b),)
        ).fetchone()[0]
    assert status == "completed"


def test_the_tenant_role_cannot_delete_or_update_turns(db, two_orgs) -> None:
    (org_a, _, session_a), _ = two_orgs
    with pytest.raises(peewee.ProgrammingError, match="permission denied"), tenant(db, org_a):
        db.execute_sql("DELETE FROM ibex_core.checkpoints WHERE session_id = %s", (str(session_a),))


def test_the_scan_role_reads_identities_across_orgs_but_no_content(db, store, two_orgs) -> None:
    candidates = ScanQueries(store.db).candidates(limit=10)
    assert {c.org_id for c in candidates} == {two_orgs[0][0], two_orgs[1][0]}
    with pytest.raises(peewee.ProgrammingError, match="permission denied"), db.atomic():
        db.execute_sql("SET LOCAL ROLE ibex_scan")
        db.execute_sql("SELECT external_id FROM ibex_core.sessions")
    with pytest.raises(peewee.ProgrammingError, match="permission denied"), db.atomic():
        db.execute_sql("SET LOCAL ROLE ibex_scan")
        db.execute_sql("SELECT count(*) FROM ibex_core.checkpoint_payloads")


def test_an_unknown_org_sees_nothing(db, two_orgs) -> None:
    with tenant(db, uuid.uuid4()):
        assert _count(db, "sessions") == 0


def test_the_operator_role_reads_every_org_and_writes_nothing(db, two_orgs) -> None:
    from core.db import operator_scope

    with operator_scope(db):
        assert _count(db, "sessions") == 2
        assert _count(db, "checkpoints") == 5
    with pytest.raises(peewee.ProgrammingError, match="permission denied"), operator_scope(db):
        db.execute_sql("UPDATE ibex_core.sessions SET status = 'error'")
    with pytest.raises(peewee.ProgrammingError, match="permission denied"), operator_scope(db):
        db.execute_sql("SELECT token_hash FROM ibex_memory.api_tokens")


def done_result(state: str) -> tuple[str | None, int | None]:
    """The (result, memory_count) a turn in ``state`` holds: a done turn has its result."""
    return ('{"memories": []}', 0) if state == "done" else (None, None)


def test_session_progress_counts_only_the_callers_org(db, two_orgs) -> None:
    """ibex_core.session_progress runs as its caller: asked under org A for both orgs'
    sessions, it counts A's turns only."""
    (org_a, _, session_a), (org_b, _, session_b) = two_orgs
    for org, session, states in (
        (org_a, session_a, ("done", "failed")),
        (org_b, session_b, ("done", "done", "done")),
    ):
        with tenant(db, org):
            for index, state in enumerate(states, start=1):
                db.execute_sql(
                    "INSERT INTO ibex_core.extraction_turns"
                    " (org_id, session_id, turn_index, state, result, memory_count)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    (str(org), str(session), index, state, *done_result(state)),
                )
    with tenant(db, org_a):
        rows = db.execute_sql(
            "SELECT session_id, done, failed FROM ibex_core.session_progress(%s::uuid[])",
            ([str(session_a), str(session_b)],),
        ).fetchall()
    assert [(str(s), d, f) for s, d, f in rows] == [(str(session_a), 1, 1)]
