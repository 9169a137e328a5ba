-- The near-duplicate key's digits taken out run by run, not character by character.
--
-- near_duplicate_key (000018, 000026) keeps the digits of a memory's content with
-- regexp_replace(p_content, '[^0-9]', '', 'g'): one match, and one replacement, per character
-- that is not a digit. Every insert computes it for the index (idx_memories_near_duplicate) and
-- the near-duplicate check again for its lookup: for a memory of 25 words, about a tenth of
-- create_memory's CPU in Postgres (32 us a call for 150 characters). '[^0-9]+' matches each run
-- of non-digits at once, which deletes the same characters: the same key for every content, in
-- 2.5 us. The index's entries stay valid (same keys), so it is not built again.

SET LOCAL search_path = pg_catalog;

CREATE OR REPLACE FUNCTION ibex_memory.near_duplicate_key(
    p_org_id uuid, p_agent_id uuid, p_user_id uuid, p_content text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_org_id::text || '/' || p_agent_id::text || '/' || COALESCE(p_user_id::text, '')
       || '/' || regexp_replace(p_content, '[^0-9]+', '', 'g');

-- As in 000026: a connection open across this change keeps the index's expression as it was
-- inlined when it loaded the index, while its next plan of the lookup inlines the new body;
-- the two would no longer match. A change of nothing to the index makes every connection load
-- it again.
DO $$
BEGIN
    IF to_regclass('ibex_memory.idx_memories_near_duplicate') IS NOT NULL THEN
        ALTER INDEX ibex_memory.idx_memories_near_duplicate ALTER COLUMN 1 SET STATISTICS -1;
    END IF;
END
$$;
