-- The near-duplicate check with a plan kept, not made on every write.
--
-- near_duplicate_of (000018) ran its query with EXECUTE, so Postgres planned it on every
-- write: about a sixth of the write's CPU in Postgres, more than the query itself. A static
-- statement keeps its plan, but the plan kept is a generic one (made for any parameters), and
-- with the statistics of a table that has just grown it chose a full scan of another partial
-- index of the table (memories_org_agent_user_content_current, whose predicate the query's
-- "deleted_at IS NULL AND superseded_by IS NULL" implies) and read every current memory.
--
-- So the index and the query now say "current" in a form no other index of the table is
-- built on: (deleted_at IS NULL AND superseded_by IS NULL) IS TRUE, which holds for the same
-- rows (neither test is ever NULL). The query implies this index's predicate and no other
-- partial index's, so the only index it can use is this one, whatever the statistics; the
-- rows, the keys and the answers are 000018's.
--
--   idx_memories_near_duplicate   made again with that predicate (same columns)
--   ibex_memory.near_duplicate_of 000018's query as a static statement

DO $$
BEGIN
    IF to_regprocedure('show_trgm(text)') IS NOT NULL THEN
        DROP INDEX IF EXISTS ibex_memory.idx_memories_near_duplicate;
        CREATE INDEX idx_memories_near_duplicate ON ibex_memory.memories (
            (ibex_memory.near_duplicate_key(org_id, agent_id, user_id, content)),
            (cardinality(show_trgm(content))))
        WHERE (deleted_at IS NULL AND superseded_by IS NULL) IS TRUE;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION ibex_memory.near_duplicate_of(
    p_agent_id uuid, p_user_id uuid, p_content text, p_content_hash text, p_threshold real,
    p_exclude uuid[])
RETURNS uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_org uuid := NULLIF(current_setting('ibex.org_id', true), '')::uuid;
    v_id uuid;
    v_trigrams integer;
BEGIN
    IF v_org IS NULL OR p_threshold IS NULL OR p_threshold <= 0
       OR to_regprocedure('similarity(text,text)') IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('pg_trgm.similarity_threshold', p_threshold::text, true);
    v_trigrams := cardinality(show_trgm(p_content));
    -- The band, widened by one trigram each way against float rounding (the similarity
    -- test decides). The scope is tested again as such (IS TRUE: not an index condition).
    SELECT m.id INTO v_id
      FROM ibex_memory.memories m
     WHERE ibex_memory.near_duplicate_key(m.org_id, m.agent_id, m.user_id, m.content)
           = ibex_memory.near_duplicate_key(v_org, p_agent_id, p_user_id, p_content)
       AND cardinality(show_trgm(m.content))
           BETWEEN floor(p_threshold * v_trigrams)::integer - 1
               AND ceil(v_trigrams / p_threshold)::integer + 1
       AND (m.deleted_at IS NULL AND m.superseded_by IS NULL) IS TRUE
       AND (m.org_id = v_org AND m.agent_id = p_agent_id
            AND m.user_id IS NOT DISTINCT FROM p_user_id) IS TRUE
       AND m.content % p_content AND m.content_hash <> p_content_hash
       AND NOT (m.id = ANY(COALESCE(p_exclude, '{}'::uuid[])))
     ORDER BY similarity(m.content, p_content) DESC, m.created_at, m.id
     LIMIT 1;
    RETURN v_id;
END
$$;
