"""``ibex_memory.create_memory``: the one-round-trip write runs under row-level security.

The function switches its transaction to the tenant role and org itself. These tests check that
it does, that the switch ends with the transaction (the service calls it as a single statement
in an implicit transaction), and that its outcomes are the ones the service expects.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import peewee
import pytest

from memories.canonical import content_hash
from memories.store import CREATE_SQL, MemoryStore, NewMemory, WriteOutcome, create_params
from tests.integration.memory_service.helpers import Tenant, memory_count


def new_memory(agent_id: uuid.UUID, content: str, key: str | None = None) -> NewMemory:
    return NewMemory(
        agent_id=agent_id,
        content=content,
        content_hash=content_hash(content),
        kind="fact",
        metadata={"n": 1},
        session_id=None,
        turn_index=None,
        ordinal=None,
        idempotency_key=key,
        fingerprint="f" * 64,
    )


def test_the_write_runs_as_the_tenant_role_with_the_org_set(
    db: Any, acme: Tenant, globex: Tenant
) -> None:
    MemoryStore(db).create(globex.org_id, new_memory(globex.agent_id, "globex only"))
    with db.atomic():  # keep the function's transaction open to look inside it
        db.execute_sql(CREATE_SQL, create_params(acme.org_id, new_memory(acme.agent_id, "a")))
        user, org = db.execute_sql(
            "SELECT current_user, current_setting('ibex.org_id', true)"
        ).fetchone()
        assert (user, org) == ("ibex_app", str(acme.org_id))
        # The connection is a superuser's, yet only acme's row is visible: RLS holds.
        rows = db.execute_sql("SELECT org_id FROM ibex_memory.memories").fetchall()
        assert [str(r[0]) for r in rows] == [str(acme.org_id)]


def test_the_switch_ends_with_the_statement(db: Any, acme: Tenant) -> None:
    row = db.execute_sql(CREATE_SQL, create_params(acme.org_id, new_memory(acme.agent_id, "a")))
    assert row.fetchone()[0] == "created"
    user, org = db.execute_sql(
        "SELECT current_user, current_setting('ibex.org_id', true)"
    ).fetchone()
    assert user != "ibex_app"
    assert org in (None, "")


def test_outcomes(db: Any, acme: Tenant, globex: Tenant) -> None:
    store = MemoryStore(db)
    created = store.create(acme.org_id, new_memory(acme.agent_id, "Dana likes tea", key="k"))
    assert created.outcome is WriteOutcome.CREATED
    assert created.row is not None and created.row.metadata == {"n": 1}
    same_key = store.create(acme.org_id, new_memory(acme.agent_id, "other", key="k"))
    assert same_key.outcome is WriteOutcome.KEY_EXISTS
    assert same_key.row is not None and same_key.row.id == created.row.id
    same_content = store.create(acme.org_id, new_memory(acme.agent_id, "DANA  likes tea"))
    assert same_content.outcome is WriteOutcome.CONTENT_EXISTS
    assert same_content.row is not None and same_content.row.id == created.row.id
    # Another org's key and content are its own business.
    other = store.create(globex.org_id, new_memory(globex.agent_id, "Dana likes tea", key="k"))
    assert other.outcome is WriteOutcome.CREATED
    # An agent of another org is unknown here; an unknown org is refused.
    assert (
        store.create(acme.org_id, new_memory(globex.agent_id, "x")).outcome
        is WriteOutcome.UNKNOWN_AGENT
    )
    assert (
        store.create(uuid.uuid4(), new_memory(acme.agent_id, "y")).outcome
        is WriteOutcome.UNKNOWN_ORG
    )
    assert memory_count(db) == 2


@pytest.mark.parametrize("deleted_first", [True, False])
def test_soft_deleted_content_is_free_again(db: Any, acme: Tenant, deleted_first: bool) -> None:
    store = MemoryStore(db)
    first = store.create(acme.org_id, new_memory(acme.agent_id, "note"))
    assert first.row is not None
    if deleted_first:
        assert store.soft_delete(acme.org_id, first.row.id)
    again = store.create(acme.org_id, new_memory(acme.agent_id, "note"))
    expected = WriteOutcome.CREATED if deleted_first else WriteOutcome.CONTENT_EXISTS
    assert again.outcome is expected


def test_the_source_session_must_be_of_the_memorys_org(
    db: Any, acme: Tenant, globex: Tenant
) -> None:
    store = MemoryStore(db)
    ours = dataclasses.replace(new_memory(acme.agent_id, "ours"), session_id=acme.session_id)
    assert store.create(acme.org_id, ours).outcome is WriteOutcome.CREATED
    for session in (globex.session_id, uuid.uuid4()):  # another org's, and none at all
        theirs = dataclasses.replace(
            new_memory(acme.agent_id, f"from {session}"), session_id=session
        )
        assert store.create(acme.org_id, theirs).outcome is WriteOutcome.UNKNOWN_SESSION
    # An unknown org is still reported as such, whatever the session.
    stray = dataclasses.replace(new_memory(acme.agent_id, "stray"), session_id=uuid.uuid4())
    assert store.create(uuid.uuid4(), stray).outcome is WriteOutcome.UNKNOWN_ORG
    assert memory_count(db) == 1


def test_the_database_itself_refuses_a_foreign_source_session(
    db: Any, acme: Tenant, globex: Tenant
) -> None:
    # Not the service's path: the owner's plain INSERT, which row-level security does not
    # restrict (a superuser), is refused by the constraint all the same.
    with pytest.raises(peewee.IntegrityError, match="memories_source_session_fkey"), db.atomic():
        db.execute_sql(
            "INSERT INTO ibex_memory.memories (org_id, agent_id, session_id, content, content_hash)"
            " VALUES (%s, %s, %s, 'x', 'h')",
            (str(acme.org_id), str(acme.agent_id), str(globex.session_id)),
        )
    assert memory_count(db) == 0
