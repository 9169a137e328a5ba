"""Migration 000018: the near-duplicate check reads a band of one index, with 000014's answers.

near_duplicate_of now reads only the scope's memories with the same digits and a trigram
count that similarity allows; both are necessary conditions, so for any content it must name
the memory a check of every row names. Checked here against that brute force over memories
made to sit on either side of the threshold (one character changed, words added, digits
changed, lengths at the band's edges), and the plan is checked to read the index, with the
key's function inlined (000026), also in a connection that was open when 000026 or 000027 ran;
000027's pattern must give 000018's keys.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import psycopg2
import pytest

from core.db import tenant
from core.migrate import load_migrations
from memories.canonical import content_hash
from memories.store import MemoryStore, WriteOutcome
from tests.integration.memory_service.helpers import Tenant, new_fact

THRESHOLD = 0.9
BASES = [
    "The user is allergic to peanuts and carries an epinephrine pen.",
    "The user moved to Lisbon in March and works as a nurse at the city hospital.",
    "Dana plays the cello in a community orchestra on Thursday evenings.",
    "The user's flight 417 leaves from gate 12 at 9:40.",
]

BRUTE_SQL = """
SELECT m.id FROM ibex_memory.memories m
 WHERE m.org_id = %(org)s AND m.agent_id = %(agent)s AND m.user_id IS NULL
   AND m.deleted_at IS NULL AND m.superseded_by IS NULL
   AND similarity(m.content, %(q)s) >= %(t)s AND m.content_hash <> %(hash)s
   AND regexp_replace(m.content, '[^0-9]', '', 'g') = regexp_replace(%(q)s, '[^0-9]', '', 'g')
 ORDER BY similarity(m.content, %(q)s) DESC, m.created_at, m.id LIMIT 1
"""


def variants(rng: random.Random, text: str) -> list[str]:
    """Texts near ``text``: a character changed, dropped or doubled, a word added, a digit
    changed, the text cut or grown by a few words."""
    out = []
    for _ in range(6):
        i = rng.randrange(len(text))
        out.append(text[:i] + rng.choice("xyz") + text[i + 1 :])
        out.append(text[:i] + text[i + 1 :])
        out.append(text[:i] + text[i] + text[i:])
    words = text.split()
    out.append(" ".join(words[:-1]))
    out.append(" ".join(words[:-2]))
    out.append(text + " Really.")
    out.append(text.replace(".", " again."))
    out.append(" ".join([*words[:3], "now", *words[3:]]))
    out.append(text.replace("1", "2") if "1" in text else text + " 7")
    return out


def write(db: Any, tenant_: Tenant, content: str) -> uuid.UUID:
    # No near-duplicate check: every variant is stored.
    result = MemoryStore(db).create(tenant_.org_id, new_fact(tenant_.agent_id, content))
    assert result.outcome is WriteOutcome.CREATED, content
    assert result.row is not None
    return result.row.id


def test_the_check_names_the_memory_a_check_of_every_row_names(db: Any, acme: Tenant) -> None:
    (has_trgm,) = db.execute_sql("SELECT to_regprocedure('show_trgm(text)') IS NOT NULL").fetchone()
    if not has_trgm:
        pytest.skip("pg_trgm is not installed: there is no near-duplicate check")
    rng = random.Random(18)
    stored = []
    for base in BASES:
        stored.append(base)
        stored.extend(variants(rng, base)[::2])
    stored = list({content_hash(c): c for c in stored}.values())  # one per normalised text
    for content in stored:
        write(db, acme, content)
    queries = list(dict.fromkeys(q for base in BASES for q in variants(rng, base)))
    found = 0
    for query in queries:
        params = {
            "org": str(acme.org_id),
            "agent": str(acme.agent_id),
            "q": query,
            "t": THRESHOLD,
            "hash": content_hash(query),
        }
        brute = db.execute_sql(BRUTE_SQL, params).fetchone()
        with tenant(db, acme.org_id):
            (named,) = db.execute_sql(
                "SELECT ibex_memory.near_duplicate_of(%s::uuid, NULL::uuid, %s, %s, %s, NULL)",
                (str(acme.agent_id), query, content_hash(query), THRESHOLD),
            ).fetchone()
        expected = brute[0] if brute else None
        assert (str(named) if named else None) == (str(expected) if expected else None), query
        found += expected is not None
    # The set has both kinds: contents with a near-duplicate and contents without one.
    assert 0 < found < len(queries), (found, len(queries))


#: near_duplicate_of's statement (migration 000024), its parameters numbered: org, agent,
#: user, content, content hash, excluded ids, threshold, trigram count of the content.
CHECK_SQL = """
SELECT m.id FROM ibex_memory.memories m
 WHERE ibex_memory.near_duplicate_key(m.org_id, m.agent_id, m.user_id, m.content)
       = ibex_memory.near_duplicate_key($1, $2, $3, $4)
   AND cardinality(show_trgm(m.content))
       BETWEEN floor($7 * $8)::integer - 1 AND ceil($8 / $7)::integer + 1
   AND (m.deleted_at IS NULL AND m.superseded_by IS NULL) IS TRUE
   AND (m.org_id = $1 AND m.agent_id = $2 AND m.user_id IS NOT DISTINCT FROM $3) IS TRUE
   AND m.content % $4 AND m.content_hash <> $5
   AND NOT (m.id = ANY(COALESCE($6, '{}'::uuid[])))
 ORDER BY similarity(m.content, $4) DESC, m.created_at, m.id
 LIMIT 1
