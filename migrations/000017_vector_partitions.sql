-- The vectors of 000016, partitioned by agent: an HNSW index per partition instead of one per
-- org, so that the nearest memories of an agent are read from an index that holds that
-- agent's vectors (or a few agents'), not the whole server's; and an exact path for a small
-- scope, where an index walk filtered down to a few rows would be both slow and short.
--
--   ibex_memory.memory_embeddings     now PARTITION BY HASH (agent_id), 32 partitions in the
--                                     schema ibex_memory_parts (no grants: every read and write
--                                     goes through the parent, under its row-level security);
--                                     primary key (memory_id, model, agent_id): a memory has
--                                     one agent, so it is still one vector per memory and model
--   idx_memory_embeddings_user        (org_id, agent_id, model, user_id): counts a scope's
--                                     vectors without reading them
--   ibex_memory.ensure_vector_index   the HNSW index of a dimension: a partitioned index, each
--                                     partition's named idx_memory_embeddings_hnsw_<dim>_pNN
--   ibex_memory.semantic_candidates   exact cosine when the reader's scope holds at most 5,000
--                                     vectors of the model, else the partition's HNSW index
--   ibex_memory.put_embeddings,       their ON CONFLICT names the new primary key; otherwise
--   ibex_memory.store_new_embedding   000016's functions
--
-- The rows of 000016's table move to the new one in this migration (one INSERT ... SELECT),
-- and the HNSW indexes 000016 made are made again per partition.

CREATE SCHEMA ibex_memory_parts;
REVOKE ALL ON SCHEMA ibex_memory_parts FROM PUBLIC;

CREATE TEMP TABLE vector_index_dimensions ON COMMIT DROP AS
SELECT substring(c.relname FROM 'idx_memory_embeddings_hnsw_([0-9]+)$')::integer AS dimension
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'ibex_memory' AND c.relname ~ '^idx_memory_embeddings_hnsw_[0-9]+$';

ALTER TABLE ibex_memory.memory_embeddings RENAME TO memory_embeddings_000016;
DO $$
DECLARE
    v_index text;
BEGIN
    FOR v_index IN
        SELECT c.relname FROM pg_index i
          JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = 'ibex_memory.memory_embeddings_000016'::regclass
    LOOP
        EXECUTE format('ALTER INDEX ibex_memory.%I RENAME TO %I',
                       v_index, v_index || '_000016');
    END LOOP;
END
$$;

CREATE TABLE ibex_memory.memory_embeddings (
    org_id      uuid NOT NULL REFERENCES ibex_core.orgs (id),
    memory_id   uuid NOT NULL,
    agent_id    uuid NOT NULL,
    user_id     uuid,
    model       text NOT NULL,
    dimension   integer NOT NULL,
    embedding   real[] NOT NULL CHECK (cardinality(embedding) = dimension),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (memory_id, model, agent_id),
    CONSTRAINT memory_embeddings_memory_fkey FOREIGN KEY (memory_id, org_id)
        REFERENCES ibex_memory.memories (id, org_id) ON DELETE CASCADE,
    CONSTRAINT memory_embeddings_agent_fkey FOREIGN KEY (agent_id, org_id)
        REFERENCES ibex_core.agents (id, org_id),
    CONSTRAINT memory_embeddings_user_fkey FOREIGN KEY (user_id, org_id)
        REFERENCES ibex_core.users (id, org_id),
    CONSTRAINT memory_embeddings_model_fkey FOREIGN KEY (model, dimension)
        REFERENCES ibex_memory.embedding_models (model, dimension)
) PARTITION BY HASH (agent_id);

DO $$
BEGIN
    FOR i IN 0..31 LOOP
        EXECUTE format(
            'CREATE TABLE ibex_memory_parts.memory_embeddings_p%s'
            ' PARTITION OF ibex_memory.memory_embeddings'
            ' FOR VALUES WITH (MODULUS 32, REMAINDER %s)', lpad(i::text, 2, '0'), i);
    END LOOP;
END
$$;

CREATE INDEX idx_memory_embeddings_scope
    ON ibex_memory.memory_embeddings (org_id, agent_id, model, created_at DESC);
CREATE INDEX idx_memory_embeddings_user
    ON ibex_memory.memory_embeddings (org_id, agent_id, model, user_id);

INSERT INTO ibex_memory.memory_embeddings
    (org_id, memory_id, agent_id, user_id, model, dimension, embedding, created_at)
SELECT org_id, memory_id, agent_id, user_id, model, dimension, embedding, created_at
  FROM ibex_memory.memory_embeddings_000016;
DROP TABLE ibex_memory.memory_embeddings_000016;

