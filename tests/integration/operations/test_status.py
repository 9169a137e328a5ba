"""``ibex status --json`` against a database in a known state."""

from __future__ import annotations

import json

import pytest

from cli import main
from core.db import tenant
from extraction.turns import TurnStore
from tests.integration.foundation.helpers import make_session


def _turn_state(db, org_id, session_id, turn_index, state, *, lease="NULL", llm_calls=1):
    result = "NULL" if state == "pending" else "'{\"memories\": []}'::jsonb"
    count = "NULL" if state == "pending" else "0"
    with tenant(db, org_id):
        db.execute_sql(
            "INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index, state,"
            f" lease_expires_at, result, memory_count, llm_calls, prompt_tokens,"
            f" completion_tokens, extracted_at)"
            f" VALUES (%s, %s, %s, %s, {lease}, {result}, {count}, %s, 100, 20, now())",
            (str(org_id), str(session_id), turn_index, state, llm_calls),
        )


@pytest.fixture
def known_state(db, store):
    # acme / s1: 5 turns, pointer 1; turn 2 in flight, turn 3 failed, turn 4 done (waiting),
    # turn 5 never sent.
    org_a, _, s1 = make_session(store, "acme", external_id="s1", turns=5)
    _turn_state(db, org_a, s1, 1, "done")
    TurnStore(store.db).advance_pointer(org_a, s1, 1)
    _turn_state(db, org_a, s1, 2, "pending", lease="now() + interval '5 minutes'")
    _turn_state(db, org_a, s1, 3, "failed", llm_calls=0)
    _turn_state(db, org_a, s1, 4, "done")
    # acme / s2: fully extracted (2 turns).
    _, _, s2 = make_session(store, "acme", external_id="s2", turns=2)
    _turn_state(db, org_a, s2, 1, "done")
    _turn_state(db, org_a, s2, 2, "done")
    TurnStore(store.db).advance_pointer(org_a, s2, 2)
    # acme / s3: still active, not a candidate.
    make_session(store, "acme", external_id="s3", turns=3, status="active")
    # globex / g1: 3 turns, none sent; its lease on turn 1 expired (counts as pending).
    org_g, _, g1 = make_session(store, "globex", external_id="g1", turns=3)
    _turn_state(db, org_g, g1, 1, "pending", lease="now() - interval '1 minute'", llm_calls=0)
    db.execute_sql(
        "INSERT INTO ibex_core.dead_letters (redis_message_id, message_id, queue_name,"
        " actor_name, org_id, session_id, turn_index, payload, exception_type, attempts)"
        " VALUES ('r1', 'm1', 'extract', 'extract_turn', %s, %s, 3, '{}', 'LLMRejectedError', 1),"
        "        ('r2', 'm2', 'write', 'write_memory', %s, %s, 3, '{}', 'X', 1)",
        (str(org_a), str(s1), str(org_a), str(s1)),
    )
    db.execute_sql(
        "UPDATE ibex_core.dead_letters SET replayed_at = now() WHERE redis_message_id = 'r2'"
    )
    return org_a, org_g


def test_status_json_reports_the_known_numbers(
    known_state, database_url, redis_url, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert main(["status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    acme = next(o for o in data["orgs"] if o["org"] == "acme")
    globex = next(o for o in data["orgs"] if o["org"] == "globex")
    assert {
        k: acme[k]
        for k in (
            "sessions_pending",
            "pointer_lag",
            "turns_pending",
            "turns_in_flight",
            "turns_waiting",
            "turns_failed",
            "turns_done",
            "sessions_blocked",
            "llm_calls_last_hour",
        )
    } == {
        "sessions_pending": 1,
        "pointer_lag": 4,
        "turns_pending": 1,
        "turns_in_flight": 1,
        "turns_waiting": 1,
        "turns_failed": 1,
        "turns_done": 4,
        "sessions_blocked": 1,
        "llm_calls_last_hour": 5,
    }
    assert acme["tokens_last_hour"] == 6 * 120
    assert acme["oldest_pending_age_seconds"] >= 0
    assert (globex["sessions_pending"], globex["turns_pending"], globex["turns_in_flight"]) == (
        1,
        3,
        0,
    )
    assert data["total"]["pointer_lag"] == 7 and data["total"]["sessions_blocked"] == 1
    assert data["queues"]["extract"]["dead_mirror"] == 1
    assert data["queues"]["write"]["dead_mirror"] == 0
    assert data["queues"]["extract"]["ready"] == 0


def test_status_table_renders_for_people(
    known_state, database_url, redis_url, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["org", "sessions", "pending"]
    assert any(line.startswith("TOTAL") and " 7 " in line for line in out.splitlines())


def test_status_without_a_database_fails_closed(monkeypatch, capsys) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["status"]) == 1
    assert "DATABASE_URL" in capsys.readouterr().err
