-- Search over memories (POST /v1/memories/search, POST /v1/context), ranked in Postgres.
--
-- Full text: a stored, generated tsvector of the content (english configuration: stemming and
-- stop words) with a GIN index. Typos and names: pg_trgm's word similarity, with a trigram GIN
-- index on the content, only where the server ships the extension (Debian's Postgres does; the
-- embedded server may not, and search is then full-text alone). Every search is scoped to one
-- agent, so a btree on (org, agent) lets the planner combine it with either GIN index.
-- All three indexes skip soft-deleted rows, which search never returns.

ALTER TABLE ibex_memory.memories
    ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('english'::regconfig, content)) STORED;

CREATE INDEX idx_memories_fts ON ibex_memory.memories USING gin (content_tsv)
    WHERE deleted_at IS NULL;

CREATE INDEX idx_memories_agent ON ibex_memory.memories (org_id, agent_id, created_at DESC)
    WHERE deleted_at IS NULL;

DO $$
DECLARE
    trgm_schema text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
        RAISE NOTICE 'pg_trgm is not available on this server: search is full-text only';
        RETURN;
    END IF;
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
    SELECT n.nspname INTO trgm_schema
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'pg_trgm';
    EXECUTE format(
        'CREATE INDEX idx_memories_trgm ON ibex_memory.memories'
        ' USING gin (content %I.gin_trgm_ops) WHERE deleted_at IS NULL',
        trgm_schema);
END
$$;

-- The candidates of one search: ids only, found through the indexes.
--
-- Row-level security cannot use the GIN indexes itself: its policy runs first, and Postgres
-- evaluates no non-leakproof operator (@@, %>) before it, so under RLS a word can only be
-- checked row by row. This function runs as its owner (the role that migrates; a superuser or
-- BYPASSRLS owner skips the policy, any other owner still gets correct answers through it),
-- and confines itself to the caller's org: the one set for the transaction by the tenant
-- scope, never a parameter. It returns ids only; the caller reads the rows under RLS.
--
-- search_branches builds the statements (also what the speed benchmark EXPLAINs), one capped
-- branch per word, each planned with its word as a constant (EXECUTE), so the
-- planner picks per word: the GIN index for a rare word, the agent index in recency order
-- (stopping at the cap) for a word most memories contain. A trigram branch runs only for a word
-- no memory of the agent contains as such (a typo, a variant of a name), and takes the most
-- similar memories: an order no index gives, so the planner reads the trigram index rather
-- than walk the agent's memories in recency order checking each.
CREATE FUNCTION ibex_memory.search_branches(
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
    RETURN QUERY
    SELECT w, 'trigram', format(
               'SELECT m.id FROM ibex_memory.memories m WHERE %s AND m.content %%> %L'
               ' ORDER BY word_similarity(%L, m.content) DESC, m.id LIMIT %s',
               v_scope, w, w, p_per_trigram_word)
      FROM unnest(coalesce(p_trigram_words, '{}')) WITH ORDINALITY AS t (w, n) ORDER BY n;
END
$$;

CREATE FUNCTION ibex_memory.search_candidates(
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
BEGIN
    FOR v_branch IN
        SELECT * FROM ibex_memory.search_branches(
            p_agent_id, p_words, p_trigram_words, p_session_id, p_kinds, p_per_word,
            p_per_trigram_word)
    LOOP
        IF v_branch.kind = 'trigram' THEN
            -- Skipped when some memory of the agent contains the word as such.
            SELECT b.statement INTO v_sql FROM ibex_memory.search_branches(
                p_agent_id, ARRAY[v_branch.word], NULL, p_session_id, p_kinds, 1, 1) b;
            EXECUTE 'SELECT EXISTS (' || v_sql || ')' INTO STRICT v_found;
            CONTINUE WHEN v_found;
        END IF;
        RETURN QUERY EXECUTE v_branch.statement;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION ibex_memory.search_branches(
    uuid, text[], text[], uuid, text[], integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ibex_memory.search_branches(
    uuid, text[], text[], uuid, text[], integer, integer) TO ibex_app;
REVOKE ALL ON FUNCTION ibex_memory.search_candidates(
    uuid, text[], text[], uuid, text[], integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ibex_memory.search_candidates(
    uuid, text[], text[], uuid, text[], integer, integer) TO ibex_app;