GRANT SELECT, INSERT, UPDATE ON ibex_memory.memory_embeddings TO ibex_app;
GRANT SELECT ON ibex_memory.memory_embeddings TO ibex_ops;

ALTER TABLE ibex_memory.memory_embeddings ENABLE ROW LEVEL SECURITY;
ALTER TABLE ibex_memory.memory_embeddings FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_memory.memory_embeddings
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));
CREATE POLICY operator_read ON ibex_memory.memory_embeddings FOR SELECT TO ibex_ops
    USING (true);

-- The HNSW index of one dimension, as in 000016, on every partition: the parent's index is
-- made ON ONLY the parent, each partition's is built under a name that says its partition and
-- attached (the parent's index is valid once every partition's is). Must run as the table's
-- owner; true when the index exists afterwards.
CREATE OR REPLACE FUNCTION ibex_memory.ensure_vector_index(p_dimension integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_name text := 'idx_memory_embeddings_hnsw_' || p_dimension;
    v_part record;
    v_part_index text;
BEGIN
    IF to_regtype('vector') IS NULL OR p_dimension < 1 OR p_dimension > 2000 THEN
        RETURN to_regclass('ibex_memory.' || v_name) IS NOT NULL;
    END IF;
    IF to_regclass('ibex_memory.' || v_name) IS NULL THEN
        EXECUTE format(
            'CREATE INDEX %I ON ONLY ibex_memory.memory_embeddings'
            ' USING hnsw ((embedding::vector(%s)) vector_cosine_ops) WHERE dimension = %s',
            v_name, p_dimension, p_dimension);
    END IF;
    FOR v_part IN
        SELECT c.relname,
               substring(c.relname FROM '_(p[0-9]+)$') AS suffix
          FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
         WHERE h.inhparent = 'ibex_memory.memory_embeddings'::regclass
         ORDER BY c.relname
    LOOP
        v_part_index := v_name || '_' || v_part.suffix;
        IF to_regclass('ibex_memory_parts.' || v_part_index) IS NULL THEN
            EXECUTE format(
                'CREATE INDEX %I ON ibex_memory_parts.%I'
                ' USING hnsw ((embedding::vector(%s)) vector_cosine_ops) WHERE dimension = %s',
                v_part_index, v_part.relname, p_dimension, p_dimension);
            EXECUTE format('ALTER INDEX ibex_memory.%I ATTACH PARTITION ibex_memory_parts.%I',
                           v_name, v_part_index);
        END IF;
    END LOOP;
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION ibex_memory.ensure_vector_index(integer) FROM PUBLIC;
SELECT ibex_memory.ensure_vector_index(dimension) FROM vector_index_dimensions;

CREATE OR REPLACE FUNCTION ibex_memory.put_embeddings(
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
    ON CONFLICT (memory_id, model, agent_id) DO UPDATE
       SET embedding = EXCLUDED.embedding, dimension = EXCLUDED.dimension,
           created_at = now();
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;

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
    ON CONFLICT (memory_id, model, agent_id) DO NOTHING;
END
$$;

-- 000016's function with a third path. The scope's vectors of the model (org, agent, the
-- reader's users: the columns the vectors carry) are counted first, at most 5,001 of them,
-- from idx_memory_embeddings_user without reading a row. With pgvector and at most 5,000:
-- exact cosine over all of them (OFFSET 0 keeps the planner off the HNSW index), the
-- session and kind filters applied on the way, so a small scope (a new agent, one user of a
-- large one) gets its true nearest. With pgvector and more: the HNSW index of the agent's
-- partition, with iterative scans, as in 000016. Without pgvector: 000016's exact window.
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
        'm.org_id = %L AND m.agent_id = %L AND m.model = %L AND m.dimension = %s AND %s'
        ' AND r.deleted_at IS NULL',
        v_org, p_agent_id, p_model, v_dim, v_users);
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
        EXECUTE format(
            'SELECT count(*) FROM (SELECT 1 FROM ibex_memory.memory_embeddings m'
            ' WHERE m.org_id = %L AND m.agent_id = %L AND m.model = %L AND %s LIMIT 5001) x',
            v_org, p_agent_id, p_model, v_users)
            INTO v_count;
        IF v_count <= 5000 THEN
            RETURN QUERY EXECUTE format(
                'SELECT x.memory_id, x.s FROM ('
                'SELECT m.memory_id, 1 - (m.embedding::vector(%1$s) <=> $1::vector(%1$s)) AS s'
                '  FROM ibex_memory.memory_embeddings m'
                '  JOIN ibex_memory.memories r ON r.id = m.memory_id'
                ' WHERE %2$s OFFSET 0) x'
                ' ORDER BY x.s DESC, x.memory_id LIMIT $2', v_dim, v_where)
                USING p_query, p_limit;
            RETURN;
        END IF;
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
