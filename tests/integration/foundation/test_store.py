"""SessionStore behaviour and the guarantees the schema itself enforces."""

from __future__ import annotations

import uuid

import peewee
import pytest

from core.db import tenant
from core.errors import ConfigError, ImmutableTurnError, RowNotFoundError
from extraction.scan_queries import CANDIDATES_SQL, ScanQueries
from extraction.turns import TurnStore
from sessions.store import SessionStore
from tests.integration.foundation.helpers import make_session, turn


def test_the_store_refuses_to_exist_without_a_database() -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        SessionStore.from_url(None)
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        SessionStore(None)


def test_sessions_are_found_by_external_id_and_turns_read_back(store) -> None:
    org_id, agent_id, session_id = make_session(store, "acme", turns=3)
    found = store.find_session(org_id, agent_id, "s1")
    assert found is not None and found.id == session_id
    assert found.turn_count == 3 and found.prompt_tokens == 30
    assert store.find_session(org_id, agent_id, "nope") is None
    second = store.read_turn(org_id, session_id, 2)
    assert second.messages == [{"role": "user", "content": "turn 2"}]
    assert second.completion == {"role": "assistant", "content": "ok"}
    assert [t.turn_index for t in store.read_turns(org_id, session_id, 0, 10)] == [1, 2, 3]
    with pytest.raises(RowNotFoundError):
        store.read_turn(org_id, session_id, 4)


def test_status_changes_and_soft_delete(store) -> None:
    org_id, _, session_id = make_session(store, "acme", status="active")
    assert store.get_session(org_id, session_id).completed_at is None
    store.complete_session(org_id, session_id)
    done = store.get_session(org_id, session_id)
    assert done.status == "completed" and done.completed_at is not None
    store.abandon_session(org_id, session_id)
    assert store.get_session(org_id, session_id).status == "abandoned"
    store.soft_delete_session(org_id, session_id)
    assert store.get_session(org_id, session_id).deleted_at is not None
    with pytest.raises(RowNotFoundError):
        store.complete_session(org_id, session_id)
    with pytest.raises(RowNotFoundError):
        store.soft_delete_session(org_id, uuid.uuid4())


def test_a_checkpoint_cannot_be_updated_even_by_the_table_owner(db, store) -> None:
    org_id, _, session_id = make_session(store, "acme")
    # Connected as the owner (a superuser here), with no role switch.
    with pytest.raises(peewee.DatabaseError, match="append-only"), db.atomic():
        db.execute_sql(
            "UPDATE ibex_core.checkpoints SET latency_ms = 1 WHERE session_id = %s",
            (str(session_id),),
        )
    with pytest.raises(peewee.DatabaseError, match="append-only"), db.atomic():
        db.execute_sql(
            "UPDATE ibex_core.checkpoint_payloads SET messages = '[]' WHERE session_id = %s",
            (str(session_id),),
        )
    # And the tenant role has no UPDATE privilege at all.
    with pytest.raises(peewee.ProgrammingError, match="permission denied"), tenant(db, org_id):
        db.execute_sql("UPDATE ibex_core.checkpoints SET latency_ms = 1")


def test_deleting_a_directive_version_detaches_its_sessions(db, store) -> None:
    org_id, _, session_id = make_session(store, "acme")
    with tenant(db, org_id):
        directive = db.execute_sql(
            "INSERT INTO ibex_core.directives (org_id, name) VALUES (%s, 'greet') RETURNING id",
            (str(org_id),),
        ).fetchone()[0]
        version = db.execute_sql(
            "INSERT INTO ibex_core.directive_versions (org_id, directive_id, version, body)"
            " VALUES (%s, %s, 1, 'be kind') RETURNING id",
            (str(org_id), directive),
        ).fetchone()[0]
        db.execute_sql(
            "UPDATE ibex_core.sessions SET directive_version_id = %s WHERE id = %s",
            (version, str(session_id)),
        )
    with tenant(db, org_id):
        db.execute_sql("DELETE FROM ibex_core.directive_versions WHERE id = %s", (version,))
    assert store.get_session(org_id, session_id).directive_version_id is None


def test_a_session_cannot_point_at_another_orgs_directive_version(db, store) -> None:
    _org_a, _, session_a = make_session(store, "org-a")
    org_b, _, _ = make_session(store, "org-b")
    with tenant(db, org_b):
        directive = db.execute_sql(
            "INSERT INTO ibex_core.directives (org_id, name) VALUES (%s, 'd') RETURNING id",
            (str(org_b),),
        ).fetchone()[0]
        version = db.execute_sql(
            "INSERT INTO ibex_core.directive_versions (org_id, directive_id, version, body)"
            " VALUES (%s, %s, 1, 'x') RETURNING id",
            (str(org_b), directive),
        ).fetchone()[0]
    with pytest.raises(peewee.IntegrityError), db.atomic():
        db.execute_sql(
            "UPDATE ibex_core.sessions SET directive_version_id = %s WHERE id = %s",
            (version, str(session_a)),
        )


