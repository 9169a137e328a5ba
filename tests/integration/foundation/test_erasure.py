"""Forget a user, then ``ibex prune --deleted-older-than``: no row of that user is left in any
table of the ibex schemas (the tables are read from the catalog, so a new table cannot be
forgotten), and nothing that was not deleted is touched.

The clock is simulated by moving ``deleted_at`` back (``backdate``): that is the only time the
erasure reads.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg2
import pytest

from cli import main
from cli.scheduler import prune_hourly
from core.config import Settings
from core.db import connect_params
from memories.tokens import TokenStore
from models import SessionRow
from tests.integration.foundation.helpers import make_session

SCHEMAS = ("ibex_core", "ibex_memory")


def _memory(db: Any, org_id, agent_id, session_id, content: str, user_id=None) -> uuid.UUID:
    row = db.execute_sql(
        "SELECT id FROM ibex_memory.create_memory(%s, %s, %s, %s, %s, %s, %s, 'fact', '{}',"
        " NULL, NULL, %s)",
        (
            str(org_id),
            str(agent_id),
            str(session_id) if session_id else None,
            1 if session_id else None,
            0 if session_id else None,
            content,
            content.lower(),
            str(user_id) if user_id else None,
        ),
    ).fetchone()
    return uuid.UUID(str(row[0]))


def _extraction_state(db: Any, org_id, session_id) -> None:
    db.execute_sql(
        "INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index, state, result,"
        " memory_count) VALUES (%s, %s, 1, 'done', '{\"memories\": []}', 1)",
        (str(org_id), str(session_id)),
    )
    db.execute_sql(
        "INSERT INTO ibex_core.extraction_slots (org_id, session_id, turn_index, ordinal,"
        " idempotency_key, outcome) VALUES (%s, %s, 1, 0, %s, 'created')",
        (str(org_id), str(session_id), str(uuid.uuid4())),
    )
    db.execute_sql(
        "INSERT INTO ibex_core.dead_letters (redis_message_id, message_id, queue_name,"
        " actor_name, org_id, session_id, turn_index, payload)"
        " VALUES (%s, 'm', 'q', 'write_memory', %s, %s, 1, %s)",
        (
            f"r-{session_id}",
            str(org_id),
            str(session_id),
            json.dumps({"kwargs": {"session_id": str(session_id)}}),
        ),
    )


def _forget(database_url: str, org_id, user_id) -> tuple[int, int, int]:
    conn = psycopg2.connect(**connect_params(database_url))
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT * FROM ibex_core.forget_user(%s, %s)", (str(org_id), str(user_id)))
            return cur.fetchone()
    finally:
        conn.close()


def _backdate(db: Any, days: int) -> None:
    """Simulated clock: everything deleted so far was deleted ``days`` ago."""
    for table in ("ibex_core.users", "ibex_core.sessions", "ibex_memory.memories"):
        db.execute_sql(
            f"UPDATE {table} SET deleted_at = deleted_at - make_interval(days => %s)"
            " WHERE deleted_at IS NOT NULL",
            (days,),
        )


def _rows_naming(db: Any, ids: list[uuid.UUID]) -> dict[str, int]:
    """Per table of the ibex schemas (from the catalog), the rows whose text holds any of
    ``ids``: in any column (a user_id, a session_id, a key, a JSON payload)."""
    tables = db.execute_sql(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables"
        " WHERE table_schema = ANY(%s) AND table_type = 'BASE TABLE' ORDER BY 1",
        (list(SCHEMAS),),
    ).fetchall()
    assert len(tables) >= 13
    patterns = [f"%{i}%" for i in ids]
    found = {}
    for (table,) in tables:
        (count,) = db.execute_sql(
            f"SELECT count(*) FROM {table} t WHERE t::text LIKE ANY(%s)", (patterns,)
        ).fetchone()
        found[table] = int(count)
    return found


@pytest.fixture
def prune(database_url: str, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv("DATABASE_URL", database_url)

    def run(*args: str) -> tuple[int, Any]:
        code = main(["prune", *args, "--json"])
        out, err = capsys.readouterr()
        return code, json.loads(out) if out.strip() else err

    return run


def test_after_forget_and_prune_no_row_of_the_user_is_left(
    db: Any, store: Any, database_url: str, prune
) -> None:
    org_id, bot, dana_1 = make_session(store, "acme", "bot", turns=2, external_id="d1")
    sales = store.ensure_agent(org_id, "sales")
    dana = store.resolve_user(org_id, external_id="dana")
    grace = store.resolve_user(org_id, external_id="grace")
    store.set_session_user(org_id, dana_1, dana)
    _, _, dana_2 = make_session(store, "acme", "sales", turns=1, external_id="d2")
    store.set_session_user(org_id, dana_2, dana)
    _, _, grace_1 = make_session(store, "acme", "bot", turns=2, external_id="g1")
    store.set_session_user(org_id, grace_1, grace)
    _, _, shared = make_session(store, "acme", "bot", turns=1, external_id="w1")
    for session in (dana_1, dana_2, grace_1, shared):
        _extraction_state(db, org_id, session)
    _memory(db, org_id, bot, dana_1, "Dana likes tea.", dana)
    _memory(db, org_id, sales, dana_2, "Dana wants the red bike.", dana)
    _memory(db, org_id, sales, None, "Dana is vegan.", dana)
    _memory(db, org_id, bot, grace_1, "Grace likes coffee.", grace)
    old_grace = _memory(db, org_id, bot, None, "Grace lived in Oslo.", grace)
    _memory(db, org_id, bot, shared, "The shop opens at nine.")
    TokenStore(db).issue(org_id=org_id, name="other", scopes=["memory:read"])
    db.execute_sql(
        "INSERT INTO ibex_memory.api_tokens (org_id, token_hash, prefix, scopes, user_id)"
        " VALUES (%s, 'hash-of-danas-token', 'p', '{memory:read}', %s)",
        (str(org_id), str(dana)),
    )
    db.execute_sql(
        "UPDATE ibex_memory.memories SET deleted_at = now() WHERE id = %s", (str(old_grace),)
    )
    dana_ids = [dana, dana_1, dana_2]
    before = _rows_naming(db, dana_ids)
    assert before["ibex_core.checkpoints"] == 3 and before["ibex_memory.memories"] == 3
    others_before = _rows_naming(db, [grace, grace_1, shared])

    assert _forget(database_url, org_id, dana) == (2, 3, 1)
    # Deleted, but not long enough ago: nothing goes.
    code, out = prune("--deleted-older-than", "30d", "--yes")
    assert code == 0 and out["dry_run"] is True and sum(out["erased"].values()) == 0
    _backdate(db, 40)
    recent_delete = _memory(db, org_id, bot, None, "Grace likes jazz.", grace)
    db.execute_sql(
        "UPDATE ibex_memory.memories SET deleted_at = now() WHERE id = %s", (str(recent_delete),)
    )

    code, out = prune("--deleted-older-than", "30d", "--dry-run")
    assert code == 0 and out["dry_run"] is True
    expected = {
        "sessions": 2,
        "checkpoints": 3,
        "payloads": 3,
        "turns": 2,
        "slots": 2,
        "memories": 4,  # Dana's three and Grace's memory deleted 40 days ago
        "dead_letters": 2,
        "users": 1,
        "tokens": 1,
    }
    assert out["erased"] == expected
    assert _rows_naming(db, dana_ids) == before  # a dry run deletes nothing

    code, out = prune("--deleted-older-than", "30d", "--yes", "--batch-size", "1")
    assert code == 0, out
    assert out["dry_run"] is False and out["erased"] == expected
    left = _rows_naming(db, dana_ids)
    assert left == dict.fromkeys(left, 0), left
    # Nothing else went: Grace's and the agent-wide rows are all there (one memory of Grace
    # went, deleted 40 days ago, and one came, deleted just now: it waits for a later prune).
    assert _rows_naming(db, [grace, grace_1, shared]) == others_before
    memories = {
        content: deleted
        for content, deleted in db.execute_sql(
            "SELECT content, deleted_at IS NOT NULL FROM ibex_memory.memories"
        ).fetchall()
    }
    assert memories == {
        "Grace likes coffee.": False,
        "The shop opens at nine.": False,
        "Grace likes jazz.": True,
    }
    assert db.execute_sql("SELECT count(*) FROM ibex_memory.api_tokens").fetchone()[0] == 1
    # The key names a new person now, with no past.
    assert store.resolve_user(org_id, external_id="dana") != dana

    code, out = prune("--deleted-older-than", "30d", "--yes")
    assert code == 0 and sum(out["erased"].values()) == 0  # a second run has nothing to do


def test_prune_needs_an_age(prune) -> None:
    code, err = prune()
    assert code == 2 and "--deleted-older-than" in err


def test_the_scheduler_erases_when_prune_deleted_after_days_is_set(
    db: Any, store: Any, database_url: str, capsys
) -> None:
    org_id, _, gone = make_session(store, "acme", turns=1, external_id="gone")
    _, _, recent = make_session(store, "acme", turns=1, external_id="recent")
    store.soft_delete_session(org_id, gone)
    _backdate(db, 31)
    store.soft_delete_session(org_id, recent)
    settings = Settings.from_env(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "PRUNE_DELETED_AFTER_DAYS": "30",
        }
    )
    assert settings.prune_deleted_after_days == 30 and settings.prune_done_after_days is None
    stop = threading.Event()
    pruner = threading.Thread(target=prune_hourly, args=(settings, stop))
    pruner.start()
    try:
        deadline = time.monotonic() + 10
        while SessionRow.select().where(SessionRow.id == gone).exists():
            assert time.monotonic() < deadline, "the hourly erasure did not run"
            time.sleep(0.05)
    finally:
        stop.set()
    pruner.join(5)
    assert not pruner.is_alive()
    assert [s.id for s in SessionRow.select()] == [recent]
    assert "ibex scheduler: erased 1 sessions (1 checkpoints" in capsys.readouterr().out
