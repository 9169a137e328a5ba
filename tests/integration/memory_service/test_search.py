"""POST /v1/memories/search: ranking, filters, limits, tenancy, soft deletes and index use."""

from __future__ import annotations

import itertools
import re
import uuid
from typing import Any

import httpx
import pytest

from memories.search.store import WORD_CANDIDATES, SearchStore
from schema.memory import ErrorSchema
from schema.search import SearchResultSchema
from tests.integration.memory_service.helpers import Tenant, memory_body


def write(
    http: httpx.Client, tenant_: Tenant, content: str, session: uuid.UUID, **extra: Any
) -> str:
    body = memory_body(tenant_.agent_id, content=content, **extra)
    body["source"]["session_id"] = str(session)
    response = http.post("/v1/memories", json=body, headers=tenant_.headers())
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def search(http: httpx.Client, tenant_: Tenant, query: str, **extra: Any) -> list[dict[str, Any]]:
    body = {"query": query, "agent_id": str(tenant_.agent_id), **extra}
    response = http.post("/v1/memories/search", json=body, headers=tenant_.headers(tenant_.reader))
    assert response.status_code == 200, response.text
    result = SearchResultSchema().load(response.json())
    return response.json()["items"] if result is not None else []


@pytest.fixture
def session_id(store, acme: Tenant) -> uuid.UUID:  # type: ignore[no-untyped-def]
    return store.create_session(acme.org_id, acme.agent_id, "conv-search").id


