-- ibex_memory.dot (000016) with sixteen products per step of its loop.
--
-- The exact path of semantic search on a server without pgvector scores each vector of the
-- scope's window with dot(): for a window of 500 vectors of 256 dimensions that was about
-- 18 ms of the search's statement, most of it the loop's own steps (one assignment and one
-- test per product). Here one step adds sixteen products, the rest one at a time as before.
-- The sum is the same, bit for bit: each product is still a real, added to the double sum in
-- the same order (the expression adds left to right), so every similarity and every ranking
-- stays as it was. NULL for a NULL vector or when the lengths differ, as before.

SET LOCAL search_path = pg_catalog;

CREATE OR REPLACE FUNCTION ibex_memory.dot(a real[], b real[])
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog
AS $$
DECLARE
    v_sum double precision := 0;
    v_n integer;
    i integer := 1;
BEGIN
    IF a IS NULL OR b IS NULL OR cardinality(a) <> cardinality(b) THEN
        RETURN NULL;
    END IF;
    v_n := cardinality(a);
    WHILE i + 15 <= v_n LOOP
        v_sum := v_sum + a[i] * b[i] + a[i + 1] * b[i + 1] + a[i + 2] * b[i + 2]
                 + a[i + 3] * b[i + 3] + a[i + 4] * b[i + 4] + a[i + 5] * b[i + 5]
                 + a[i + 6] * b[i + 6] + a[i + 7] * b[i + 7] + a[i + 8] * b[i + 8]
                 + a[i + 9] * b[i + 9] + a[i + 10] * b[i + 10] + a[i + 11] * b[i + 11]
                 + a[i + 12] * b[i + 12] + a[i + 13] * b[i + 13] + a[i + 14] * b[i + 14]
                 + a[i + 15] * b[i + 15];
        i := i + 16;
    END LOOP;
    WHILE i <= v_n LOOP
        v_sum := v_sum + a[i] * b[i];
        i := i + 1;
    END LOOP;
    RETURN v_sum;
END
$$;
