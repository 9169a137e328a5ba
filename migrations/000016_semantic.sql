-- Semantic search: each memory may have one vector per embedding model, stored beside it, and
-- search gains a semantic candidate branch and signal. Additive: memories written before have
-- no vector (search stays lexical for them until `ibex reembed` or the scheduler embeds them).
--
--   ibex_memory.embedding_models      every model vectors were stored for, with its dimension:
--                                     one dimension per model, so one ranking never mixes them
--   ibex_memory.memory_embeddings     (memory, model) -> the unit vector (real[]), with the
--                                     memory's org, agent and user for scoped reads
--   ibex_memory.dot                   the dot product of two vectors (cosine: they are unit)
--   ibex_memory.put_embeddings        store vectors for existing memories (backfill, reembed)
--   ibex_memory.semantic_candidates   the scope's nearest memories to a query vector
--   ibex_memory.ensure_vector_index   the HNSW index for one dimension, where pgvector is
--   ibex_memory.create_memory         takes an optional vector, stored in the same statement
--
-- Storage is real[] on every server. Where the server ships pgvector (the embedded server of
-- `ibex demo` does; Debian's Postgres without the package does not) the extension is created
-- and each dimension gets an HNSW expression index over embedding::vector(dim), partial on
-- that dimension; the nearest memories of a scope are then read from it with pgvector 0.8's
-- iterative scans (filtered by org, agent, user and model). Elsewhere the nearest are found
-- by exact cosine over the scope's newest vectors (a bounded window), in SQL.

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        CREATE EXTENSION IF NOT EXISTS vector;
    END IF;
END
$$;

-- A memory is named with its org by the composite foreign key below.
ALTER TABLE ibex_memory.memories ADD CONSTRAINT memories_id_org UNIQUE (id, org_id);

CREATE TABLE ibex_memory.embedding_models (
    model       text PRIMARY KEY CHECK (length(model) BETWEEN 1 AND 200),
    dimension   integer NOT NULL CHECK (dimension BETWEEN 1 AND 4096),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (model, dimension)
);

CREATE TABLE ibex_memory.memory_embeddings (
    org_id      uuid NOT NULL REFERENCES ibex_core.orgs (id),
    memory_id   uuid NOT NULL,
    agent_id    uuid NOT NULL,
    user_id     uuid,
    model       text NOT NULL,
    dimension   integer NOT NULL,
    embedding   real[] NOT NULL CHECK (cardinality(embedding) = dimension),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (memory_id, model),
    -- Erasure (`ibex prune`) hard-deletes memories: their vectors go with them.
    CONSTRAINT memory_embeddings_memory_fkey FOREIGN KEY (memory_id, org_id)
        REFERENCES ibex_memory.memories (id, org_id) ON DELETE CASCADE,
    CONSTRAINT memory_embeddings_agent_fkey FOREIGN KEY (agent_id, org_id)
        REFERENCES ibex_core.agents (id, org_id),
    CONSTRAINT memory_embeddings_user_fkey FOREIGN KEY (user_id, org_id)
        REFERENCES ibex_core.users (id, org_id),
    -- A model has one dimension, the one it was first stored with.
    CONSTRAINT memory_embeddings_model_fkey FOREIGN KEY (model, dimension)
        REFERENCES ibex_memory.embedding_models (model, dimension)
);

-- The fallback's window (the scope's newest vectors of a model) and per-agent counts.
CREATE INDEX idx_memory_embeddings_scope
    ON ibex_memory.memory_embeddings (org_id, agent_id, model, created_at DESC);

-- The registry holds model names and dimensions, no tenant data: no row-level security. The
-- tenant role reads and extends it (a write registers a new model); nobody but the owner
-- changes or removes a model. Vectors: written and replaced (the backfill's ON CONFLICT DO
-- UPDATE) by the tenant role, removed only with their memory (the cascade) or by the owner.
GRANT SELECT, INSERT ON ibex_memory.embedding_models TO ibex_app;
GRANT SELECT ON ibex_memory.embedding_models TO ibex_ops;
GRANT SELECT, INSERT, UPDATE ON ibex_memory.memory_embeddings TO ibex_app;
GRANT SELECT ON ibex_memory.memory_embeddings TO ibex_ops;

ALTER TABLE ibex_memory.memory_embeddings ENABLE ROW LEVEL SECURITY;
ALTER TABLE ibex_memory.memory_embeddings FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_memory.memory_embeddings
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));
CREATE POLICY operator_read ON ibex_memory.memory_embeddings FOR SELECT TO ibex_ops
    USING (true);

-- A loop, not sum() over unnest(): about twice as fast (some 60 us for 256 dimensions), which
-- is what bounds the fallback's window. NULL for a NULL vector or when the lengths differ.
-- (Not STRICT: the planner folds a strict call on NULL before the privilege check.)
CREATE FUNCTION ibex_memory.dot(a real[], b real[])
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog
AS $$
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
$$;