"""


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_the_check_reads_the_band_of_its_index(db: Any, acme: Tenant, plan_mode: str) -> None:
    """The plan for these values (custom) and the plan plpgsql keeps for the function's
    statement (generic: made for any parameters) both read the band of the index."""
    (has_index,) = db.execute_sql(
        "SELECT to_regclass('ibex_memory.idx_memories_near_duplicate') IS NOT NULL"
    ).fetchone()
    if not has_index:
        pytest.skip("pg_trgm is not installed: there is no near-duplicate check")
    for n in range(300):  # an agent with memories of many lengths and digits
        write(db, acme, f"Memory number {n} says the user likes item {n % 7}" + " more" * (n % 9))
    # No ANALYZE: with statistics that still say the agent has no memories, every index
    # looked as cheap as another, and the planner took one that reads the whole agent.
    query = "Memory number 12 says the user likes item 5 more more more"
    with db.atomic():
        db.execute_sql("SET LOCAL pg_trgm.similarity_threshold = 0.9")
        db.execute_sql(f"SET LOCAL plan_cache_mode = {plan_mode}")
        db.execute_sql(
            "PREPARE near_check (uuid, uuid, uuid, text, text, uuid[], real, integer) AS"
            + CHECK_SQL.replace("%", "%%")  # the driver formats the text it sends
        )
        try:
            plan = "\n".join(
                r[0]
                for r in db.execute_sql(
                    "EXPLAIN (ANALYZE) EXECUTE near_check(%s, %s, NULL, %s, 'none', NULL,"
                    " 0.9, cardinality(show_trgm(%s)))",
                    (str(acme.org_id), str(acme.agent_id), query, query),
                ).fetchall()
            )
        finally:
            db.execute_sql("DEALLOCATE near_check")
    assert "Index Scan using idx_memories_near_duplicate" in plan, plan
    assert "Index Cond" in plan, plan
    # The key's function is inlined (000026: no SET clause) on both sides of the condition,
    # so the index's expression matches the query's and no insert calls the function.
    assert "near_duplicate_key" not in plan, plan


def key_function_of(version: int) -> str:
    """The statement of migration ``version`` that made the key's function, as one that
    replaces the current one: 000018's has a SET clause (the index's expression is a call of
    the function), 000026's is inlined with the character-by-character pattern."""
    (migration,) = [m for m in load_migrations() if m.version == version]
    for made in ("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"):
        start = migration.sql.find(f"{made} ibex_memory.near_duplicate_key(")
        if start >= 0:
            statement = migration.sql[start : migration.sql.index(";", start) + 1]
            return statement.replace(made, "CREATE OR REPLACE FUNCTION", 1)
    raise AssertionError(f"migration {version} does not make near_duplicate_key")


