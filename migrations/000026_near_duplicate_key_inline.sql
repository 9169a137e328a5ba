-- The near-duplicate index's key computed inline, not through a function call.
--
-- idx_memories_near_duplicate (000018, 000024) is built on near_duplicate_key(org_id,
-- agent_id, user_id, content). Postgres inlines a one-expression SQL function into the
-- index's expression and into the queries that use it, unless the function has a SET clause:
-- 000018's SET search_path = pg_catalog made every insert call it through the function
-- manager (a search_path saved and restored, the SQL function's body read from its stored
-- form and run as a query), about 5 % of create_memory's CPU in Postgres.
--
-- The function is an SQL-standard body (RETURN ...): its names are resolved once, when it is
-- created, and stored as references, so the search_path at a call never mattered. It is made
-- again without the SET clause, its names resolved here against pg_catalog alone. Same
-- expression, same keys: the index's entries stay valid, and the lookup still reads the index
-- (its condition is the inlined expression on both sides).

SET LOCAL search_path = pg_catalog;

CREATE OR REPLACE FUNCTION ibex_memory.near_duplicate_key(
    p_org_id uuid, p_agent_id uuid, p_user_id uuid, p_content text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_org_id::text || '/' || p_agent_id::text || '/' || COALESCE(p_user_id::text, '')
       || '/' || regexp_replace(p_content, '[^0-9]', '', 'g');

-- A connection open across this change keeps the index's expression as it loaded it (the
-- function call) until the index's cache entry is rebuilt, while its next plan of the lookup
-- inlines the call: the two would no longer match, and the lookup would read the whole
-- trigram-count band of the index, every scope's. Setting the key column's statistics target
-- to its default (a change of nothing) makes every connection rebuild that entry.
DO $$
BEGIN
    IF to_regclass('ibex_memory.idx_memories_near_duplicate') IS NOT NULL THEN
        ALTER INDEX ibex_memory.idx_memories_near_duplicate ALTER COLUMN 1 SET STATISTICS -1;
    END IF;
END
$$;
