"""Users: sessions and memories about one person of an org, in the store, the import and the
SQL functions of migration 000012."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import peewee
import psycopg2
import psycopg2.errors
import pytest

from cli import main
from core.db import connect_params
from core.errors import UserConflictError
from models import Session, User
from models.store import UnknownUserError
from tests.integration.foundation.helpers import make_session, turn


def _line(session: str, user: str | None = None, **extra) -> str:
    record = {
        "org": "acme",
        "agent": "support-bot",
        "session": session,
        "turns": [
            {
                "messages": [{"role": "user", "content": f"{session} says hi"}],
                "completion": {"role": "assistant", "content": "hello"},
            }
        ],
    }
    if user is not None:
        record["user"] = user
    record.update(extra)
    return json.dumps(record)


@pytest.fixture
def run_import(db, database_url, monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setenv("DATABASE_URL", database_url)

    def run(*lines: str):
        path = tmp_path / "sessions.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        code = main(["import", str(path)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _memory(db, org_id, agent_id, session_id, content: str, user_id=None) -> uuid.UUID:
    row = db.execute_sql(
        "SELECT outcome, id FROM ibex_memory.create_memory(%s, %s, %s, 1, 0, %s, %s, 'fact',"
        " '{}', NULL, NULL, %s)",
        (
            str(org_id),
            str(agent_id),
            str(session_id) if session_id else None,
            content,
            content.lower(),
            str(user_id) if user_id else None,
        ),
    ).fetchone()
    return uuid.UUID(str(row[1]))


def test_a_user_is_resolved_by_key_created_once_and_named_by_id(store) -> None:
    org = store.ensure_org("acme")
    other = store.ensure_org("globex")
    dana = store.resolve_user(org, external_id="dana-17")
    assert store.resolve_user(org, external_id="dana-17") == dana
    assert store.find_user(org, "dana-17") == dana
    assert store.resolve_user(org, user_id=dana) == dana
    assert store.resolve_user(other, external_id="dana-17") != dana  # keys are per org
    with pytest.raises(UnknownUserError):
        store.resolve_user(other, user_id=dana)
    with pytest.raises(UnknownUserError):
        store.resolve_user(org, user_id=uuid.uuid4())
    assert store.find_user(org, "grace") is None


def test_a_sessions_user_is_set_once(store) -> None:
    org_id, agent_id, session_id = make_session(store, "acme", turns=1)
    dana = store.resolve_user(org_id, external_id="dana")
    grace = store.resolve_user(org_id, external_id="grace")
    store.set_session_user(org_id, session_id, dana)
    store.set_session_user(org_id, session_id, dana)  # the same user again: nothing changes
    with pytest.raises(UserConflictError) as raised:
        store.set_session_user(org_id, session_id, grace)
    assert raised.value.user_id == dana and raised.value.requested == grace
    # An external id names a session per user: grace's "s1" is a session of her own, and
    # dana's keeps its user.
    graces = store.create_session(org_id, agent_id, "s1", user_id=grace)
    assert graces.id != session_id and graces.user_id == grace
    assert store.get_session(org_id, session_id).user_id == dana
    created = store.create_session(org_id, agent_id, "s2", user_id=grace)
    assert created.user_id == grace


def test_a_memory_from_a_users_session_must_carry_that_user(db, store) -> None:
    org_id, agent_id, session_id = make_session(store, "acme", turns=1)
    dana = store.resolve_user(org_id, external_id="dana")
    grace = store.resolve_user(org_id, external_id="grace")
    store.set_session_user(org_id, session_id, dana)
    for wrong in (None, grace):
        with pytest.raises(peewee.IntegrityError) as raised, db.atomic():
            _memory(db, org_id, agent_id, session_id, "Dana likes tea.", wrong)
        assert raised.value.orig.diag.constraint_name == "memories_user_of_session"
    mine = _memory(db, org_id, agent_id, session_id, "Dana likes tea.", dana)
    # A memory without a source may name any user of the org, or none (agent-wide).
    _memory(db, org_id, agent_id, None, "Grace likes coffee.", grace)
    _memory(db, org_id, agent_id, None, "The shop opens at nine.")
    rows = dict(db.execute_sql("SELECT content, user_id FROM ibex_memory.memories").fetchall())
    assert rows == {
        "Dana likes tea.": dana,
        "Grace likes coffee.": grace,
        "The shop opens at nine.": None,
    }
    assert mine is not None


def test_the_same_content_is_one_memory_per_user_and_one_agent_wide(db, store) -> None:
    org_id, agent_id, _ = make_session(store, "acme", turns=0)
    dana = store.resolve_user(org_id, external_id="dana")
    grace = store.resolve_user(org_id, external_id="grace")
    outcomes = [
        db.execute_sql(
            "SELECT outcome FROM ibex_memory.create_memory(%s, %s, NULL, NULL, NULL,"
            " 'Allergic to soy.', 'h', 'fact', '{}', NULL, NULL, %s)",
            (str(org_id), str(agent_id), str(user) if user else None),
        ).fetchone()[0]
        for user in (dana, grace, None, dana, None)
    ]
    assert outcomes == ["created", "created", "created", "content_exists", "content_exists"]


def test_the_eleven_parameter_create_memory_still_writes_an_agent_wide_memory(db, store) -> None:
    org_id, agent_id, _ = make_session(store, "acme", turns=0)
    row = db.execute_sql(
        "SELECT outcome FROM ibex_memory.create_memory(%s, %s, NULL, NULL, NULL, 'x', 'hx',"
        " 'fact', '{}', NULL, NULL)",
        (str(org_id), str(agent_id)),
    ).fetchone()
    assert row[0] == "created"
    assert db.execute_sql("SELECT user_id FROM ibex_memory.memories").fetchone()[0] is None


def test_giving_a_session_a_user_gives_it_its_memories(db, store) -> None:
    org_id, agent_id, session_id = make_session(store, "acme", turns=1)
    dana = store.resolve_user(org_id, external_id="dana")
    _memory(db, org_id, agent_id, None, "Likes tea.", dana)
    _memory(db, org_id, agent_id, session_id, "Likes tea.")  # agent-wide until the user is known
    _memory(db, org_id, agent_id, session_id, "Lives in Lyon.")
    store.set_session_user(org_id, session_id, dana)
    rows = db.execute_sql(
        "SELECT content, user_id, deleted_at IS NOT NULL FROM ibex_memory.memories"
        " WHERE session_id = %s ORDER BY content",
        (str(session_id),),
    ).fetchall()
    # The repeat of Dana's memory is its duplicate now, and goes; the other one is Dana's.
    assert rows == [("Likes tea.", dana, True), ("Lives in Lyon.", dana, False)]


def test_forget_user_soft_deletes_the_user_their_sessions_memories_and_tokens(
    db, store, database_url
) -> None:
    org_id, agent_id, session_id = make_session(store, "acme", turns=1)
    other_agent = store.ensure_agent(org_id, "sales-bot")
    dana = store.resolve_user(org_id, external_id="dana")
    grace = store.resolve_user(org_id, external_id="grace")
    store.set_session_user(org_id, session_id, dana)
    graces = store.create_session(org_id, agent_id, "g1", user_id=grace)
    _memory(db, org_id, agent_id, session_id, "Dana likes tea.", dana)
    _memory(db, org_id, other_agent, None, "Dana is vegan.", dana)
    _memory(db, org_id, agent_id, graces.id, "Grace likes coffee.", grace)
    _memory(db, org_id, agent_id, None, "The shop opens at nine.")
    db.execute_sql(
        "INSERT INTO ibex_memory.api_tokens (org_id, token_hash, prefix, scopes, user_id)"
        " VALUES (%s, 'hash-dana', 'p', '{memory:read}', %s)",
        (str(org_id), str(dana)),
    )
    conn = psycopg2.connect(**connect_params(database_url))
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT * FROM ibex_core.forget_user(%s, %s)", (str(org_id), str(dana)))
            assert cur.fetchall() == [(1, 2, 1)]
        with conn, conn.cursor() as cur:  # forgotten already: no row, nothing changes
            cur.execute("SELECT * FROM ibex_core.forget_user(%s, %s)", (str(org_id), str(dana)))
            assert cur.fetchall() == []
        with conn, conn.cursor() as cur:
            cur.execute("SET LOCAL ROLE ibex_app")
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(
                    "SELECT * FROM ibex_core.forget_user(%s, %s)", (str(org_id), str(grace))
                )
    finally:
        conn.close()
    live = db.execute_sql(
        "SELECT content FROM ibex_memory.memories WHERE deleted_at IS NULL ORDER BY 1"
    ).fetchall()
    assert [r[0] for r in live] == ["Grace likes coffee.", "The shop opens at nine."]
    assert Session.get_by_id(session_id).deleted_at is not None
    assert Session.get_by_id(graces.id).deleted_at is None
    assert User.get_by_id(dana).deleted_at is not None and User.get_by_id(grace).deleted_at is None
    revoked = db.execute_sql("SELECT revoked_at FROM ibex_memory.api_tokens").fetchone()[0]
    assert revoked is not None
    # A memory written for the forgotten user afterwards (an extraction in flight) is stored
    # deleted; the key names a new person from now on.
    _memory(db, org_id, agent_id, session_id, "Dana likes jazz.", dana)
    assert db.execute_sql(
        "SELECT deleted_at IS NOT NULL FROM ibex_memory.memories WHERE content = 'Dana likes jazz.'"
    ).fetchone() == (True,)
    assert store.find_user(org_id, "dana") is None
    assert store.resolve_user(org_id, external_id="dana") != dana
    with pytest.raises(UnknownUserError):
        store.resolve_user(org_id, user_id=dana)


def test_import_takes_a_user_by_key_or_by_id(db, store, run_import) -> None:
    code, _, err = run_import(_line("conv-1", "dana"), _line("conv-2", "dana"), _line("conv-3"))
    assert code == 0, err
    org_id = store.find_org("acme")
    assert org_id is not None
    dana = store.find_user(org_id, "dana")
    assert dana is not None
    sessions = {s.external_id: s.user_id for s in Session.select()}
    assert sessions == {"conv-1": dana, "conv-2": dana, "conv-3": None}
    code, _out, err = run_import(_line("conv-4", user_id=str(dana)), _line("conv-3", "grace"))
    assert code == 0, err
    grace = store.find_user(org_id, "grace")
    sessions = {s.external_id: s.user_id for s in Session.select()}
    assert sessions["conv-4"] == dana and sessions["conv-3"] == grace  # set once, from none


def test_import_refuses_an_unknown_id_both_or_a_bad_key_and_names_sessions_per_user(
    db, run_import
) -> None:
    assert run_import(_line("conv-1", "dana"))[0] == 0
    # The same external id for another user is that user's own session (an external id names
    # a session per user), not a conflict with dana's.
    extended = json.loads(_line("conv-1", "grace"))
    extended["turns"].append(
        {"messages": [{"role": "user", "content": "more"}], "completion": {"role": "assistant"}}
    )
    extended["turns"][1]["completion"]["content"] = "ok"
    lines = [
        json.dumps(extended),
        _line("conv-2", user_id=str(uuid.uuid4())),
        _line("conv-3", "dana", user_id=str(uuid.uuid4())),
        _line("conv-4", "x" * 201),
        _line("conv-5", "tab\there"),
        _line("conv-6", ""),
    ]
    code, out, err = run_import(*lines)
    assert code == 1
    assert "5 lines rejected" in out
    assert "line 1:" not in err
    assert "line 2: user" in err and "not found" in err
    assert "line 3: invalid session: user_id: give user or user_id, not both" in err
    assert "line 4: invalid session: user: Length must be between 1 and 200" in err
    assert "line 5: invalid session: user: must hold printable characters only" in err
    assert "line 6: invalid session: user: Length must be between 1 and 200" in err
    # dana's conv-1 kept its one turn and its user; grace's conv-1 holds her two turns; the
    # refused lines left nothing behind.
    by_user = {
        User.get_by_id(s.user_id).external_id: s
        for s in Session.select().where(Session.external_id == "conv-1")
    }
    assert set(by_user) == {"dana", "grace"}
    assert by_user["dana"].turn_count == 1 and by_user["grace"].turn_count == 2
    assert {s.external_id for s in Session.select()} == {"conv-1"}


def test_turns_of_a_users_session_append_as_before(store) -> None:
    org_id, _agent_id, session_id = make_session(store, "acme", turns=1)
    dana = store.resolve_user(org_id, external_id="dana")
    store.set_session_user(org_id, session_id, dana)
    result = store.append_turns(org_id, session_id, [turn("and another thing")])
    assert result.turn_count == 2
