-- The near-duplicate check of 000014 without reading the whole scope. near_duplicate_of
-- compared the new content with every current memory of the agent and user (pg_trgm's
-- similarity() on each: some 10 us a row), so each write cost more as the agent grew: 2.7 ms
-- at 168 memories, and it was most of the Postgres time of a pipeline turn.
--
-- Two conditions every near-duplicate meets already narrow it to a few rows, read from one
-- btree index:
--   - the same digits in the same order (000014's rule: "item 1" and "item 2" differ);
--   - a trigram count in the band similarity allows: similarity(a, b) is
--     |A & B| / |A | B| over the two trigram sets, at most min(|A|, |B|) / max(|A|, |B|), so
--     similarity >= t needs t * |A| <= |B| <= |A| / t.
-- Both are necessary, so the answers are those of 000014 exactly; only fewer rows are read.
--
--   ibex_memory.near_duplicate_key the scope (org, agent, user) and the digits, as one text
--   idx_memories_near_duplicate   (that key, trigram count) of the current memories; made only
--                                 where pg_trgm is installed (without it there is no
--                                 near-duplicate check)
--   ibex_memory.near_duplicate_of 000014's function, reading through that index

-- The scope and the digits are one text key, so that no other index of the table can serve
-- the lookup (each of them leads with org_id, and a statement that named org_id as such let
-- the planner take one of them when its statistics were stale, and read the whole agent).
CREATE FUNCTION ibex_memory.near_duplicate_key(
    p_org_id uuid, p_agent_id uuid, p_user_id uuid, p_content text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog
RETURN p_org_id::text || '/' || p_agent_id::text || '/' || COALESCE(p_user_id::text, '')
       || '/' || regexp_replace(p_content, '[^0-9]', '', 'g');
REVOKE ALL ON FUNCTION ibex_memory.near_duplicate_key(uuid, uuid, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ibex_memory.near_duplicate_key(uuid, uuid, uuid, text) TO ibex_app;

DO $$
BEGIN
    IF to_regprocedure('show_trgm(text)') IS NOT NULL THEN
        CREATE INDEX idx_memories_near_duplicate ON ibex_memory.memories (
            (ibex_memory.near_duplicate_key(org_id, agent_id, user_id, content)),
            (cardinality(show_trgm(content))))
        WHERE deleted_at IS NULL AND superseded_by IS NULL;
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
    EXECUTE 'SELECT cardinality(show_trgm($1))' INTO v_trigrams USING p_content;
    -- The band, widened by one trigram each way against float rounding (the similarity
    -- test decides). The scope is tested again as such (IS TRUE: not an index condition).
    EXECUTE
        'SELECT m.id FROM ibex_memory.memories m'
        ' WHERE ibex_memory.near_duplicate_key(m.org_id, m.agent_id, m.user_id, m.content)'
        '       = ibex_memory.near_duplicate_key($1, $2, $3, $4)'
        '   AND cardinality(show_trgm(m.content)) BETWEEN $7 AND $8'
        '   AND m.deleted_at IS NULL AND m.superseded_by IS NULL'
        '   AND (m.org_id = $1 AND m.agent_id = $2'
        '        AND m.user_id IS NOT DISTINCT FROM $3) IS TRUE'
        '   AND m.content % $4 AND m.content_hash <> $5'
        '   AND NOT (m.id = ANY($6))'
        ' ORDER BY similarity(m.content, $4) DESC, m.created_at, m.id LIMIT 1'
        INTO v_id
        USING v_org, p_agent_id, p_user_id, p_content, p_content_hash,
              COALESCE(p_exclude, '{}'::uuid[]),
              floor(p_threshold * v_trigrams)::integer - 1,
              ceil(v_trigrams / p_threshold)::integer + 1;
    RETURN v_id;
END
$$;
