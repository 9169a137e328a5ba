-- put_embeddings reads each memory by its primary key.
--
-- put_embeddings (000028) joined the batch's ids to the org's memories:
--     FROM unnest(p_ids, p_vectors) v JOIN ibex_memory.memories m ON m.org_id = v_org AND m.id = v.id
-- and the planner was free to hash the org's live memories and probe them with the batch. On
-- a table that grew faster than autovacuum analyzed it (a new org, a bulk import, a load test)
-- it did: a batch of five vectors read all 157,000 memories of the org (a bitmap scan of
-- idx_memories_agent_user, 88 ms), where five index lookups take a few microseconds. A lateral
-- lookup with LIMIT 1 is not pulled up into a join: each id is one probe of memories_pkey,
-- whatever the statistics say. Same rows, same checks, same answer.
--
-- Its transaction commits without waiting for the WAL flush (synchronous_commit off, for that
-- transaction only): vectors are derived from the memories' text, and the memory service now
-- stores the vectors of API writes in batches after their commit (memories.pending_vectors),
-- a flush each. A server crash can lose the last few batches' vectors, never a memory; the
-- backfill round embeds every memory without a vector again.

SET LOCAL search_path = pg_catalog;

CREATE OR REPLACE FUNCTION ibex_memory.put_embeddings(
    p_ids uuid[], p_model text, p_dimension integer, p_vectors text[])
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
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO ibex_memory.memory_embeddings AS e
        (org_id, memory_id, agent_id, model, dimension, embedding)
    SELECT m.org_id, m.id, m.agent_id, p_model, p_dimension, v.vector::real[]
      FROM unnest(p_ids, p_vectors) AS v(id, vector)
     CROSS JOIN LATERAL (
           SELECT r.org_id, r.id, r.agent_id FROM ibex_memory.memories r
            WHERE r.id = v.id AND r.org_id = v_org AND r.deleted_at IS NULL
            LIMIT 1) m
    ON CONFLICT (memory_id, model, agent_id) DO UPDATE
       SET embedding = EXCLUDED.embedding, dimension = EXCLUDED.dimension,
           created_at = now();
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;
