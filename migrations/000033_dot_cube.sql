-- The semantic fallback's dot products in C, where the server ships contrib's cube.
--
-- On a server without pgvector the semantic branch scores the scope's 500 newest vectors with
-- ibex_memory.dot, a PL/pgSQL loop (000032): about 14 ms of a search's statement for 256
-- dimensions. cube's Euclidean distance (C) does the arithmetic instead: a cube holds at most
-- 100 dimensions, so a vector is cut into chunks of 100 (256 dimensions: three), and for a
-- stored vector a of length 1 (every stored vector is scaled to length 1 before it is
-- written) and a query q,
--
--     a . q = (|a|^2 + |q|^2 - |a - q|^2) / 2 = (1 + |q|^2 - sum over chunks of d_k^2) / 2
--
-- with d_k the distance between the chunks. The query's chunks and squared length are made
-- once per statement; a stored vector's chunks are made in C as it is read. The results are
-- the loop's to within the rounding of the stored reals (about 1e-7: the loop multiplies in
-- real, this in double precision; a stored vector's length is 1 to within its rounding).
--
--   cube                              created where the server has it (Debian's
--                                     postgresql-contrib does, as for pg_trgm), in public
--   ibex_memory.ensure_dot_cubes()    makes the extension (if it can) and the three functions
--                                     below; the owner's, called here, and again by hand once
--                                     a superuser has created cube where this role could not
--   ibex_memory.dot_query_cubes(q)    the query's chunks as cubes (at most 41: 4,096 dimensions)
--   ibex_memory.dot_query_norm(q)     the query's squared length
--   ibex_memory.dot_cubes(a, c, n)    a . q as above (an SQL expression the planner inlines)
--   ibex_memory.semantic_candidates   000019's, the window scored with dot_cubes when it exists
--                                     (the ranking statement scores its other candidates with
--                                     the same expression, memories/search/store.py)
--
-- Without cube nothing changes: dot (000032) scores the window and the candidates.

SET LOCAL search_path = pg_catalog;

CREATE FUNCTION ibex_memory.ensure_dot_cubes()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog
AS $$
DECLARE
    v_schema text;
    v_terms text;
BEGIN
    IF to_regproc('ibex_memory.dot_cubes') IS NOT NULL THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'cube') THEN
        RAISE NOTICE 'cube is not available on this server: the semantic fallback keeps its loop';
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'cube') THEN
        BEGIN
            CREATE EXTENSION cube SCHEMA public;
        EXCEPTION WHEN insufficient_privilege OR invalid_schema_name THEN
            -- A role that may not create it (or no public schema): the loop stays, until a
            -- superuser creates the extension and the owner calls this function again.
            RAISE NOTICE 'cube could not be created (%): the semantic fallback keeps its loop',
                SQLERRM;
            RETURN false;
        END;
    END IF;
    SELECT n.nspname INTO v_schema
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'cube';
    EXECUTE format(
        'CREATE FUNCTION ibex_memory.dot_query_cubes(q real[]) RETURNS %1$I.cube[]'
        ' LANGUAGE sql IMMUTABLE PARALLEL SAFE'
        ' RETURN ARRAY(SELECT %1$I.cube(q[k:k + 99]::float8[])'
        '                FROM generate_series(1, cardinality(q), 100) k ORDER BY k)',
        v_schema);
    EXECUTE
        'CREATE FUNCTION ibex_memory.dot_query_norm(q real[]) RETURNS double precision'
        ' LANGUAGE sql IMMUTABLE PARALLEL SAFE'
        ' RETURN (SELECT COALESCE(sum(x::float8 * x), 0) FROM unnest(q) x)';
    -- One term per chunk the query can have (4,096 dimensions at most: 41 chunks); a term
    -- past the query's chunks is 0. One expression, so that the planner inlines it.
    SELECT string_agg(
               CASE WHEN k = 1
                    THEN format('power(%1$I.cube_distance(%1$I.cube(a[1:100]::float8[]), c[1]), 2)',
                                v_schema)
                    ELSE format('CASE WHEN cardinality(c) >= %2$s THEN power(%1$I.cube_distance('
                                '%1$I.cube(a[%3$s:%4$s]::float8[]), c[%2$s]), 2) ELSE 0 END',
                                v_schema, k, (k - 1) * 100 + 1, k * 100) END,
               ' + ' ORDER BY k)
      INTO v_terms
      FROM generate_series(1, 41) k;
    EXECUTE format(
        'CREATE FUNCTION ibex_memory.dot_cubes(a real[], c %1$I.cube[], n double precision)'
        ' RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE'
        ' RETURN (1 + n - (%2$s)) / 2',
        v_schema, v_terms);
    REVOKE ALL ON FUNCTION ibex_memory.dot_query_cubes(real[]),
                           ibex_memory.dot_query_norm(real[]) FROM PUBLIC;
    EXECUTE format('REVOKE ALL ON FUNCTION ibex_memory.dot_cubes(real[], %I.cube[],'
                   ' double precision) FROM PUBLIC', v_schema);
    GRANT EXECUTE ON FUNCTION ibex_memory.dot_query_cubes(real[]) TO ibex_app;
    GRANT EXECUTE ON FUNCTION ibex_memory.dot_query_norm(real[]) TO ibex_app;
    EXECUTE format('GRANT EXECUTE ON FUNCTION ibex_memory.dot_cubes(real[], %I.cube[],'
                   ' double precision) TO ibex_app', v_schema);
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION ibex_memory.ensure_dot_cubes() FROM PUBLIC;

