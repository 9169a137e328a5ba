"""User-scoped search on 20,000 memories: the candidate branches are narrowed to the
reader's users inside the index lookups (migration 000013), so one person's memories are never
crowded out of the capped branches by other people's, and the plan still reads the indexes."""

from __future__ import annotations

import uuid
from typing import Any

from memories.scope import ReadScope
from memories.search.store import WORD_CANDIDATES, SearchStore
from tests.integration.memory_service.helpers import Tenant


def _seed(db: Any, acme: Tenant) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """50 users with 400 memories each mentioning allergies (20,000, the newest), Dana's 3 older
    ones, and 200 agent-wide ones."""
    org, agent = str(acme.org_id), str(acme.agent_id)
    db.execute_sql(
        "INSERT INTO ibex_core.users (org_id, external_id)"
        " SELECT %s, 'person-' || g FROM generate_series(1, 50) g",
        (org,),
    )
    (dana,) = db.execute_sql(
        "INSERT INTO ibex_core.users (org_id, external_id) VALUES (%s, 'dana') RETURNING id",
        (org,),
    ).fetchone()
    db.execute_sql(
        """
        INSERT INTO ibex_memory.memories (org_id, agent_id, user_id, content, content_hash,
                                          created_at)
        SELECT %s, %s, u.id, 'Allergic note ' || g || ' of ' || u.external_id,
               md5(g::text || u.id::text), now() - make_interval(secs => g)
          FROM generate_series(1, 400) g
         CROSS JOIN (SELECT id, external_id FROM ibex_core.users
                      WHERE org_id = %s AND external_id LIKE 'person-%%') u
        """,
        (org, agent, org),
    )
    danas = db.execute_sql(
        """
        INSERT INTO ibex_memory.memories (org_id, agent_id, user_id, content, content_hash,
                                          created_at)
        SELECT %s, %s, %s, 'Dana is allergic to item ' || g, md5('dana' || g),
               now() - interval '30 days' - make_interval(secs => g)
          FROM generate_series(1, 3) g
        RETURNING id
        """,
        (org, agent, str(dana)),
    ).fetchall()
    db.execute_sql(
        """
        INSERT INTO ibex_memory.memories (org_id, agent_id, content, content_hash, created_at)
        SELECT %s, %s, 'Shared routine ' || g || ' for colour ' || (g %% 7), md5('s' || g),
               now() - interval '60 days'
          FROM generate_series(1, 200) g
        """,
        (org, agent),
    )
    db.execute_sql("ANALYZE ibex_memory.memories")
    return uuid.UUID(str(dana)), [uuid.UUID(str(r[0])) for r in danas]


def test_one_users_memories_are_not_crowded_out_and_the_plan_reads_the_indexes(
    db: Any, acme: Tenant
) -> None:
    dana, danas = _seed(db, acme)
    searches = SearchStore(db)
    scope = ReadScope(user_id=dana, named=True)
    # 20,000 newer memories of other people hold "allergic", far more than a branch's cap.
    assert WORD_CANDIDATES < 20_000
    hits = searches.search(acme.org_id, acme.agent_id, "allergic", limit=10, scope=scope)
    assert {h.row.id for h in hits} == set(danas)
    assert all(h.row.user_id == dana for h in hits)
    # Without a user: the agent-wide ones only (none says allergic), never a person's.
    assert searches.search(acme.org_id, acme.agent_id, "allergic", limit=10) == []
    shared = searches.search(acme.org_id, acme.agent_id, "routine colour", limit=10, scope=scope)
    assert len(shared) == 10 and all(h.row.user_id is None for h in shared)
    everyone = ReadScope(all_users=True)
    assert (
        len(searches.search(acme.org_id, acme.agent_id, "allergic", limit=50, scope=everyone)) == 50
    )

    plan = searches.explain(acme.org_id, acme.agent_id, "allergic routine", scope=scope)
    assert "Index" in plan, plan
    # The user condition is in each branch, next to the agent's scope.
    assert f"user_id = '{dana}'::uuid" in plan, plan
    for line in plan.splitlines():
        if "Seq Scan on memories" in line:
            assert "rows=1 loops=1" in line, plan


def test_the_profile_read_and_pinned_ids_keep_to_the_readers_scope(db: Any, acme: Tenant) -> None:
    """A context's standing facts are chosen from the reader's memories and the agent-wide
    ones, newest first, never another person's, however many the others hold; an id of
    another person's memory pinned into the ranking is dropped, not returned."""
    dana, danas = _seed(db, acme)
    searches = SearchStore(db)
    scope = ReadScope(user_id=dana, named=True)
    rows = searches.profile(acme.org_id, acme.agent_id, scope, limit=201)
    assert len(rows) == 201 and [r.id for r in rows[:3]] == danas
    assert {r.user_id for r in rows[3:]} == {None}
    assert rows == sorted(rows, key=lambda r: (r.created_at, r.id), reverse=True)
    only_dana = ReadScope(user_id=dana, named=True, include_shared=False)
    assert [r.id for r in searches.profile(acme.org_id, acme.agent_id, only_dana, limit=10)] == (
        danas
    )
    agent_wide = searches.profile(acme.org_id, acme.agent_id, ReadScope(), limit=10)
    assert len(agent_wide) == 10 and {r.user_id for r in agent_wide} == {None}
    everyone = ReadScope(all_users=True)
    assert searches.profile(acme.org_id, acme.agent_id, everyone, limit=10) == []

    (other,) = db.execute_sql(
        "SELECT id FROM ibex_memory.memories WHERE user_id IS NOT NULL AND user_id <> %s LIMIT 1",
        (str(dana),),
    ).fetchone()
    ranked = searches.rank(
        acme.org_id,
        acme.agent_id,
        "allergic",
        limit=10,
        scope=scope,
        pinned=[uuid.UUID(str(other)), danas[0]],
    )
    assert set(ranked.pinned) == {danas[0]}
    assert {h.row.id for h in ranked.hits} == set(danas)
