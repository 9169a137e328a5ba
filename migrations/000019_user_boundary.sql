-- The user boundary: what a read filters on is the memory's own user, never a copy; a person's
-- sessions are named per person; no tenant writes the embedding model registry.
--
--   ibex_memory.memory_embeddings     loses user_id (and its foreign key and index): a vector's
--                                     owner is its memory's user_id, read by a join, so a user
--                                     given late (which moves the memories) moves the vectors
--                                     with them, whatever the order of events. The copy kept
--                                     NULL when a session got its user after extraction, and
--                                     the semantic branch, which filtered on it, returned that
--                                     person's memories to everyone else.
--   ibex_memory.semantic_candidates   the reader's scope on the memories row (alias m, as every
--                                     other search statement); the count that picks the exact
--                                     or the HNSW path reads idx_memories_agent_user
--   ibex_memory.put_embeddings,       store vectors of a registered model only, and no longer
--   ibex_memory.store_new_embedding   register one: the tenant role may not write the registry
--   ibex_memory.embedding_models      written by the owner only (a process registers the model
--                                     it is configured with, at start); a tenant's request can
--                                     no longer fix a model's dimension for every other tenant
--                                     and stop a web process from starting
--   ibex_core.sessions                an external id is unique per agent AND user: alice's
--                                     "conv-1", bob's "conv-1" and the agent-wide "conv-1" are
--                                     three sessions, so what a user-bound token gets for an
--                                     external id never depends on another person's sessions

-- -- vectors: no copy of the user -------------------------------------------------------

DROP INDEX ibex_memory.idx_memory_embeddings_user;
ALTER TABLE ibex_memory.memory_embeddings DROP CONSTRAINT memory_embeddings_user_fkey;
ALTER TABLE ibex_memory.memory_embeddings DROP COLUMN user_id;

REVOKE INSERT ON ibex_memory.embedding_models FROM ibex_app;

CREATE OR REPLACE FUNCTION ibex_memory.put_embeddings(
    p_ids uuid[], p_model text, p_dimension integer, p_vectors jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
    v_org uuid := NULLIF(current_setting('ibex.org_id', true), '')::uuid;
    v_rows integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ibex_memory.embedding_models
                    WHERE model = p_model AND dimension = p_dimension) THEN
        RETURN -1;
    END IF;
    INSERT INTO ibex_memory.memory_embeddings AS e
        (org_id, memory_id, agent_id, model, dimension, embedding)
    SELECT m.org_id, m.id, m.agent_id, p_model, p_dimension,
           ARRAY(SELECT x::real FROM jsonb_array_elements_text(p_vectors -> (v.n - 1)::int) x)
      FROM unnest(p_ids) WITH ORDINALITY AS v(id, n)
      JOIN ibex_memory.memories m ON m.org_id = v_org AND m.id = v.id
     WHERE m.deleted_at IS NULL
    ON CONFLICT (memory_id, model, agent_id) DO UPDATE
       SET embedding = EXCLUDED.embedding, dimension = EXCLUDED.dimension,
           created_at = now();
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;

-- A vector of a model that is not registered with the vector's dimension is left out: the
-- memory is stored without it (the memory service refuses such a vector before it gets here).
CREATE OR REPLACE FUNCTION ibex_memory.store_new_embedding(
    p_org_id uuid, p_memory_id uuid, p_model text, p_embedding real[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
    IF p_model IS NULL OR p_embedding IS NULL OR cardinality(p_embedding) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO ibex_memory.memory_embeddings
        (org_id, memory_id, agent_id, model, dimension, embedding)
    SELECT m.org_id, m.id, m.agent_id, p_model, cardinality(p_embedding), p_embedding
      FROM ibex_memory.memories m
     WHERE m.org_id = p_org_id AND m.id = p_memory_id
       AND EXISTS (SELECT 1 FROM ibex_memory.embedding_models x
                    WHERE x.model = p_model AND x.dimension = cardinality(p_embedding))
    ON CONFLICT (memory_id, model, agent_id) DO NOTHING;
END
$$;

-- 000017's function with the reader's scope on the memory (m) and the vector as e. The count
-- that chooses the path counts the scope's live memories, at most 5,001, from
-- idx_memories_agent_user (a scope has at most that many vectors of a model).
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

-- -- sessions: an external id per agent and user ------------------------------------------

CREATE UNIQUE INDEX idx_sessions_external_id_user
    ON ibex_core.sessions
       (org_id, agent_id, COALESCE(user_id, '00000000-0000-0000-0000-000000000000'::uuid),
        external_id)
    WHERE external_id IS NOT NULL;
DROP INDEX ibex_core.idx_sessions_external_id;
-- An org-level lookup by external id alone (a request that names no user, GET /v1/sessions
-- ?external_id=), whoever the sessions' users are.
CREATE INDEX idx_sessions_external_id
    ON ibex_core.sessions (org_id, agent_id, external_id) WHERE external_id IS NOT NULL;