def test_the_pointer_never_moves_backwards_nor_past_turn_count(db, store) -> None:
    org_id, _, session_id = make_session(store, "acme", turns=5)
    assert TurnStore(store.db).advance_pointer(org_id, session_id, 3) == 3
    assert TurnStore(store.db).advance_pointer(org_id, session_id, 2) == 3
    assert TurnStore(store.db).advance_pointer(org_id, session_id, 99) == 5
    assert store.get_session(org_id, session_id).last_extracted_turn == 5
    # Even a direct UPDATE cannot move it down or past the turn count.
    with pytest.raises(peewee.IntegrityError, match="backwards"), db.atomic():
        db.execute_sql(
            "UPDATE ibex_core.sessions SET last_extracted_turn = 1 WHERE id = %s",
            (str(session_id),),
        )
    with pytest.raises(peewee.IntegrityError), db.atomic():
        db.execute_sql(
            "UPDATE ibex_core.sessions SET last_extracted_turn = 6 WHERE id = %s",
            (str(session_id),),
        )


def test_appending_turns_continues_the_index_and_keeps_the_pointer(store) -> None:
    org_id, _, session_id = make_session(store, "acme", turns=2)
    TurnStore(store.db).advance_pointer(org_id, session_id, 2)
    result = store.append_turns(org_id, session_id, [turn("three"), turn("four")])
    assert (result.turns_added, result.turn_count) == (2, 4)
    session = store.get_session(org_id, session_id)
    assert (session.turn_count, session.last_extracted_turn) == (4, 2)
    assert store.read_turn(org_id, session_id, 4).messages[0]["content"] == "four"


def test_sync_refuses_a_changed_turn(db, store) -> None:
    org_id, _, session_id = make_session(store, "acme", turns=2)
    with pytest.raises(ImmutableTurnError, match="turn 2"), tenant(db, org_id):
        session = store._get_session(session_id, for_update=True)
        store.sync_turns(session, [turn("turn 1"), turn("turn 2 edited")])


def test_candidates_are_completed_undeleted_sessions_with_pending_turns(db, store) -> None:
    org_id, _agent_id, done = make_session(store, "acme", external_id="done", turns=2)
    TurnStore(store.db).advance_pointer(org_id, done, 2)
    _, _, pending = make_session(store, "acme", external_id="pending", turns=2)
    make_session(store, "acme", external_id="active", turns=2, status="active")
    _, _, deleted = make_session(store, "acme", external_id="deleted", turns=2)
    store.soft_delete_session(org_id, deleted)
    make_session(store, "acme", external_id="empty", turns=0)
    _org_b, _, other = make_session(store, "other", external_id="x", turns=1)
    ids = {c.session_id for c in ScanQueries(store.db).candidates(limit=100)}
    assert ids == {pending, other}


def test_candidates_paginate_by_keyset(store) -> None:
    org_id = store.ensure_org("acme")
    expected = set()
    for agent in ("a1", "a2", "a3"):
        agent_id = store.ensure_agent(org_id, agent)
        for n in range(3):
            session = store.create_session(org_id, agent_id, f"{agent}-{n}", status="completed")
            store.append_turns(org_id, session.id, [turn("x")])
            expected.add(session.id)
    seen: list = []
    after = None
    while True:
        page = ScanQueries(store.db).candidates(limit=4, after=after)
        if not page:
            break
        seen.extend(c.session_id for c in page)
        after = (page[-1].agent_id, page[-1].session_id)
    assert len(seen) == 9 and set(seen) == expected


def test_the_candidate_query_uses_the_partial_index(db, store) -> None:
    org_id, agent_id, _ = make_session(store, "acme", turns=1)
    # Many fully extracted sessions (outside the partial index) and a few pending ones.
    db.execute_sql(
        "INSERT INTO ibex_core.sessions (org_id, agent_id, status, turn_count,"
        " last_extracted_turn) SELECT %s, %s, 'completed', 3, 3 FROM generate_series(1, 20000)",
        (str(org_id), str(agent_id)),
    )
    db.execute_sql("ANALYZE ibex_core.sessions")
    with db.atomic():
        db.execute_sql("SET LOCAL ROLE ibex_scan")
        plan = "\n".join(
            row[0]
            for row in db.execute_sql(
                "EXPLAIN " + CANDIDATES_SQL,
                (
                    "00000000-0000-0000-0000-000000000000",
                    "00000000-0000-0000-0000-000000000000",
                    500,
                ),
            ).fetchall()
        )
    assert "idx_sessions_agent_extraction" in plan, plan
