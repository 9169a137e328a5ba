"""``ibex_memory.dot`` (migration 000032: sixteen products per step of its loop) gives the
sum of 000016's loop bit for bit, for every length (the steps of sixteen and the rest), and
NULL where 000016's gave it; where the server has cube, ``ibex_memory.dot_cubes`` (000033,
nested by 000034) gives it to within the reals' rounding, and the semantic window ranks alike
with either. The query's vector, the other operand, reaches them as the same reals whether
sent as text or as a list."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

#: 000016's definition, one product per step (a function of the session, dropped with it).
LOOP_SQL = """
CREATE FUNCTION pg_temp.dot_loop(a real[], b real[]) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_sum double precision := 0;
BEGIN
    IF a IS NULL OR b IS NULL OR cardinality(a) <> cardinality(b) THEN
        RETURN NULL;
    END IF;
    FOR i IN 1..cardinality(a) LOOP
        v_sum := v_sum + a[i] * b[i];
    END LOOP;
    RETURN v_sum;
END
$$
"""


def test_the_unrolled_sum_is_the_loops_bit_for_bit(db: Any) -> None:
    rng = random.Random(32)
    with db.atomic():
        db.execute_sql(LOOP_SQL)
        lengths = [*range(0, 50), 255, 256, 257, 1536]
        for size in lengths:
            for _ in range(3):
                a = [rng.gauss(0.0, 1.0) * 10 ** rng.randint(-6, 2) for _ in range(size)]
                b = [rng.gauss(0.0, 1.0) for _ in range(size)]
                ours, loop = db.execute_sql(
                    "SELECT ibex_memory.dot(%s::real[], %s::real[]),"
                    " pg_temp.dot_loop(%s::real[], %s::real[])",
                    (a, b, a, b),
                ).fetchone()
                assert ours == loop, size  # the same double, not merely close
                if size:
                    assert ours is not None
        for a, b in ((None, [1.0]), ([1.0], None), ([1.0, 2.0], [1.0])):
            row = db.execute_sql(
                "SELECT ibex_memory.dot(%s::real[], %s::real[])", (a, b)
            ).fetchone()
            assert row == (None,)
        db.rollback()


def _unit(rng: random.Random, size: int) -> list[float]:
    values = [rng.gauss(0.0, 1.0) for _ in range(size)]
    norm = sum(v * v for v in values) ** 0.5
    return [v / norm for v in values]


def test_the_cubes_dot_is_the_loops_to_within_the_reals_rounding(db: Any) -> None:
    """Migration 000033 where the server has cube, its terms nested by 000034: for stored
    vectors of length 1 (as every write stores them) and any query (a unit one, a longer one,
    zeros), dot_cubes gives the loop's sum to within the rounding of the reals, for every
    count of 100-dimension chunks (one to 41)."""
    (installed,) = db.execute_sql(
        "SELECT to_regproc('ibex_memory.dot_cubes') IS NOT NULL"
    ).fetchone()
    if not installed:
        pytest.skip("cube is not available on this server: dot (the loop) serves")
    (definition,) = db.execute_sql(
        "SELECT pg_get_functiondef(to_regproc('ibex_memory.dot_cubes'))"
    ).fetchone()
    assert "cardinality(c) > 1" in definition  # 000034's form replaced 000033's
    rng = random.Random(33)
    for size in (1, 2, 99, 100, 101, 199, 200, 256, 300, 1536, 4096):
        for query_scale in (1.0, 3.0, 0.0):
            a = _unit(rng, size)
            q = [v * query_scale for v in _unit(rng, size)]
            cubes, loop = db.execute_sql(
                "SELECT ibex_memory.dot_cubes(%s::real[], ibex_memory.dot_query_cubes(%s::real[]),"
                " ibex_memory.dot_query_norm(%s::real[])), ibex_memory.dot(%s::real[], %s::real[])",
                (a, q, q, a, q),
            ).fetchone()
            assert cubes == pytest.approx(loop, abs=1e-6 * max(1.0, query_scale)), (
                size,
                query_scale,
            )


def test_the_window_ranks_alike_with_and_without_the_cubes(db: Any, acme: Any) -> None:
    """semantic_candidates scores its window with dot_cubes where it exists and with the
    loop where it does not (the functions dropped in a transaction rolled back): the same
    memories, in the same order, with the same similarities to within 1e-6."""
    (installed,) = db.execute_sql(
        "SELECT to_regproc('ibex_memory.dot_cubes') IS NOT NULL"
    ).fetchone()
    if not installed:
        pytest.skip("cube is not available on this server: dot (the loop) serves")
    from memories.store import MemoryStore
    from memories.vectors import EmbeddingStore
    from tests.integration.memory_service.helpers import new_fact

    model = "test:cubes"
    EmbeddingStore(db).register(model, 256)
    rng = random.Random(7)
    store = MemoryStore(db)
    for n in range(120):
        vector = tuple(_unit(rng, 256))
        new = new_fact(acme.agent_id, f"fact {n}", embedding_model=model, embedding=vector)
        assert store.create(acme.org_id, new).outcome.value == "created"
    query = _unit(rng, 256)
    sql = (
        "SELECT id, similarity FROM ibex_memory.semantic_candidates(%s::uuid, %s, %s::real[],"
        " 30, 500, NULL::uuid, NULL::text[], false, true, NULL::uuid, false)"
    )
    params = (str(acme.agent_id), model, query)

    def ranked() -> list[tuple[Any, float]]:
        db.execute_sql("SELECT set_config('ibex.org_id', %s, true)", (str(acme.org_id),))
        return [(r[0], float(r[1])) for r in db.execute_sql(sql, params).fetchall()]

    with db.atomic() as txn:
        with_cubes = ranked()
        db.execute_sql("DROP FUNCTION ibex_memory.dot_cubes")
        with_loop = ranked()
        txn.rollback()
    assert len(with_cubes) == 30
    assert [i for i, _ in with_cubes] == [i for i, _ in with_loop]
    for (_, c), (_, loop) in zip(with_cubes, with_loop, strict=True):
        assert c == pytest.approx(loop, abs=1e-6)


def test_the_query_vectors_text_is_the_reals_its_list_was(db: Any) -> None:
    """The search sends its query's vector as text (``vector_literal``), no longer as a list
    (``ARRAY[...]`` of numerics, cast by the statement): Postgres reads the same reals."""
    from memories.search.store import SemanticQuery, _prepare

    rng = random.Random(33)
    for size in (1, 3, 256, 1536):
        for _ in range(20):
            vector = [rng.gauss(0.0, 1.0) * 10 ** rng.randint(-6, 2) for _ in range(size)]
            prepared = _prepare(
                uuid.uuid4(),
                "what snacks",
                trigram=False,
                limit=10,
                semantic=SemanticQuery("m", vector),
            )
            assert prepared is not None
            sent = prepared[1]["vector"]
            assert isinstance(sent, str)
            (same,) = db.execute_sql(
                "SELECT %s::real[] IS NOT DISTINCT FROM %s::real[]", (sent, vector)
            ).fetchone()
            assert same, size


def test_the_written_text_is_the_reals_postgres_reads(db: Any) -> None:
    """A write's and a search's vector text (orjson's shortest digits of each ``real``) is
    read by ``real[]``'s input as the very reals it was made from: components drawn as
    float32 bit patterns (every exponent, subnormals) and unit vectors of every size."""
    from memories.vectors import unit_literal, unit_vector, vector_literal
    from tests.unit.memory_service.test_vector_literal import float32_reals

    rng = random.Random(35)
    reals = float32_reals(35, 2000)
    for start in range(0, len(reals), 500):
        chunk = reals[start : start + 500]
        (same,) = db.execute_sql(
            "SELECT %s::real[] IS NOT DISTINCT FROM %s::real[]", (vector_literal(chunk), chunk)
        ).fetchone()
        assert same
    for size in (3, 256, 1536):
        vector = [rng.gauss(0.0, 1.0) for _ in range(size)]
        unit = unit_vector(vector)
        assert unit is not None
        (same,) = db.execute_sql(
            "SELECT %s::real[] IS NOT DISTINCT FROM %s::real[]", (unit_literal(vector), list(unit))
        ).fetchone()
        assert same, size