#: The migrations that made the key's function again, in order: the last one's is current.
KEY_MIGRATIONS = (26, 27)


LOOKUP_PLAN = """
EXPLAIN SELECT m.id FROM ibex_memory.memories m
 WHERE ibex_memory.near_duplicate_key(m.org_id, m.agent_id, m.user_id, m.content)
       = ibex_memory.near_duplicate_key(%s, %s, NULL, 'Flight 417 at gate 12')
   AND cardinality(show_trgm(m.content)) BETWEEN 10 AND 40
   AND (m.deleted_at IS NULL AND m.superseded_by IS NULL) IS TRUE
"""


@pytest.mark.parametrize(
    ("version", "before", "loaded"),
    [
        # The index's expression loaded as a call of the function.
        (26, 18, "Index Cond: ((ibex_memory.near_duplicate_key("),
        # Loaded inlined, with 000026's pattern.
        (27, 26, "'[^0-9]'::text"),
    ],
)
def test_a_connection_open_across_the_key_change_still_reads_the_scopes_key(
    db: Any, database_url: str, acme: Tenant, version: int, before: int, loaded: str
) -> None:
    """A web process's pooled connection loaded the index's expression before the migration;
    its next plan of the lookup inlines the function as the migration made it. The migration
    makes it load the index again, so the two still match: the scope's key is an index
    condition, not a filter over the whole trigram-count band of every scope."""
    (has_index,) = db.execute_sql(
        "SELECT to_regclass('ibex_memory.idx_memories_near_duplicate') IS NOT NULL"
    ).fetchone()
    if not has_index:
        pytest.skip("pg_trgm is not installed: there is no near-duplicate check")
    migrations = {m.version: m for m in load_migrations()}
    migration = migrations[version]
    migrator = psycopg2.connect(database_url)
    open_before = psycopg2.connect(database_url)
    try:
        with migrator, migrator.cursor() as cur:
            cur.execute(key_function_of(before))

        def plan() -> str:
            with open_before, open_before.cursor() as cur:
                cur.execute(LOOKUP_PLAN, (str(acme.org_id), str(acme.agent_id)))
                return "\n".join(r[0] for r in cur.fetchall())

        planned = plan()  # the index's expression loaded from the earlier definition
        index_condition = next(x for x in planned.splitlines() if "Index Cond" in x)
        assert loaded in index_condition, planned
        with migrator, migrator.cursor() as cur:
            cur.execute(migration.sql)
        after = plan()
    finally:
        with migrator, migrator.cursor() as cur:
            for later in KEY_MIGRATIONS:  # the current definition, whatever happened
                cur.execute(migrations[later].sql)
        migrator.close()
        open_before.close()
    assert "near_duplicate_key" not in after, after
    key_condition = next(line for line in after.splitlines() if "Index Cond" in line)
    assert "regexp_replace" in key_condition, after
    assert ("'[^0-9]+'" in key_condition) == (version >= 27), after
    assert "Filter" not in after, after


def test_the_key_keeps_the_digits_000018_kept(db: Any) -> None:
    """000027 takes the non-digits out run by run; the key must be 000018's for every content
    (the index's entries were made with the old pattern and are not made again): digits at
    either end, none, only digits, other scripts' digits, spaces and line breaks."""
    rng = random.Random(27)
    alphabet = "ab 7Z0.9\n\t-٣１é😀_"
    contents = ["", "0", "abc", "123", " 1 ", "4a", "a4", "Flight 417 at gate 12 at 9:40."]
    contents += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
                 for _ in range(2000)]  # fmt: skip
    (differ,) = db.execute_sql(
        "SELECT count(*) FROM unnest(%s::text[]) AS c(t)"
        " WHERE split_part(ibex_memory.near_duplicate_key(gen_random_uuid(), gen_random_uuid(),"
        " NULL, t), '/', 4) <> regexp_replace(t, '[^0-9]', '', 'g')",
        (contents,),
    ).fetchone()
    assert differ == 0