def test_best_match_first_with_signals_and_snippet(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    allergy = write(http, acme, "Dana is allergic to peanuts.", session_id)
    write(http, acme, "Dana lives in Lisbon with her cat.", session_id)
    write(http, acme, "The user prefers tea over coffee.", session_id)
    hits = search(http, acme, "what is Dana allergic to?")
    assert [h["id"] for h in hits][:1] == [allergy]
    assert len(hits) == 2  # the tea memory shares no word with the query
    top = hits[0]
    assert 0 < top["score"] <= 1
    assert set(top["signals"]) == {"text", "trigram", "recency", "semantic"}
    assert 0 < top["signals"]["semantic"] <= 1  # the default local embedder
    assert top["signals"]["text"] > hits[1]["signals"]["text"]
    assert "<mark>allergic</mark>" in top["snippet"]
    assert hits[0]["score"] >= hits[1]["score"]


def test_a_misspelt_name_is_found_by_trigram(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID, app_db: Any
) -> None:
    if not SearchStore(app_db).trigram_available():
        pytest.skip("pg_trgm is not installed on this server")
    wanted = write(http, acme, "Priyanka moved to Toronto last spring.", session_id)
    write(http, acme, "The user drives a blue bicycle to work.", session_id)
    hits = search(http, acme, "Priyanca")
    assert [h["id"] for h in hits] == [wanted]
    assert hits[0]["signals"]["text"] == 0
    assert hits[0]["signals"]["trigram"] > 0.5


def test_without_trigram_full_text_still_ranks(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID, app_db: Any
) -> None:
    """The readyz details name the mode, and exact words match in either mode."""
    wanted = write(http, acme, "Marcus plays the cello on Sundays.", session_id)
    mode = http.get("/readyz").json()["details"]["search"]
    trigram = SearchStore(app_db).trigram_available()
    assert mode == ("full-text+trigram" if trigram else "full-text") + "+semantic"
    hits = search(http, acme, "cello")
    assert [h["id"] for h in hits] == [wanted]
    if not trigram:
        assert hits[0]["signals"]["trigram"] == 0


def test_kinds_and_session_filters(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID, store
) -> None:  # type: ignore[no-untyped-def]
    other_session = store.create_session(acme.org_id, acme.agent_id, "conv-other").id
    fact = write(http, acme, "Noor owns a red kayak.", session_id)
    pref = write(http, acme, "Noor prefers kayak trips at dawn.", session_id, kind="preference")
    elsewhere = write(http, acme, "Noor sold the old kayak.", other_session)
    assert {h["id"] for h in search(http, acme, "kayak")} == {fact, pref, elsewhere}
    assert [h["id"] for h in search(http, acme, "kayak", kinds=["preference"])] == [pref]
    in_session = search(http, acme, "kayak", session_id=str(session_id))
    assert {h["id"] for h in in_session} == {fact, pref}
    kinds = ["fact", "event"]
    assert [h["id"] for h in search(http, acme, "kayak", kinds=kinds, limit=5)][:1] in (
        [fact],
        [elsewhere],
    )
    assert {h["kind"] for h in search(http, acme, "kayak", kinds=kinds)} == {"fact"}


def test_other_agents_are_not_searched(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID, store
) -> None:  # type: ignore[no-untyped-def]
    helper = store.ensure_agent(acme.org_id, "helper")
    mine = write(http, acme, "Ines collects vinyl records.", session_id)
    body = memory_body(helper, content="Ines also collects stamps.")
    body["source"]["session_id"] = str(session_id)
    assert http.post("/v1/memories", json=body, headers=acme.headers()).status_code == 201
    assert [h["id"] for h in search(http, acme, "Ines collects")] == [mine]


def test_the_agent_by_slug_finds_what_its_id_finds(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    wanted = write(http, acme, "Dana is allergic to peanuts.", session_id)
    by_slug = {"query": "peanuts", "agent": "bot"}
    response = http.post("/v1/memories/search", json=by_slug, headers=acme.headers(acme.reader))
    assert response.status_code == 200, response.text
    assert [h["id"] for h in response.json()["items"]] == [wanted]
    assert response.json()["items"] == search(http, acme, "peanuts")
    # Neither agent nor agent_id: which agent to search is not guessed.
    response = http.post("/v1/memories/search", json={"query": "peanuts"}, headers=acme.headers())
    assert response.status_code == 422 and "agent" in response.json()["error"]["fields"]


@pytest.mark.parametrize("named", [{"agent": "suport-bot"}, {"agent_id": str(uuid.uuid4())}])
def test_an_unknown_agent_is_404_not_an_empty_list(
    http: httpx.Client, acme: Tenant, named: dict[str, str]
) -> None:
    body = {"query": "peanuts", **named}
    response = http.post("/v1/memories/search", json=body, headers=acme.headers(acme.reader))
    assert response.status_code == 404, response.text
    error = ErrorSchema().load(response.json())["error"]
    assert error["code"] == "UNKNOWN_AGENT"
    assert error["message"] == f"no agent {next(iter(named.values()))!r} in this org"


def test_limit_and_order(http: httpx.Client, acme: Tenant, session_id: uuid.UUID) -> None:
    for i in range(6):
        write(http, acme, f"Walrus fact number {i}.", session_id)
    hits = search(http, acme, "walrus", limit=4)
    assert len(hits) == 4
    # Equal text scores; the semantic bonus tells them apart, then recency (newest first).
    assert {h["signals"]["text"] for h in hits} == {hits[0]["signals"]["text"]}
    order = [(-h["score"], h["created_at"]) for h in hits]
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    for (s1, c1), (s2, c2) in itertools.pairwise(order):
        assert s1 < s2 or (s1 == s2 and c1 >= c2)
    assert search(http, acme, "walrus", limit=4) == hits  # deterministic


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 51}, "limit"),
        ({"limit": True}, "limit"),
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "a\x00b"}, "query"),
        ({"kinds": ["memo"]}, "kinds"),
        ({"kinds": []}, "kinds"),
        ({"agent_id": "not-a-uuid"}, "agent_id"),
        ({"agent": "bot"}, "agent"),  # both agent and agent_id
        ({"agent_id": None}, "agent_id"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_bodies_are_422(
    http: httpx.Client, acme: Tenant, body: dict[str, Any], field: str
) -> None:
    full = {"query": "peanuts", "agent_id": str(acme.agent_id), **body}
    response = http.post("/v1/memories/search", json=full, headers=acme.headers())
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "VALIDATION_FAILED"
    assert field in response.json()["error"]["fields"]


def test_a_query_of_no_words_finds_nothing(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    write(http, acme, "Dana is allergic to peanuts.", session_id)
    assert search(http, acme, "?!&|:*()'") == []
    assert search(http, acme, "the of and") == []


def test_needs_a_token_with_read_scope(http: httpx.Client, acme: Tenant, db) -> None:  # type: ignore[no-untyped-def]
    from tests.integration.memory_service.helpers import make_token

    body = {"query": "peanuts", "agent_id": str(acme.agent_id)}
    assert http.post("/v1/memories/search", json=body).status_code == 401
    writer_only, _ = make_token(db, acme.org_id, ["memory:write"])
    response = http.post("/v1/memories/search", json=body, headers=acme.headers(writer_only))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "INSUFFICIENT_SCOPE"


def test_another_orgs_memories_are_never_returned(
    http: httpx.Client, acme: Tenant, globex: Tenant, session_id: uuid.UUID, store
) -> None:  # type: ignore[no-untyped-def]
    globex_session = store.create_session(globex.org_id, globex.agent_id, "conv-g").id
    write(http, acme, "Dana is allergic to peanuts.", session_id)
    theirs = write(http, globex, "Dana is allergic to peanuts and shellfish.", globex_session)
    # globex asking with acme's agent id, and acme asking with globex's: nothing crosses, and
    # the other org's agent is not one of the caller's (404, as for any unknown agent).
    crossed = {"query": "Dana peanuts", "agent_id": str(acme.agent_id)}
    response = http.post("/v1/memories/search", json=crossed, headers=globex.headers())
    assert (response.status_code, response.json()["error"]["code"]) == (404, "UNKNOWN_AGENT")
    crossed["agent_id"] = str(globex.agent_id)
    response = http.post("/v1/memories/search", json=crossed, headers=acme.headers())
    assert (response.status_code, response.json()["error"]["code"]) == (404, "UNKNOWN_AGENT")
    assert [h["id"] for h in search(http, globex, "Dana peanuts")] == [theirs]


def test_soft_deleted_memories_are_never_returned(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    gone = write(http, acme, "Tomas is vegetarian.", session_id)
    kept = write(http, acme, "Tomas is learning Italian.", session_id)
    assert {h["id"] for h in search(http, acme, "Tomas")} == {gone, kept}
    assert http.delete(f"/v1/memories/{gone}", headers=acme.headers()).status_code == 204
    assert [h["id"] for h in search(http, acme, "Tomas vegetarian")] == [kept]


def test_a_memory_with_every_word_is_found_beyond_the_per_word_cap(
    db, acme: Tenant, session_id: uuid.UUID
) -> None:  # type: ignore[no-untyped-def]
    """Each word's branch takes only its newest matches (WORD_CANDIDATES); a memory holding
    every word of the query but older than all of those is still a candidate (the branch of
    all the words) and, matching both words, ranks first."""
    newer = WORD_CANDIDATES + 20
    db.execute_sql(
        """
        INSERT INTO ibex_memory.memories
            (org_id, agent_id, session_id, content, content_hash, created_at)
        SELECT %(org)s, %(agent)s, %(session)s, c.content, md5(c.content), c.at
          FROM (SELECT 'Walrus note ' || g AS content, now() - make_interval(mins => g) AS at
                  FROM generate_series(1, %(newer)s) g
                UNION ALL
                SELECT 'Harbour note ' || g, now() - make_interval(mins => g)
                  FROM generate_series(1, %(newer)s) g
                UNION ALL
                SELECT 'The walrus sleeps by the harbour.', now() - interval '30 days') c
        """,
        {"org": str(acme.org_id), "agent": str(acme.agent_id), "session": str(session_id),
         "newer": newer},
    )  # fmt: skip
    hits = SearchStore(db).search(acme.org_id, acme.agent_id, "walrus harbour", limit=5)
    assert hits[0].row.content == "The walrus sleeps by the harbour.", [h.row.content for h in hits]
    assert hits[0].text > hits[1].text


def _has_index(db, name: str) -> bool:  # type: ignore[no-untyped-def]
    row = db.execute_sql("SELECT to_regclass(%s) IS NOT NULL", (f"ibex_memory.{name}",))
    return bool(row.fetchone()[0])


def test_the_plan_uses_the_indexes(db, acme: Tenant, session_id: uuid.UUID) -> None:  # type: ignore[no-untyped-def]
    """On 20,000 memories over 4 agents, the plan reads the full-text index for a rare word,
    the agent index (newest first, stopping at the cap) for a word every memory has, and never
    scans the table; the results are right. Where btree_gin is installed the full-text and
    trigram indexes hold the agent as a key (the index itself returns only the agent's rows);
    elsewhere the org-wide indexes serve."""
    db.execute_sql(
        "INSERT INTO ibex_core.agents (org_id, slug)"
        " SELECT %s, 'filler-' || g FROM generate_series(1, 3) g",
        (str(acme.org_id),),
    )
    db.execute_sql(
        """
        INSERT INTO ibex_memory.memories (org_id, agent_id, session_id, content, content_hash)
        SELECT %s, a.id, %s,
               'Filler memory ' || g || ' about topic ' || (g %% 500) || ' and colour '
                   || (ARRAY['red','green','blue','amber'])[1 + g %% 4]
                   || CASE WHEN g %% 400 = 7 THEN ' with a zebra' ELSE '' END,
               md5(g::text || a.id::text)
          FROM generate_series(1, 5000) g
         CROSS JOIN (SELECT id FROM ibex_core.agents WHERE org_id = %s) a
        """,
        (str(acme.org_id), str(session_id), str(acme.org_id)),
    )
    per_agent = _has_index(db, "idx_memories_fts_agent")
    fts_index = "idx_memories_fts_agent" if per_agent else "idx_memories_fts"
    # What autovacuum does after a bulk load: the GIN pending lists merged, statistics taken.
    db.execute_sql("SELECT gin_clean_pending_list(%s::regclass)", (f"ibex_memory.{fts_index}",))
    db.execute_sql("ANALYZE ibex_memory.memories")
    searches = SearchStore(db)
    plan = searches.explain(acme.org_id, acme.agent_id, "zebra topic")
    assert f"Bitmap Index Scan on {fts_index} " in plan, plan
    if per_agent:
        assert f"Index Cond: ((agent_id = '{acme.agent_id}'::uuid) AND (content_tsv @@" in plan
    assert "idx_memories_agent" in plan, plan
    # A sequential scan may only appear as the probe that stops at the first memory holding a
    # common word (the gate of its trigram branch).
    for line in plan.splitlines():
        if "Seq Scan on memories" in line:
            assert "rows=1 loops=1" in line, plan
    hits = searches.search(acme.org_id, acme.agent_id, "zebra topic", limit=5)
    assert len(hits) == 5
    assert sum("zebra" in h.row.content for h in hits[:3]) == 3, [h.row.content for h in hits]


def test_a_typo_reads_only_the_agents_trigrams(db, acme: Tenant, session_id: uuid.UUID) -> None:  # type: ignore[no-untyped-def]
    """A word the full-text branch found as such runs no trigram branch; a misspelt word's
    does, and finds only the agent's memories; the branch of all the words does not run.
    Where btree_gin is installed the trigram index holds the agent as a key: the index itself
    returns only the agent's 20 rows, none of the other agent's 2,000 (no row is read from the
    table and then dropped)."""
    searches = SearchStore(db)
    if not searches.trigram_available():
        pytest.skip("pg_trgm is not installed on this server")
    db.execute_sql(
        "INSERT INTO ibex_core.agents (org_id, slug) VALUES (%s, 'other-agent')",
        (str(acme.org_id),),
    )
    # 2,000 memories of another agent mention Priyanka; 20 of ours do.
    db.execute_sql(
        """
        INSERT INTO ibex_memory.memories (org_id, agent_id, session_id, content, content_hash)
        SELECT %s, CASE WHEN g <= 20 THEN %s::uuid ELSE a.id END, %s,
               'Priyanka note ' || g || ' about tennis', md5(g::text)
          FROM generate_series(1, 2020) g,
               (SELECT id FROM ibex_core.agents WHERE slug = 'other-agent' AND org_id = %s) a
        """,
        (str(acme.org_id), str(acme.agent_id), str(session_id), str(acme.org_id)),
    )
    db.execute_sql("ANALYZE ibex_memory.memories")
    plan = searches.explain(acme.org_id, acme.agent_id, "Priyanca tennis")
    assert "-- candidate branch: trigram 'priyanca'\n" in plan, plan
    assert "-- candidate branch: trigram 'tennis': not run" in plan, plan
    # No memory holds both words when one of them alone is in none.
    assert "-- candidate branch: all 'priyanca & tennis': not run" in plan, plan
    hits = searches.search(acme.org_id, acme.agent_id, "Priyanca", limit=50)
    assert len(hits) == 20
    assert all(h.row.agent_id == acme.agent_id for h in hits)
    if not _has_index(db, "idx_memories_trgm_agent"):
        return
    # The index on its own: on a table this small the planner prefers a scan or another index
    # on the agent (20 rows to filter), so those are set aside in a transaction rolled back.
    with db.atomic() as txn:
        others = db.execute_sql(
            "SELECT i.indexrelid::regclass::text FROM pg_index i"
            " WHERE i.indrelid = 'ibex_memory.memories'::regclass"
            "   AND i.indexrelid <> 'ibex_memory.idx_memories_trgm_agent'::regclass"
            "   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)"
        ).fetchall()
        for (name,) in others:
            db.execute_sql(f"DROP INDEX {name}")
        # The unique key (id, org, agent) that vectors reference (000031) holds the agent
        # too, as its third column: set aside with the reference (rolled back with the rest).
        db.execute_sql(
            "ALTER TABLE ibex_memory.memories DROP CONSTRAINT memories_id_org_agent CASCADE"
        )
        db.execute_sql("SELECT set_config('enable_seqscan', 'off', true)")
        rows = db.execute_sql(
            "EXPLAIN ANALYZE SELECT count(*) FROM ibex_memory.memories"
            " WHERE agent_id = %s AND content %%> 'priyanca' AND deleted_at IS NULL",
            (str(acme.agent_id),),
        ).fetchall()
        txn.rollback()
    assert _has_index(db, "idx_memories_agent")
    branch = "\n".join(r[0] for r in rows)
    index_line = next((x for x in branch.splitlines() if "Bitmap Index Scan" in x), branch)
    assert "on idx_memories_trgm_agent" in index_line, branch
    assert f"Index Cond: ((agent_id = '{acme.agent_id}'::uuid) AND (content %> " in branch
    assert re.search(r"rows=20(\.00)? loops=1", index_line), branch  # PostgreSQL 18: 20.00
    assert "Rows Removed" not in branch, branch
