-- The backfill's and ibex reembed's vectors as real[] literals, not JSON.
--
-- put_embeddings (000016, 000017, 000019) took a batch's vectors as one jsonb array and made
-- each row's real[] with a subquery: jsonb_array_elements_text, then a cast of every
-- component on its own. This one takes them as text[], one '{0.0623452365,...}' literal per
-- memory (what create_memory's vector is sent as, memories.store.vector_literal), each read by
-- real[]'s own input function. Same rows, same checks (a model registered with another
-- dimension stores nothing and answers -1; a memory of another org, or deleted, is skipped).
--
-- The jsonb version stays, for a process started before this migration (a scheduler's
-- backfill round); the code of this version no longer calls it.

CREATE FUNCTION ibex_memory.put_embeddings(
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
    INSERT INTO ibex_memory.memory_embeddings AS e
        (org_id, memory_id, agent_id, model, dimension, embedding)
    SELECT m.org_id, m.id, m.agent_id, p_model, p_dimension, v.vector::real[]
      FROM unnest(p_ids, p_vectors) AS v(id, vector)
      JOIN ibex_memory.memories m ON m.org_id = v_org AND m.id = v.id
     WHERE m.deleted_at IS NULL
    ON CONFLICT (memory_id, model, agent_id) DO UPDATE
       SET embedding = EXCLUDED.embedding, dimension = EXCLUDED.dimension,
           created_at = now();
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;

REVOKE ALL ON FUNCTION ibex_memory.put_embeddings(uuid[], text, integer, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ibex_memory.put_embeddings(uuid[], text, integer, text[]) TO ibex_app;