SELECT ibex_memory.ensure_dot_cubes();

CREATE OR REPLACE FUNCTION ibex_memory.semantic_candidates(
    p_agent_id uuid, p_model text, p_query real[], p_limit integer, p_window integer,
    p_session_id uuid, p_kinds text[], p_include_superseded boolean,
    p_all_users boolean, p_user_id uuid, p_include_shared boolean)
RETURNS TABLE (id uuid, similarity double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER ROWS 50
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_org uuid := NULLIF(current_setting('ibex.org_id', true), '')::uuid;
    v_dim integer := cardinality(p_query);
    v_users text;
    v_where text;
    v_count integer;
BEGIN
    IF v_org IS NULL OR v_dim IS NULL OR v_dim = 0 THEN
        RETURN;
    END IF;
    v_users := ibex_memory.user_scope_condition(p_all_users, p_user_id, p_include_shared);
    v_where := format(
        'e.org_id = %L AND e.agent_id = %L AND e.model = %L AND e.dimension = %s'
        ' AND m.org_id = %L AND m.agent_id = %L AND %s AND m.deleted_at IS NULL',
        v_org, p_agent_id, p_model, v_dim, v_org, p_agent_id, v_users);
    IF NOT p_include_superseded THEN
        v_where := v_where || ' AND m.superseded_by IS NULL';
    END IF;
    IF p_session_id IS NOT NULL THEN
        v_where := v_where || format(' AND m.session_id = %L', p_session_id);
    END IF;
    IF p_kinds IS NOT NULL THEN
        v_where := v_where || format(' AND m.kind = ANY(%L::text[])', p_kinds);
    END IF;
    IF to_regclass('ibex_memory.idx_memory_embeddings_hnsw_' || v_dim) IS NOT NULL THEN
        EXECUTE format(
            'SELECT count(*) FROM (SELECT 1 FROM ibex_memory.memories m'
            ' WHERE m.org_id = %L AND m.agent_id = %L AND %s AND m.deleted_at IS NULL'
            ' LIMIT 5001) x',
            v_org, p_agent_id, v_users)
            INTO v_count;
        IF v_count <= 5000 THEN
            RETURN QUERY EXECUTE format(
                'SELECT x.memory_id, x.s FROM ('
                'SELECT e.memory_id, 1 - (e.embedding::vector(%1$s) <=> $1::vector(%1$s)) AS s'
                '  FROM ibex_memory.memory_embeddings e'
                '  JOIN ibex_memory.memories m ON m.id = e.memory_id'
                ' WHERE %2$s OFFSET 0) x'
                ' ORDER BY x.s DESC, x.memory_id LIMIT $2', v_dim, v_where)
                USING p_query, p_limit;
            RETURN;
        END IF;
        PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
        PERFORM set_config('hnsw.ef_search', GREATEST(40, 2 * p_limit)::text, true);
        RETURN QUERY EXECUTE format(
            'SELECT e.memory_id, 1 - (e.embedding::vector(%1$s) <=> $1::vector(%1$s))'
            '  FROM ibex_memory.memory_embeddings e'
            '  JOIN ibex_memory.memories m ON m.id = e.memory_id'
            ' WHERE %2$s'
            ' ORDER BY e.embedding::vector(%1$s) <=> $1::vector(%1$s)'
            ' LIMIT $2', v_dim, v_where)
            USING p_query, p_limit;
        RETURN;
    END IF;
    IF to_regproc('ibex_memory.dot_cubes') IS NOT NULL THEN
        -- The query's cubes and squared length once, each window vector's in C (000033).
        RETURN QUERY EXECUTE format(
            'SELECT w.memory_id, ibex_memory.dot_cubes(w.embedding, qc.c, qc.n) AS s'
            '  FROM (SELECT e.memory_id, e.embedding'
            '          FROM ibex_memory.memory_embeddings e'
            '          JOIN ibex_memory.memories m ON m.id = e.memory_id'
            '         WHERE %s'
            '         ORDER BY e.created_at DESC LIMIT $3) w,'
            '       (SELECT ibex_memory.dot_query_cubes($1) AS c,'
            '               ibex_memory.dot_query_norm($1) AS n OFFSET 0) qc'
            ' ORDER BY s DESC, w.memory_id LIMIT $2', v_where)
            USING p_query, p_limit, p_window;
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT w.memory_id, ibex_memory.dot(w.embedding, $1) AS s'
        '  FROM (SELECT e.memory_id, e.embedding'
        '          FROM ibex_memory.memory_embeddings e'
        '          JOIN ibex_memory.memories m ON m.id = e.memory_id'
        '         WHERE %s'
        '         ORDER BY e.created_at DESC LIMIT $3) w'
        ' ORDER BY s DESC, w.memory_id LIMIT $2', v_where)
        USING p_query, p_limit, p_window;
END
$$;
