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
--   idx_memories_near_duplicate   (org, agent, user, digits, trigram count) of the current
--                                 memories; made only where pg_trgm is installed (without it
--                                 there is no near-duplicate check)
--   ibex_memory.near_duplicate_of 000014's function, reading through that index

DO $$
BEGIN
    IF to_regprocedure('show_trgm(text)') IS NOT NULL THEN
        CREATE INDEX idx_memories_near_duplicate ON ibex_memory.memories (
            org_id, agent_id, COALESCE(user_id, '00000000-0000-0000-0000-000000000000'::uuid),
            (regexp_replace(content, '[^0-9]', '', 'g')),
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
    -- test below decides).
    EXECUTE
        'SELECT m.id FROM ibex_memory.memories m'
        ' WHERE m.org_id = $1 AND m.agent_id = $2'
        '   AND COALESCE(m.user_id, ''00000000-0000-0000-0000-000000000000''::uuid)'
        '       = COALESCE($3, ''00000000-0000-0000-0000-000000000000''::uuid)'
        '   AND m.deleted_at IS NULL AND m.superseded_by IS NULL'
        '   AND regexp_replace(m.content, ''[^0-9]'', '''', ''g'')'
        '       = regexp_replace($4, ''[^0-9]'', '''', ''g'')'
        '   AND cardinality(show_trgm(m.content)) BETWEEN $7 AND $8'
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
