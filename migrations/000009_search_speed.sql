-- Search indexes bounded by the agent: every search is scoped to one agent, but the GIN indexes
-- of 000006 are over the whole org's content, so a rare or misspelt word first finds its rows in
-- every agent and only then drops the other agents' rows, one heap page each: the cost of a
-- search grew with the org. With btree_gin, a GIN index can hold the agent as a key beside the
-- words, and the index itself returns only the agent's rows.
--
-- Only where the server ships btree_gin (Debian's Postgres does, in contrib; the embedded server
-- may not): there, the composite indexes replace the single-column ones of 000006 (same
-- predicate, same operators, so every plan that used the old index can use the new one). Without
-- btree_gin nothing changes and search runs on 000006's indexes. The trigram index is replaced
-- only where 000006 created one (pg_trgm installed).

DO $$
DECLARE
    trgm_schema text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gin') THEN
        RAISE NOTICE 'btree_gin is not available on this server: search keeps org-wide indexes';
        RETURN;
    END IF;
    -- btree_gin's operator class for uuid is the default for gin, found whatever its schema.
    CREATE EXTENSION IF NOT EXISTS btree_gin;
    CREATE INDEX idx_memories_fts_agent ON ibex_memory.memories
        USING gin (agent_id, content_tsv) WHERE deleted_at IS NULL;
    DROP INDEX ibex_memory.idx_memories_fts;

    SELECT n.nspname INTO trgm_schema
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'pg_trgm';
    IF trgm_schema IS NOT NULL AND to_regclass('ibex_memory.idx_memories_trgm') IS NOT NULL THEN
        EXECUTE format(
            'CREATE INDEX idx_memories_trgm_agent ON ibex_memory.memories'
            ' USING gin (agent_id, content %I.gin_trgm_ops) WHERE deleted_at IS NULL',
            trgm_schema);
        DROP INDEX ibex_memory.idx_memories_trgm;
    END IF;
END
$$;

-- A trigram branch runs only for a word no memory of the agent contains as such. The word's
-- full-text branch has just answered that (it returned a row or none), so its answer is kept
-- rather than asked again with a second probe (which, planned for a word common in the org but
-- absent from the agent, could walk far). A trigram word with no full-text branch of its own
-- (beyond the full-text words' cap) is still probed.
CREATE OR REPLACE FUNCTION ibex_memory.search_candidates(
    p_agent_id uuid, p_words text[], p_trigram_words text[], p_session_id uuid,
    p_kinds text[], p_per_word integer, p_per_trigram_word integer)
RETURNS SETOF uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER ROWS 200
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_branch record;
    v_sql text;
    v_found boolean;
    v_rows bigint;
    v_searched text[] := '{}';
    v_matched text[] := '{}';
BEGIN
    FOR v_branch IN
        SELECT * FROM ibex_memory.search_branches(
            p_agent_id, p_words, p_trigram_words, p_session_id, p_kinds, p_per_word,
            p_per_trigram_word)
    LOOP
        -- No memory has every word when one word alone found none.
        CONTINUE WHEN v_branch.kind = 'all' AND cardinality(v_matched) < cardinality(v_searched);
        IF v_branch.kind = 'trigram' THEN
            CONTINUE WHEN v_branch.word = ANY(v_matched);
            IF NOT v_branch.word = ANY(v_searched) THEN
                SELECT b.statement INTO v_sql FROM ibex_memory.search_branches(
                    p_agent_id, ARRAY[v_branch.word], NULL, p_session_id, p_kinds, 1, 1) b;
                EXECUTE 'SELECT EXISTS (' || v_sql || ')' INTO STRICT v_found;
                CONTINUE WHEN v_found;
            END IF;
        END IF;
        RETURN QUERY EXECUTE v_branch.statement;
        IF v_branch.kind = 'fts' THEN
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_searched := v_searched || v_branch.word;
            IF v_rows > 0 THEN
                v_matched := v_matched || v_branch.word;
            END IF;
        END IF;
    END LOOP;
END
$$;

-- Branches as in 000006, plus one: for a query of two words or more, the newest memories that
-- contain all of them. The per-word branches take the newest memories of each word, so a
-- memory with every word of the query, older than those, was found by none; this branch finds
-- it whatever its age (through the per-agent GIN index the words' posting lists intersect
-- there), which lets the per-word cap stay small. It comes after the per-word branches, and
-- search_candidates skips it when one of the words found nothing (then no memory has them all).
CREATE OR REPLACE FUNCTION ibex_memory.search_branches(
    p_agent_id uuid, p_words text[], p_trigram_words text[], p_session_id uuid,
    p_kinds text[], p_per_word integer, p_per_trigram_word integer)
RETURNS TABLE (word text, kind text, statement text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_org uuid := NULLIF(current_setting('ibex.org_id', true), '')::uuid;
    v_scope text;
BEGIN
    IF v_org IS NULL OR p_agent_id IS NULL THEN
        RETURN;
    END IF;
    v_scope := format('m.org_id = %L AND m.agent_id = %L AND m.deleted_at IS NULL',
                      v_org, p_agent_id);
    IF p_session_id IS NOT NULL THEN
        v_scope := v_scope || format(' AND m.session_id = %L', p_session_id);
    END IF;
    IF p_kinds IS NOT NULL THEN
        v_scope := v_scope || format(' AND m.kind = ANY(%L::text[])', p_kinds);
    END IF;
    RETURN QUERY
    SELECT w, 'fts', format(
               'SELECT m.id FROM ibex_memory.memories m WHERE %s'
               ' AND m.content_tsv @@ to_tsquery(''english'', %L)'
               ' ORDER BY m.created_at DESC LIMIT %s', v_scope, w, p_per_word)
      FROM unnest(coalesce(p_words, '{}')) WITH ORDINALITY AS t (w, n) ORDER BY n;
    IF cardinality(p_words) >= 2 THEN
        RETURN QUERY SELECT array_to_string(p_words, ' & '), 'all', format(
            'SELECT m.id FROM ibex_memory.memories m WHERE %s'
            ' AND m.content_tsv @@ to_tsquery(''english'', %L)'
            ' ORDER BY m.created_at DESC LIMIT %s',
            v_scope, array_to_string(p_words, ' & '), p_per_word);
    END IF;
    RETURN QUERY
    SELECT w, 'trigram', format(
               'SELECT m.id FROM ibex_memory.memories m WHERE %s AND m.content %%> %L'
               ' ORDER BY word_similarity(%L, m.content) DESC, m.id LIMIT %s',
               v_scope, w, w, p_per_trigram_word)
      FROM unnest(coalesce(p_trigram_words, '{}')) WITH ORDINALITY AS t (w, n) ORDER BY n;
END
$$;
