"""``ibex_memory.dot`` (migration 000032: sixteen products per step of its loop) gives the
sum of 000016's loop bit for bit, for every length (the steps of sixteen and the rest), and
NULL where 000016's gave it."""

from __future__ import annotations

import random
from typing import Any

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
