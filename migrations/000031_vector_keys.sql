-- A vector's row checks two foreign keys instead of four, and a new memory's vector is
-- inserted without a conflict clause.
--
-- memory_embeddings referenced its memory (memory_id, org_id), its agent (agent_id, org_id),
-- its org, and its model: four checks per vector, each a lookup that locks the row it finds
-- (FOR KEY SHARE; the org's and the agent's rows are shared by every concurrent write, which
-- makes them multixacts). The memory's key now holds the agent too, (memory_id, org_id,
-- agent_id) -> memories (id, org_id, agent_id): a vector's org and agent are its memory's,
-- which the memory's own keys tie to the org and the agent, so the vector's separate keys to
-- them are dropped (what they enforced still holds, and a vector filed under another agent
-- than its memory's, which nothing refused before, is refused now). The unique key the
-- reference needs replaces memories_id_org (id, org_id), which nothing else referenced: the
-- table keeps as many indexes.
--
--   memories_id_org_agent             UNIQUE (id, org_id, agent_id), built in this
--                                     transaction (writes of memories wait while it builds)
--   memory_embeddings_memory_fkey     (memory_id, org_id, agent_id), ON DELETE CASCADE as before
--   dropped                           memory_embeddings_agent_fkey, the vector's org key,
--                                     memories_id_org
--   ibex_memory.create_memory         000030's, its vector inserted without ON CONFLICT: the
--                                     memory was created by this statement, so no other
--                                     transaction can have stored its vector (the backfill
--                                     and ibex reembed write only committed memories)

SET LOCAL search_path = pg_catalog;

ALTER TABLE ibex_memory.memories
    ADD CONSTRAINT memories_id_org_agent UNIQUE (id, org_id, agent_id);

DO $$
DECLARE
    v_name text;
BEGIN
    -- The vector's key to its org was named by Postgres (000017 made the table while
    -- 000016's, with a key of the same name, still existed): found by what it references.
    FOR v_name IN
        SELECT c.conname FROM pg_constraint c
         WHERE c.conrelid = 'ibex_memory.memory_embeddings'::regclass AND c.contype = 'f'
           AND c.confrelid = 'ibex_core.orgs'::regclass
    LOOP
        EXECUTE format('ALTER TABLE ibex_memory.memory_embeddings DROP CONSTRAINT %I', v_name);
    END LOOP;
END
$$;

ALTER TABLE ibex_memory.memory_embeddings
    DROP CONSTRAINT memory_embeddings_agent_fkey,
    DROP CONSTRAINT memory_embeddings_memory_fkey,
    ADD CONSTRAINT memory_embeddings_memory_fkey FOREIGN KEY (memory_id, org_id, agent_id)
        REFERENCES ibex_memory.memories (id, org_id, agent_id) ON DELETE CASCADE;

ALTER TABLE ibex_memory.memories DROP CONSTRAINT memories_id_org;

CREATE OR REPLACE FUNCTION ibex_memory.create_memory(
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
    v_mark uuid[] := '{}';
    v_refused uuid[] := '{}';
    v_near uuid;
    v_new uuid;
    v_created_at timestamptz;
    v_valid_from timestamptz;
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    IF p_idempotency_key IS NOT NULL THEN
        RETURN QUERY
        SELECT 'key_exists'::text, m.id, m.org_id, m.agent_id, m.session_id, m.turn_index,
               m.ordinal, m.content, m.content_hash, m.kind, m.metadata, m.created_at,
               m.idempotency_key, m.request_fingerprint, m.valid_from, m.superseded_by,
               m.superseded_at, '{}'::uuid[], '{}'::uuid[]
          FROM ibex_memory.memories m
         WHERE m.org_id = p_org_id AND m.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF cardinality(p_supersedes) > 0 THEN
        -- As 000014: lock in id order, then sort into marked and refused.
        PERFORM 1 FROM ibex_memory.memories m
          WHERE m.org_id = p_org_id AND m.id = ANY(p_supersedes)
          ORDER BY m.id FOR UPDATE;
        SELECT COALESCE(array_agg(s.id ORDER BY s.id)
                        FILTER (WHERE m.id IS NOT NULL AND m.deleted_at IS NULL
                                AND m.superseded_by IS NULL), '{}'),
               COALESCE(array_agg(s.id ORDER BY s.id)
                        FILTER (WHERE (m.id IS NOT NULL
                                       AND (m.agent_id <> p_agent_id
                                            OR m.user_id IS DISTINCT FROM p_user_id))
                                   OR (NOT p_skip_stale
                                       AND (m.id IS NULL OR m.deleted_at IS NOT NULL
                                            OR m.superseded_by IS NOT NULL))), '{}')
          INTO v_mark, v_refused
          FROM (SELECT DISTINCT u AS id FROM unnest(p_supersedes) u) s
          LEFT JOIN ibex_memory.memories m ON m.org_id = p_org_id AND m.id = s.id;
        IF cardinality(v_refused) > 0 THEN
            RETURN QUERY SELECT 'supersedes_invalid'::text, NULL::uuid, NULL::uuid,
                NULL::uuid, NULL::uuid, NULL::integer, NULL::integer, NULL::text, NULL::text,
                NULL::text, NULL::jsonb, NULL::timestamptz, NULL::text, NULL::text,
                NULL::timestamptz, NULL::uuid, NULL::timestamptz, '{}'::uuid[], v_refused;
            RETURN;
        END IF;
    END IF;
    IF p_near_threshold IS NOT NULL AND p_near_threshold > 0 THEN
        v_near := ibex_memory.near_duplicate_of(p_agent_id, p_user_id, p_content,
                                                p_content_hash, p_near_threshold, p_supersedes);
        IF v_near IS NOT NULL THEN
            RETURN QUERY
            SELECT 'near_duplicate'::text, m.id, m.org_id, m.agent_id, m.session_id,
                   m.turn_index, m.ordinal, m.content, m.content_hash, m.kind, m.metadata,
                   m.created_at, m.idempotency_key, m.request_fingerprint, m.valid_from,
                   m.superseded_by, m.superseded_at, '{}'::uuid[], '{}'::uuid[]
              FROM ibex_memory.memories m WHERE m.org_id = p_org_id AND m.id = v_near;
            RETURN;
        END IF;
    END IF;
    FOR attempt IN 1..3 LOOP
        INSERT INTO ibex_memory.memories AS m
            (org_id, agent_id, session_id, turn_index, ordinal, content, content_hash, kind,
             metadata, idempotency_key, request_fingerprint, user_id)
        VALUES (p_org_id, p_agent_id, p_session_id, p_turn_index, p_ordinal, p_content,
                p_content_hash, p_kind, p_metadata, p_idempotency_key,
                p_request_fingerprint, p_user_id)
        ON CONFLICT DO NOTHING
        RETURNING m.id, m.created_at, m.valid_from INTO v_new, v_created_at, v_valid_from;
        IF v_new IS NOT NULL THEN
            IF cardinality(v_mark) > 0 THEN
                UPDATE ibex_memory.memories m
                   SET superseded_by = v_new, superseded_at = now()
                 WHERE m.org_id = p_org_id AND m.id = ANY(v_mark);
            END IF;
            IF p_embedding_model IS NOT NULL AND cardinality(p_embedding) > 0 THEN
                INSERT INTO ibex_memory.memory_embeddings
                    (org_id, memory_id, agent_id, model, dimension, embedding)
                SELECT p_org_id, v_new, p_agent_id, p_embedding_model,
                       cardinality(p_embedding), p_embedding
                 WHERE EXISTS (SELECT 1 FROM ibex_memory.embedding_models x
                                WHERE x.model = p_embedding_model
                                  AND x.dimension = cardinality(p_embedding));
            END IF;
            outcome := 'created'; id := v_new; org_id := p_org_id; agent_id := p_agent_id;
            session_id := p_session_id; turn_index := p_turn_index; ordinal := p_ordinal;
            content := p_content; content_hash := p_content_hash; kind := p_kind;
            metadata := p_metadata; created_at := v_created_at;
            idempotency_key := p_idempotency_key; request_fingerprint := p_request_fingerprint;
            valid_from := v_valid_from; superseded_by := NULL; superseded_at := NULL;
            marked := v_mark; refused := '{}';
            RETURN NEXT;
            RETURN;
        END IF;
        RETURN QUERY
        SELECT CASE WHEN m.idempotency_key = p_idempotency_key THEN 'key_exists'
                    ELSE 'content_exists' END,
               m.id, m.org_id, m.agent_id, m.session_id, m.turn_index, m.ordinal, m.content,
               m.content_hash, m.kind, m.metadata, m.created_at, m.idempotency_key,
               m.request_fingerprint, m.valid_from, m.superseded_by, m.superseded_at,
               '{}'::uuid[], '{}'::uuid[]
          FROM ibex_memory.memories m
         WHERE m.org_id = p_org_id
           AND (m.idempotency_key = p_idempotency_key
                OR (m.agent_id = p_agent_id AND m.content_hash = p_content_hash
                    AND m.user_id IS NOT DISTINCT FROM p_user_id
                    AND m.deleted_at IS NULL AND m.superseded_by IS NULL))
         ORDER BY COALESCE(m.idempotency_key = p_idempotency_key, false) DESC
         LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
