"""Migration 000017: the vectors partitioned by agent, and the semantic branch's three paths.

- the table is hash-partitioned by agent (32 partitions, in a schema with no grants), and a
  read that names the agent reads one partition;
- the migration moves the vectors 000016 stored into the partitions, keeps the replace (ON
  CONFLICT) path of the backfill working, and rebuilds 000016's HNSW index per partition;
- on pgvector (IBEX_TEST_SERVERS=embedded): a scope of at most 5,000 vectors is ranked
  exactly, a larger one from its partition's HNSW index, and a user's few vectors within a
  large agent still come back, all of them, nearest first;
- migration 000031: a vector's keys are its memory's (id, org, agent) and its model's.
"""

from __future__ import annotations

import dataclasses
import math
import re
import uuid
from pathlib import Path
from typing import Any

import peewee
import pytest

from core.db import make_database, tenant
from core.migrate import load_migrations, migrate
from memories.store import MemoryStore, NewMemory, WriteOutcome
from memories.vectors import EmbeddingStore
from sessions.store import SessionStore
from tests.integration.memory_service.helpers import Tenant, new_fact
from tests.servers import RunPostgres

MODEL = "test:partitions"
DIMENSION = 8

CANDIDATES_SQL = (
    "SELECT id, similarity FROM ibex_memory.semantic_candidates(%s::uuid, %s, %s::real[], %s,"
    " 500, NULL::uuid, NULL::text[], false, %s, %s::uuid, %s)"
)


