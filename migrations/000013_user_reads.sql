-- Users, the read side: a token says which user it is bound to, and search keeps to one
-- user's memories (and the agent-wide ones) in its index lookups, not after them. Additive:
-- the functions of 000005, 000006 and 000009 stay as they are.
--
--   ibex_memory.authenticate_bearer   authenticate_token with the token's user_id
--   ibex_memory.search_branches       (10 parameters) the 7-parameter branches, each narrowed
--   ibex_memory.search_candidates       to the reader's users: one user, one user and the
--                                       agent-wide memories, the agent-wide ones, or all

-- The bearer lookup (000005's authenticate_token, same stamping of last_used_at) with the
-- user a token is bound to as a last column (NULL: not bound).
CREATE FUNCTION ibex_memory.authenticate_bearer(p_token_hash text)
RETURNS TABLE (id uuid, org_id uuid, name text, token_hash text, prefix text, scopes text[],
               is_service boolean, created_at timestamptz, last_used_at timestamptz,
               revoked_at timestamptz, user_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE ibex_memory.api_tokens t SET last_used_at = now()
     WHERE t.token_hash = p_token_hash
       AND t.revoked_at IS NULL
       AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute');
    RETURN QUERY
    SELECT t.id, t.org_id, t.name, t.token_hash, t.prefix, t.scopes, t.is_service,
           t.created_at, t.last_used_at, t.revoked_at, t.user_id
      FROM ibex_memory.api_tokens t
     WHERE t.token_hash = p_token_hash;
END
$$;

-- Whose memories a read sees, as a condition on m.user_id:
--   p_all_users                    every user's and the agent-wide ones (no condition)
--   p_user_id, p_include_shared    that user's and the agent-wide ones (user_id NULL)
--   p_user_id, not p_include_shared  that user's only
--   no p_user_id                   the agent-wide ones only (never another person's)
CREATE FUNCTION ibex_memory.user_scope_condition(
    p_all_users boolean, p_user_id uuid, p_include_shared boolean)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog
AS $$
SELECT CASE
    WHEN p_all_users THEN 'true'
    WHEN p_user_id IS NOT NULL AND p_include_shared
        THEN format('(m.user_id = %L OR m.user_id IS NULL)', p_user_id)
    WHEN p_user_id IS NOT NULL THEN format('m.user_id = %L', p_user_id)
    ELSE 'm.user_id IS NULL'
END
$$;

-- The branches of the 7-parameter search_branches (000009 and whatever later migrations make
-- of it), each narrowed to the reader's users: the condition joins the branch's scope, next to
-- its deleted_at test, so every branch keeps its index (the per-agent GIN indexes of 000009
-- find the words; idx_memories_agent_user or the agent's recency index orders them).
CREATE FUNCTION ibex_memory.search_branches(
    p_agent_id uuid, p_words text[], p_trigram_words text[], p_session_id uuid,
    p_kinds text[], p_per_word integer, p_per_trigram_word integer,
    p_all_users boolean, p_user_id uuid, p_include_shared boolean)
RETURNS TABLE (word text, kind text, statement text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_condition text := ibex_memory.user_scope_condition(
        p_all_users, p_user_id, p_include_shared);
BEGIN
    RETURN QUERY
    SELECT b.word, b.kind,
           replace(b.statement, 'm.deleted_at IS NULL',
                   'm.deleted_at IS NULL AND ' || v_condition)
      FROM ibex_memory.search_branches(
               p_agent_id, p_words, p_trigram_words, p_session_id, p_kinds, p_per_word,
               p_per_trigram_word) b;
END
$$;

-- search_candidates (000009) over the narrowed branches: the same walk (a trigram branch only
-- for a word that found nothing as such; the all-words branch only when every word found
-- something), within the reader's users, so one user's memories are never crowded out of the
-- capped branches by other people's.
CREATE FUNCTION ibex_memory.search_candidates(
    p_agent_id uuid, p_words text[], p_trigram_words text[], p_session_id uuid,
    p_kinds text[], p_per_word integer, p_per_trigram_word integer,
    p_all_users boolean, p_user_id uuid, p_include_shared boolean)
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
            p_per_trigram_word, p_all_users, p_user_id, p_include_shared)
    LOOP
        CONTINUE WHEN v_branch.kind = 'all' AND cardinality(v_matched) < cardinality(v_searched);
        IF v_branch.kind = 'trigram' THEN
            CONTINUE WHEN v_branch.word = ANY(v_matched);
            IF NOT v_branch.word = ANY(v_searched) THEN
                SELECT b.statement INTO v_sql FROM ibex_memory.search_branches(
                    p_agent_id, ARRAY[v_branch.word], NULL, p_session_id, p_kinds, 1, 1,
                    p_all_users, p_user_id, p_include_shared) b;
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

REVOKE ALL ON FUNCTION
    ibex_memory.authenticate_bearer(text),
    ibex_memory.user_scope_condition(boolean, uuid, boolean),
    ibex_memory.search_branches(uuid, text[], text[], uuid, text[], integer, integer, boolean,
                                uuid, boolean),
    ibex_memory.search_candidates(uuid, text[], text[], uuid, text[], integer, integer, boolean,
                                  uuid, boolean)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    ibex_memory.authenticate_bearer(text),
    ibex_memory.user_scope_condition(boolean, uuid, boolean),
    ibex_memory.search_branches(uuid, text[], text[], uuid, text[], integer, integer, boolean,
                                uuid, boolean),
    ibex_memory.search_candidates(uuid, text[], text[], uuid, text[], integer, integer, boolean,
                                  uuid, boolean)
TO ibex_app;