-- The HNSW index of one dimension (cosine), created when pgvector is installed and the
-- dimension fits its index (at most 2000); true when the index exists afterwards. Built by
-- this migration for the default local model (256) and by `ibex reembed` for the configured
-- model's dimension. Must run as the table's owner (the role that migrated).
CREATE FUNCTION ibex_memory.ensure_vector_index(p_dimension integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_name text := 'idx_memory_embeddings_hnsw_' || p_dimension;
BEGIN
    IF to_regclass('ibex_memory.' || v_name) IS NOT NULL THEN
        RETURN true;
    END IF;
    IF to_regtype('vector') IS NULL OR p_dimension < 1 OR p_dimension > 2000 THEN
        RETURN false;
    END IF;
    EXECUTE format(
        'CREATE INDEX %I ON ibex_memory.memory_embeddings'
        ' USING hnsw ((embedding::vector(%s)) vector_cosine_ops) WHERE dimension = %s',
        v_name, p_dimension, p_dimension);
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION ibex_memory.ensure_vector_index(integer) FROM PUBLIC;
SELECT ibex_memory.ensure_vector_index(256);

-- Vectors for existing memories of the transaction's org (ibex.org_id, under row-level
-- security): p_ids[i] gets p_vectors->i (a JSON array of numbers) for p_model. The memory's
-- agent and user are copied from its row; a deleted or unknown memory is skipped; a vector
-- already stored for the (memory, model) is replaced. Registers the model with its dimension
-- first; a model registered with another dimension stores nothing (returns -1), so a
-- misconfigured dimension never mixes into a ranking. Returns the vectors stored.
CREATE FUNCTION ibex_memory.put_embeddings(
    p_ids uuid[], p_model text, p_dimension integer, p_vectors jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
    v_org uuid := NULLIF(current_setting('ibex.org_id', true), '')::uuid;
    v_rows integer;
BEGIN
    INSERT INTO ibex_memory.embedding_models (model, dimension)
    VALUES (p_model, p_dimension) ON CONFLICT DO NOTHING;
    IF NOT EXISTS (SELECT 1 FROM ibex_memory.embedding_models
                    WHERE model = p_model AND dimension = p_dimension) THEN
        RETURN -1;
    END IF;
    INSERT INTO ibex_memory.memory_embeddings AS e
        (org_id, memory_id, agent_id, user_id, model, dimension, embedding)
    SELECT m.org_id, m.id, m.agent_id, m.user_id, p_model, p_dimension,
           ARRAY(SELECT x::real FROM jsonb_array_elements_text(p_vectors -> (v.n - 1)::int) x)
      FROM unnest(p_ids) WITH ORDINALITY AS v(id, n)
      JOIN ibex_memory.memories m ON m.org_id = v_org AND m.id = v.id
     WHERE m.deleted_at IS NULL
    ON CONFLICT (memory_id, model) DO UPDATE
       SET embedding = EXCLUDED.embedding, dimension = EXCLUDED.dimension,
           created_at = now();
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;

-- The reader's nearest memories to p_query among the vectors of p_model: ids and cosine
-- similarity, best first, at most p_limit, in the scope the lexical branches use (org from the
-- transaction, agent, the user condition of 000013, session, kinds; live memories, current
-- ones unless p_include_superseded). With the HNSW index of the query's dimension, read from
-- it with iterative scans (relaxed order: the ranking recomputes the exact similarity);
-- without it, exact cosine over the scope's newest p_window vectors. Runs as its owner
-- (SECURITY DEFINER), for the reason search_candidates does (000006): under row-level
-- security an index-ordered scan over a non-leakproof operator is not used.
CREATE FUNCTION ibex_memory.semantic_candidates(
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
    v_where text;
BEGIN
    IF v_org IS NULL OR v_dim IS NULL OR v_dim = 0 THEN
        RETURN;
    END IF;
    v_where := format(
        'm.org_id = %L AND m.agent_id = %L AND m.model = %L AND m.dimension = %s AND %s'
        ' AND r.deleted_at IS NULL',
        v_org, p_agent_id, p_model, v_dim,
        ibex_memory.user_scope_condition(p_all_users, p_user_id, p_include_shared));
    IF NOT p_include_superseded THEN
        v_where := v_where || ' AND r.superseded_by IS NULL';
    END IF;
    IF p_session_id IS NOT NULL THEN
        v_where := v_where || format(' AND r.session_id = %L', p_session_id);
    END IF;
    IF p_kinds IS NOT NULL THEN
        v_where := v_where || format(' AND r.kind = ANY(%L::text[])', p_kinds);
    END IF;
    IF to_regclass('ibex_memory.idx_memory_embeddings_hnsw_' || v_dim) IS NOT NULL THEN
        PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
        PERFORM set_config('hnsw.ef_search', GREATEST(40, 2 * p_limit)::text, true);
        RETURN QUERY EXECUTE format(
            'SELECT m.memory_id, 1 - (m.embedding::vector(%1$s) <=> $1::vector(%1$s))'
            '  FROM ibex_memory.memory_embeddings m'
            '  JOIN ibex_memory.memories r ON r.id = m.memory_id'
            ' WHERE %2$s'
            ' ORDER BY m.embedding::vector(%1$s) <=> $1::vector(%1$s)'
            ' LIMIT $2', v_dim, v_where)
            USING p_query, p_limit;
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT w.memory_id, ibex_memory.dot(w.embedding, $1) AS s'
        '  FROM (SELECT m.memory_id, m.embedding'
        '          FROM ibex_memory.memory_embeddings m'
        '          JOIN ibex_memory.memories r ON r.id = m.memory_id'
        '         WHERE %s'
        '         ORDER BY m.created_at DESC LIMIT $3) w'
        ' ORDER BY s DESC, w.memory_id LIMIT $2', v_where)
        USING p_query, p_limit, p_window;
END
$$;

-- create_memory (000014) with two trailing parameters: the memory's vector and its model
-- (both NULL by default: no vector, exactly the call before). When the insert happens, the
-- vector is stored in the same transaction, under the same statement, if the model is
-- registered with the vector's dimension or is new (then registered); a vector of a model
-- registered with another dimension is left out (search stays lexical for the memory).
-- Everything else is 000014's function, unchanged.
CREATE OR REPLACE FUNCTION ibex_memory.store_new_embedding(
    p_org_id uuid, p_memory_id uuid, p_model text, p_embedding real[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
    IF p_model IS NULL OR p_embedding IS NULL OR cardinality(p_embedding) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO ibex_memory.embedding_models (model, dimension)
    VALUES (p_model, cardinality(p_embedding)) ON CONFLICT DO NOTHING;
    INSERT INTO ibex_memory.memory_embeddings
        (org_id, memory_id, agent_id, user_id, model, dimension, embedding)
    SELECT m.org_id, m.id, m.agent_id, m.user_id, p_model, cardinality(p_embedding),
           p_embedding
      FROM ibex_memory.memories m
     WHERE m.org_id = p_org_id AND m.id = p_memory_id
       AND EXISTS (SELECT 1 FROM ibex_memory.embedding_models x
                    WHERE x.model = p_model AND x.dimension = cardinality(p_embedding))
    ON CONFLICT (memory_id, model) DO NOTHING;
END
$$;

CREATE FUNCTION ibex_memory.create_memory(
    p_org_id uuid, p_agent_id uuid, p_session_id uuid, p_turn_index integer, p_ordinal integer,
    p_content text, p_content_hash text, p_kind text, p_metadata jsonb,
    p_idempotency_key text, p_request_fingerprint text, p_user_id uuid,
    p_supersedes uuid[], p_skip_stale boolean, p_near_threshold real,
    p_embedding_model text, p_embedding real[])
RETURNS TABLE (outcome text, id uuid, org_id uuid, agent_id uuid, session_id uuid,
               turn_index integer, ordinal integer, content text, content_hash text, kind text,
               metadata jsonb, created_at timestamptz, idempotency_key text,
               request_fingerprint text, valid_from timestamptz, superseded_by uuid,
               superseded_at timestamptz, marked uuid[], refused uuid[])
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    v_row record;
BEGIN
    FOR v_row IN
        SELECT * FROM ibex_memory.create_memory(
            p_org_id, p_agent_id, p_session_id, p_turn_index, p_ordinal, p_content,
            p_content_hash, p_kind, p_metadata, p_idempotency_key, p_request_fingerprint,
            p_user_id, p_supersedes, p_skip_stale, p_near_threshold)
    LOOP
        -- The inner call switched the role and org for the transaction: the vector is
        -- stored under the same row-level security as the memory.
        IF v_row.outcome = 'created' THEN
            PERFORM ibex_memory.store_new_embedding(p_org_id, v_row.id, p_embedding_model,
                                                    p_embedding);
        END IF;
        outcome := v_row.outcome; id := v_row.id; org_id := v_row.org_id;
        agent_id := v_row.agent_id; session_id := v_row.session_id;
        turn_index := v_row.turn_index; ordinal := v_row.ordinal; content := v_row.content;
        content_hash := v_row.content_hash; kind := v_row.kind; metadata := v_row.metadata;
        created_at := v_row.created_at; idempotency_key := v_row.idempotency_key;
        request_fingerprint := v_row.request_fingerprint; valid_from := v_row.valid_from;
        superseded_by := v_row.superseded_by; superseded_at := v_row.superseded_at;
        marked := v_row.marked; refused := v_row.refused;
        RETURN NEXT;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION
    ibex_memory.create_memory(uuid, uuid, uuid, integer, integer, text, text, text, jsonb, text,
                              text, uuid, uuid[], boolean, real, text, real[]),
    ibex_memory.store_new_embedding(uuid, uuid, text, real[]),
    ibex_memory.put_embeddings(uuid[], text, integer, jsonb),
    ibex_memory.semantic_candidates(uuid, text, real[], integer, integer, uuid, text[], boolean,
                                    boolean, uuid, boolean),
    ibex_memory.dot(real[], real[])
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    ibex_memory.store_new_embedding(uuid, uuid, text, real[]),
    ibex_memory.put_embeddings(uuid[], text, integer, jsonb),
    ibex_memory.semantic_candidates(uuid, text, real[], integer, integer, uuid, text[], boolean,
                                    boolean, uuid, boolean),
    ibex_memory.dot(real[], real[])
TO ibex_app;