def unit(values: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def axis(i: int, dimension: int = DIMENSION) -> list[float]:
    """A unit vector near axis ``i % dimension``, tilted a little by ``i`` (no two alike)."""
    values = [0.01 * ((i * 7 + k * 3) % 11) for k in range(dimension)]
    values[i % dimension] += 1.0
    return unit(values)


@pytest.fixture
def registered(db: Any) -> None:
    """The model registered, as the memory service registers its configured model at start
    (a vector of an unregistered model is not stored)."""
    EmbeddingStore(db).register(MODEL, DIMENSION)


def new_memory(agent_id: uuid.UUID, content: str, vector: list[float] | None) -> NewMemory:
    if vector is None:
        return new_fact(agent_id, content)
    return new_fact(agent_id, content, embedding_model=MODEL, embedding=tuple(vector))


def test_vectors_are_partitioned_by_agent_and_a_read_naming_the_agent_reads_one_partition(
    db: Any, acme: Tenant, registered: None
) -> None:
    (strategy, partitions) = db.execute_sql(
        "SELECT p.partstrat, (SELECT count(*) FROM pg_inherits h WHERE h.inhparent = p.partrelid)"
        " FROM pg_partitioned_table p"
        " WHERE p.partrelid = 'ibex_memory.memory_embeddings'::regclass"
    ).fetchone()
    assert (strategy, partitions) == ("h", 32)
    (schemas,) = db.execute_sql(
        "SELECT array_agg(DISTINCT n.nspname) FROM pg_inherits h"
        " JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE h.inhparent = 'ibex_memory.memory_embeddings'::regclass"
    ).fetchone()
    assert schemas == ["ibex_memory_parts"]
    (usage,) = db.execute_sql(
        "SELECT has_schema_privilege('ibex_app', 'ibex_memory_parts', 'USAGE')"
    ).fetchone()
    assert usage is False  # the partitions are reached through the parent only

    result = MemoryStore(db).create(acme.org_id, new_memory(acme.agent_id, "a note", axis(0)))
    assert result.outcome is WriteOutcome.CREATED
    plan = "\n".join(
        r[0]
        for r in db.execute_sql(
            "EXPLAIN SELECT 1 FROM ibex_memory.memory_embeddings e"
            " WHERE e.memory_id = %s AND e.model = %s AND e.agent_id = %s",
            (str(result.row.id), MODEL, str(acme.agent_id)),
        ).fetchall()
    )
    assert len(re.findall(r" on memory_embeddings_p[0-9]+ ", plan)) == 1, plan
    (partition,) = db.execute_sql(
        "SELECT tableoid::regclass::text FROM ibex_memory.memory_embeddings"
    ).fetchone()
    assert partition.startswith("ibex_memory_parts.memory_embeddings_p")


def test_a_vectors_org_and_agent_are_its_memorys(
    db: Any, store: Any, acme: Tenant, registered: None
) -> None:
    """Migration 000031: the vector references its memory by (id, org, agent), which ties
    it to the memory's org and agent (their own keys are gone); a vector filed under another
    agent of the org is refused, and erasing the memory erases its vectors."""
    keys = db.execute_sql(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'ibex_memory.memory_embeddings'::regclass AND contype = 'f'"
        " ORDER BY conname"
    ).fetchall()
    assert [k[0] for k in keys] == [
        "FOREIGN KEY (memory_id, org_id, agent_id) REFERENCES"
        " ibex_memory.memories(id, org_id, agent_id) ON DELETE CASCADE",
        "FOREIGN KEY (model, dimension) REFERENCES ibex_memory.embedding_models(model, dimension)",
    ]
    created = MemoryStore(db).create(acme.org_id, new_memory(acme.agent_id, "a note", axis(1)))
    assert created.outcome is WriteOutcome.CREATED and created.row is not None
    memory_id = str(created.row.id)
    other_agent = store.ensure_agent(acme.org_id, "other")
    with pytest.raises(peewee.IntegrityError) as refused, db.atomic():
        db.execute_sql(
            "INSERT INTO ibex_memory.memory_embeddings"
            " (org_id, memory_id, agent_id, model, dimension, embedding)"
            " VALUES (%s, %s, %s, %s, %s, %s::real[])",
            (str(acme.org_id), memory_id, str(other_agent), MODEL, DIMENSION, axis(2)),
        )
    assert refused.value.orig.diag.constraint_name == "memory_embeddings_memory_fkey"
    vectors = "SELECT count(*) FROM ibex_memory.memory_embeddings WHERE memory_id = %s"
    assert db.execute_sql(vectors, (memory_id,)).fetchone() == (1,)
    db.execute_sql("DELETE FROM ibex_memory.memories WHERE id = %s", (memory_id,))
    assert db.execute_sql(vectors, (memory_id,)).fetchone() == (0,)


@pytest.fixture
def database_at_000016(postgres_server: RunPostgres, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A new database migrated up to 000016 only (the files before 000017), dropped after."""
    url = postgres_server.create(f"mig17_{uuid.uuid4().hex[:8]}")
    folder = tmp_path / "migrations"
    folder.mkdir()
    for migration in load_migrations():
        if migration.name < "000017":
            (folder / migration.name).write_text(migration.sql, encoding="utf-8")
    assert migrate(url, folder)[-1] == "000016_semantic.sql"
    yield url
    postgres_server.drop(url)


def test_the_migration_moves_000016s_vectors_into_the_partitions(database_at_000016: str) -> None:
    db = make_database(database_at_000016)
    try:
        sessions = SessionStore(db)
        org_id = sessions.ensure_org("partitions")
        agents = [sessions.ensure_agent(org_id, f"agent-{n}") for n in range(3)]
        memories = MemoryStore(db)
        written = {}
        for n in range(9):
            agent_id = agents[n % 3]
            vector = axis(n)
            result = memories.create(org_id, new_memory(agent_id, f"memory {n}", vector))
            assert result.outcome is WriteOutcome.CREATED
            written[result.row.id] = (agent_id, vector)
        (had_index,) = db.execute_sql(
            "SELECT to_regclass('ibex_memory.idx_memory_embeddings_hnsw_256') IS NOT NULL"
        ).fetchone()
    finally:
        db.close()

    assert migrate(database_at_000016)[0] == "000017_vector_partitions.sql"

    db = make_database(database_at_000016)
    try:
        rows = db.execute_sql(
            "SELECT memory_id, agent_id, embedding, tableoid::regclass::text"
            " FROM ibex_memory.memory_embeddings"
        ).fetchall()
        assert {uuid.UUID(str(r[0])): uuid.UUID(str(r[1])) for r in rows} == {
            k: v[0] for k, v in written.items()
        }
        for memory_id, _, embedding, partition in rows:
            expected = written[uuid.UUID(str(memory_id))][1]
            assert embedding == pytest.approx(expected, abs=1e-6)
            assert partition.startswith("ibex_memory_parts.memory_embeddings_p")
        (old,) = db.execute_sql(
            "SELECT to_regclass('ibex_memory.memory_embeddings_000016')"
        ).fetchone()
        assert old is None
        # The backfill's replace (ON CONFLICT on the new key) still replaces, never adds.
        first = next(iter(written))
        embeddings = EmbeddingStore(db)
        assert embeddings.put(org_id, MODEL, DIMENSION, [(first, axis(5))]) == 1
        (count,) = db.execute_sql("SELECT count(*) FROM ibex_memory.memory_embeddings").fetchone()
        assert count == 9
        (stored,) = db.execute_sql(
            "SELECT embedding FROM ibex_memory.memory_embeddings WHERE memory_id = %s",
            (str(first),),
        ).fetchone()
        assert stored == pytest.approx(axis(5), abs=1e-6)
        # 000016's HNSW index (pgvector only) is there again, on every partition, valid.
        if had_index:
            (valid, parts) = db.execute_sql(
                "SELECT i.indisvalid, (SELECT count(*) FROM pg_inherits h"
                "  WHERE h.inhparent = i.indexrelid)"
                " FROM pg_index i"
                " WHERE i.indexrelid = 'ibex_memory.idx_memory_embeddings_hnsw_256'::regclass"
            ).fetchone()
            assert (valid, parts) == (True, 32)
    finally:
        db.close()


def _bulk_agent(db: Any, org_id: uuid.UUID, agent_id: uuid.UUID, count: int) -> None:
    """``count`` memories of the agent with a vector each (as the owner, in two statements):
    vectors about the first 128 axes of 256 dimensions, none near the last axis."""
    db.execute_sql(
        "INSERT INTO ibex_memory.memories (org_id, agent_id, content, content_hash, kind)"
        " SELECT %s, %s, 'bulk ' || g, md5('bulk' || g), 'fact'"
        " FROM generate_series(1, %s) g",
        (str(org_id), str(agent_id), count),
    )
    db.execute_sql(
        "INSERT INTO ibex_memory.embedding_models (model, dimension) VALUES (%s, 256)"
        " ON CONFLICT DO NOTHING",
        (MODEL,),
    )
    db.execute_sql(
        "INSERT INTO ibex_memory.memory_embeddings"
        " (org_id, memory_id, agent_id, model, dimension, embedding)"
        " SELECT m.org_id, m.id, m.agent_id, %s, 256,"
        "        ARRAY(SELECT CASE WHEN k = 1 + (g.n %% 128) THEN 0.99 ELSE 0.0063 END"
        "                FROM generate_series(1, 256) k)::real[]"
        "   FROM (SELECT id, org_id, agent_id, row_number() OVER (ORDER BY id) AS n"
        "           FROM ibex_memory.memories WHERE agent_id = %s"
        "            AND content LIKE 'bulk %%') m, LATERAL (SELECT m.n) g(n)",
        (MODEL, str(agent_id)),
    )
    db.execute_sql("ANALYZE ibex_memory.memory_embeddings")


def _candidates(
    db: Any,
    org_id: uuid.UUID,
    agent_id: uuid.UUID,
    query: list[float],
    *,
    user_id: uuid.UUID | None = None,
    all_users: bool = False,
) -> tuple[list[tuple[uuid.UUID, float]], bool]:
    """The function's answer, and whether it took the HNSW path (it sets the iterative scan
    for the transaction there, and only there)."""
    with tenant(db, org_id):
        rows = db.execute_sql(
            CANDIDATES_SQL,
            (str(agent_id), MODEL, query, 10, all_users, str(user_id) if user_id else None, False),
        ).fetchall()
        (scan,) = db.execute_sql("SELECT current_setting('hnsw.iterative_scan', true)").fetchone()
    return [(uuid.UUID(str(r[0])), float(r[1])) for r in rows], scan == "relaxed_order"


@pytest.mark.parametrize("bulk", [100, 5200], ids=["exact-scope", "hnsw-scope"])
def test_on_pgvector_the_nearest_come_back_whatever_the_scopes_size(
    db: Any, acme: Tenant, bulk: int
) -> None:
    (has_vector,) = db.execute_sql("SELECT to_regtype('vector') IS NOT NULL").fetchone()
    if not has_vector:
        pytest.skip("pgvector is not installed on this server: the exact window serves")
    _bulk_agent(db, acme.org_id, acme.agent_id, bulk)
    users = SessionStore(db)
    user_id = users.resolve_user(acme.org_id, external_id=f"user-{uuid.uuid4().hex[:6]}")
    last_axis = [0.0] * 255 + [1.0]
    near = unit([0.0] * 254 + [0.3, 1.0])
    nearer = unit([0.0] * 254 + [0.1, 1.0])
    memories = MemoryStore(db)
    ids = {}
    for name, vector, user in [
        ("agent-wide, near", near, None),
        ("the user's, nearer", nearer, user_id),
        ("the user's, far", axis(3, 256), user_id),
    ]:
        memory = dataclasses.replace(
            new_memory(acme.agent_id, name, vector), embedding=tuple(vector), user_id=user
        )
        result = memories.create(acme.org_id, memory)
        assert result.outcome is WriteOutcome.CREATED
        ids[name] = result.row.id

    whole, indexed = _candidates(db, acme.org_id, acme.agent_id, last_axis)
    assert indexed is (bulk > 5000)  # at most 5,000 vectors in the scope: exact
    # Agent-wide (no user): the agent-wide near one first; the users' memories are not in it.
    assert whole[0][0] == ids["agent-wide, near"]
    assert whole[0][1] == pytest.approx(near[-1], abs=1e-4)
    assert ids["the user's, nearer"] not in [i for i, _ in whole]
    assert len(whole) == 10
    assert [s for _, s in whole] == sorted((s for _, s in whole), reverse=True)
    # One user of the agent, own memories only: both of them, nearest first, nothing else.
    own, indexed = _candidates(db, acme.org_id, acme.agent_id, last_axis, user_id=user_id)
    assert indexed is False  # the user's two vectors: exact, whatever the agent's size
    assert [i for i, _ in own] == [ids["the user's, nearer"], ids["the user's, far"]]
    # Every user's: the nearest of all three first.
    every, indexed = _candidates(db, acme.org_id, acme.agent_id, last_axis, all_users=True)
    assert indexed is (bulk > 5000)
    assert [i for i, _ in every[:2]] == [ids["the user's, nearer"], ids["agent-wide, near"]]
