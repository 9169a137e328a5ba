-- Facts that change: a memory may be superseded by a newer one (never deleted by it), a
-- near-identical memory is not stored twice, and a repeated extraction input reuses the
-- result already persisted for it. Additive: every row written before keeps meaning what it
-- meant (current, valid from its creation).
--
--   memories.superseded_by / superseded_at   the memory that replaced this one, and when;
--                                             NULL: current
--   memories.valid_from                       since when the fact holds (its creation)
--   ibex_memory.create_memory                 takes supersedes (marks committed with the new
--                                             row, in the same transaction) and the
--                                             near-duplicate threshold
--   ibex_memory.near_duplicate_of             the current memory of the scope most similar
--                                             to a text (trigram), above a threshold
--   ibex_memory.memory_history                the chain of a memory, oldest first
--   extraction_turns.input_hash               what the extraction's LLM input hashed to
--   ibex_core.begin_extract                   also returns the scope's related memories
--   ibex_core.persist_result                  also stores the input hash
--   ibex_core.find_result                     a result persisted for the same input hash

ALTER TABLE ibex_memory.memories
    ADD COLUMN superseded_by uuid,
    ADD COLUMN superseded_at timestamptz,
    ADD COLUMN valid_from timestamptz;
-- No foreign key on superseded_by: erasure (`ibex prune`) hard-deletes rows, and a pruned
-- successor must not block the prune nor make its predecessor current again. The pair is set
-- together, once.
ALTER TABLE ibex_memory.memories ADD CONSTRAINT memories_superseded_pair
    CHECK ((superseded_by IS NULL) = (superseded_at IS NULL));
ALTER TABLE ibex_memory.memories ADD CONSTRAINT memories_not_self_superseded
    CHECK (superseded_by IS DISTINCT FROM id);
UPDATE ibex_memory.memories SET valid_from = created_at WHERE valid_from IS NULL;
ALTER TABLE ibex_memory.memories ALTER COLUMN valid_from SET DEFAULT now();
ALTER TABLE ibex_memory.memories ALTER COLUMN valid_from SET NOT NULL;

-- Exact duplicates are refused among the *current* memories of a scope: a fact that was
-- superseded ("lives in Lisbon", then Oslo) may be stated again and be current once more.
CREATE UNIQUE INDEX memories_org_agent_user_content_current
    ON ibex_memory.memories
       (org_id, agent_id, COALESCE(user_id, '00000000-0000-0000-0000-000000000000'::uuid),
        content_hash)
    WHERE deleted_at IS NULL AND superseded_by IS NULL;
DROP INDEX ibex_memory.memories_org_agent_user_content_live;

-- History: the memories a memory superseded.
CREATE INDEX idx_memories_superseded_by ON ibex_memory.memories (superseded_by)
    WHERE superseded_by IS NOT NULL;

-- The current memory of one scope (org from the transaction's setting, agent, user or NULL)
-- whose content is the most similar to p_content by pg_trgm's similarity() (the share of
-- trigrams the two texts have in common, in [0, 1]), if that is at least p_threshold; memories
-- in p_exclude (the ones the new memory supersedes) and exact copies (p_content_hash: the
-- unique index answers those) are left out, and so is a memory whose digits differ (in order:
-- "item 1" and "item 2", "March 3" and "March 4", "version 10" and "version 11" are different
-- facts, and trigrams barely see the difference). NULL without pg_trgm, or when nothing is
-- that similar.
--
-- Runs as its owner (SECURITY DEFINER), confined to the caller's org, as search_candidates
-- (000006 says why): under row-level security the trigram index could not be used.
CREATE FUNCTION ibex_memory.near_duplicate_of(
    p_agent_id uuid, p_user_id uuid, p_content text, p_content_hash text, p_threshold real,
    p_exclude uuid[])
RETURNS uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
DECLARE
    v_org uuid := NULLIF(current_setting('ibex.org_id', true), '')::uuid;
    v_id uuid;
BEGIN
    IF v_org IS NULL OR p_threshold IS NULL OR p_threshold <= 0
       OR to_regprocedure('similarity(text,text)') IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('pg_trgm.similarity_threshold', p_threshold::text, true);
    EXECUTE
        'SELECT m.id FROM ibex_memory.memories m'
        ' WHERE m.org_id = $1 AND m.agent_id = $2 AND m.user_id IS NOT DISTINCT FROM $3'
        '   AND m.deleted_at IS NULL AND m.superseded_by IS NULL'
        '   AND m.content % $4 AND m.content_hash <> $5'
        '   AND regexp_replace(m.content, ''[^0-9]'', '''', ''g'')'
        '       = regexp_replace($4, ''[^0-9]'', '''', ''g'')'
        '   AND NOT (m.id = ANY($6))'
        ' ORDER BY similarity(m.content, $4) DESC, m.created_at, m.id LIMIT 1'
        INTO v_id
        USING v_org, p_agent_id, p_user_id, p_content, p_content_hash,
              COALESCE(p_exclude, '{}'::uuid[]);
    RETURN v_id;
END
$$;

-- create_memory (000012) with three trailing parameters, each defaulting to what the call did
-- before:
--   p_supersedes      ids of current memories of the same scope (org, agent, user) the new
--                     memory replaces: they are marked (superseded_by, superseded_at) in the
--                     same transaction as the insert, and only when the insert happens;
--   p_skip_stale      false: an id that is not current (superseded already, deleted, or
--                     unknown) refuses the write ('supersedes_invalid'); true (the pipeline,
--                     whose decision was taken earlier): such an id is skipped, the memory is
--                     stored. An id of another agent or user refuses the write either way;
--   p_near_threshold  refuse a memory near-identical to a current one of the scope
--                     ('near_duplicate', with that memory); NULL or 0: no such check.
-- Order: the key first (a replay, even after the 24 h record, answers with its own row and is
-- never its own near-duplicate), then the supersedes, then the near-duplicate, then the insert
-- (exact duplicates and key races: the unique indexes, as before).
-- The result gains the new memory's valid_from, superseded_by, superseded_at, the ids it marked
-- and, for 'supersedes_invalid', the ids refused.
DROP FUNCTION ibex_memory.create_memory(
    uuid, uuid, uuid, integer, integer, text, text, text, jsonb, text, text, uuid);

CREATE FUNCTION ibex_memory.create_memory(
    p_org_id uuid, p_agent_id uuid, p_session_id uuid, p_turn_index integer, p_ordinal integer,
    p_content text, p_content_hash text, p_kind text, p_metadata jsonb,
    p_idempotency_key text, p_request_fingerprint text, p_user_id uuid DEFAULT NULL,
    p_supersedes uuid[] DEFAULT NULL, p_skip_stale boolean DEFAULT false,
    p_near_threshold real DEFAULT NULL)
RETURNS TABLE (outcome text, id uuid, org_id uuid, agent_id uuid, session_id uuid,
               turn_index integer, ordinal integer, content text, content_hash text, kind text,
               metadata jsonb, created_at timestamptz, idempotency_key text,
               request_fingerprint text, valid_from timestamptz, superseded_by uuid,
               superseded_at timestamptz, marked uuid[], refused uuid[])
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    v_mark uuid[] := '{}';
    v_refused uuid[] := '{}';
    v_near uuid;
    v_new uuid;
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    IF p_idempotency_key IS NOT NULL THEN
        RETURN QUERY
        SELECT 'key_exists'::text, m.id, m.org_id, m.agent_id, m.session_id, m.turn_index,
               m.ordinal, m.content, m.content_hash, m.kind, m.metadata, m.created_at,
               m.idempotency_key, m.request_fingerprint, m.valid_from, m.superseded_by,
               m.superseded_at, '{}'::uuid[], '{}'::uuid[]
          FROM ibex_memory.memories m
         WHERE m.org_id = p_org_id AND m.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF cardinality(p_supersedes) > 0 THEN
        -- Lock the memories to supersede (in id order: two writes superseding the same rows
        -- cannot deadlock), then sort them: current and in scope (marked), in scope but no
        -- longer current (skipped or refused), or out of scope / unknown (refused).
        PERFORM 1 FROM ibex_memory.memories m
          WHERE m.org_id = p_org_id AND m.id = ANY(p_supersedes)
          ORDER BY m.id FOR UPDATE;
        SELECT COALESCE(array_agg(s.id ORDER BY s.id)
                        FILTER (WHERE m.id IS NOT NULL AND m.deleted_at IS NULL
                                AND m.superseded_by IS NULL), '{}'),
               COALESCE(array_agg(s.id ORDER BY s.id)
                        FILTER (WHERE (m.id IS NOT NULL
                                       AND (m.agent_id <> p_agent_id
                                            OR m.user_id IS DISTINCT FROM p_user_id))
                                   OR (NOT p_skip_stale
                                       AND (m.id IS NULL OR m.deleted_at IS NOT NULL
                                            OR m.superseded_by IS NOT NULL))), '{}')
          INTO v_mark, v_refused
          FROM (SELECT DISTINCT u AS id FROM unnest(p_supersedes) u) s
          LEFT JOIN ibex_memory.memories m ON m.org_id = p_org_id AND m.id = s.id;
        IF cardinality(v_refused) > 0 THEN
            RETURN QUERY SELECT 'supersedes_invalid'::text, NULL::uuid, NULL::uuid,
                NULL::uuid, NULL::uuid, NULL::integer, NULL::integer, NULL::text, NULL::text,
                NULL::text, NULL::jsonb, NULL::timestamptz, NULL::text, NULL::text,
                NULL::timestamptz, NULL::uuid, NULL::timestamptz, '{}'::uuid[], v_refused;
            RETURN;
        END IF;
    END IF;
    IF p_near_threshold IS NOT NULL AND p_near_threshold > 0 THEN
        v_near := ibex_memory.near_duplicate_of(p_agent_id, p_user_id, p_content,
                                                p_content_hash, p_near_threshold, p_supersedes);
        IF v_near IS NOT NULL THEN
            RETURN QUERY
            SELECT 'near_duplicate'::text, m.id, m.org_id, m.agent_id, m.session_id,
                   m.turn_index, m.ordinal, m.content, m.content_hash, m.kind, m.metadata,
                   m.created_at, m.idempotency_key, m.request_fingerprint, m.valid_from,
                   m.superseded_by, m.superseded_at, '{}'::uuid[], '{}'::uuid[]
              FROM ibex_memory.memories m WHERE m.org_id = p_org_id AND m.id = v_near;
            RETURN;
        END IF;
    END IF;
    FOR attempt IN 1..3 LOOP
        INSERT INTO ibex_memory.memories AS m
            (org_id, agent_id, session_id, turn_index, ordinal, content, content_hash, kind,
             metadata, idempotency_key, request_fingerprint, user_id)
        VALUES (p_org_id, p_agent_id, p_session_id, p_turn_index, p_ordinal, p_content,
                p_content_hash, p_kind, p_metadata, p_idempotency_key,
                p_request_fingerprint, p_user_id)
        ON CONFLICT DO NOTHING
        RETURNING m.id INTO v_new;
        IF v_new IS NOT NULL THEN
            IF cardinality(v_mark) > 0 THEN
                UPDATE ibex_memory.memories m
                   SET superseded_by = v_new, superseded_at = now()
                 WHERE m.org_id = p_org_id AND m.id = ANY(v_mark);
            END IF;
            RETURN QUERY
            SELECT 'created'::text, m.id, m.org_id, m.agent_id, m.session_id, m.turn_index,
                   m.ordinal, m.content, m.content_hash, m.kind, m.metadata, m.created_at,
                   m.idempotency_key, m.request_fingerprint, m.valid_from, m.superseded_by,
                   m.superseded_at, v_mark, '{}'::uuid[]
              FROM ibex_memory.memories m WHERE m.id = v_new;
            RETURN;
        END IF;
        RETURN QUERY
        SELECT CASE WHEN m.idempotency_key = p_idempotency_key THEN 'key_exists'
                    ELSE 'content_exists' END,
               m.id, m.org_id, m.agent_id, m.session_id, m.turn_index, m.ordinal, m.content,
               m.content_hash, m.kind, m.metadata, m.created_at, m.idempotency_key,
               m.request_fingerprint, m.valid_from, m.superseded_by, m.superseded_at,
               '{}'::uuid[], '{}'::uuid[]
          FROM ibex_memory.memories m
         WHERE m.org_id = p_org_id
           AND (m.idempotency_key = p_idempotency_key
                OR (m.agent_id = p_agent_id AND m.content_hash = p_content_hash
                    AND m.user_id IS NOT DISTINCT FROM p_user_id
                    AND m.deleted_at IS NULL AND m.superseded_by IS NULL))
         ORDER BY COALESCE(m.idempotency_key = p_idempotency_key, false) DESC
         LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The chain a memory belongs to, oldest first: walking superseded_by back to the first memory
-- and forward to the current one. A memory superseding several (a merge) lists all of them
-- before it; the walk stops at a pruned row. Under the caller's row-level security.
CREATE FUNCTION ibex_memory.memory_history(p_memory_id uuid)
RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY INVOKER
AS $$
    WITH RECURSIVE newer AS (
        SELECT m.id, m.superseded_by, 0 AS depth
          FROM ibex_memory.memories m WHERE m.id = p_memory_id AND m.deleted_at IS NULL
        UNION
        SELECT m.id, m.superseded_by, n.depth + 1
          FROM newer n JOIN ibex_memory.memories m ON m.id = n.superseded_by
         WHERE n.depth < 1000
    ), head AS (
        SELECT id FROM newer ORDER BY depth DESC LIMIT 1
    ), older AS (
        SELECT h.id, 0 AS depth FROM head h
        UNION
        SELECT m.id, o.depth + 1
          FROM older o JOIN ibex_memory.memories m ON m.superseded_by = o.id
         WHERE o.depth < 1000
    )
    SELECT m.id FROM older o JOIN ibex_memory.memories m ON m.id = o.id
     ORDER BY m.valid_from, m.created_at, m.id
$$;

-- Repeated extraction inputs: what the LLM would be sent for a turn (see
-- extraction.prompt.input_hash), hashed with the scope, stored with the result.
ALTER TABLE ibex_core.extraction_turns ADD COLUMN input_hash text;
-- The turn's result was reused from an identical input: no LLM call was made for it.
ALTER TABLE ibex_core.extraction_turns ADD COLUMN reused boolean NOT NULL DEFAULT false;
CREATE INDEX idx_extraction_turns_input_hash ON ibex_core.extraction_turns (input_hash)
    WHERE input_hash IS NOT NULL AND result IS NOT NULL;

-- A result persisted for another turn whose input hashed the same (the hash covers the scope:
-- org, agent, user), or none. Under row-level security.
CREATE FUNCTION ibex_core.find_result(p_org_id uuid, p_input_hash text)
RETURNS TABLE (result jsonb, provider text, model text)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    RETURN QUERY
    SELECT e.result, e.provider, e.model FROM ibex_core.extraction_turns e
     WHERE e.input_hash = p_input_hash AND e.result IS NOT NULL
     ORDER BY e.extracted_at, e.session_id, e.turn_index
     LIMIT 1;
END
$$;

-- persist_result (000012) with two trailing parameters: the input hash (NULL by default), and
-- p_reused: the result is another turn's, reused for an identical input, so the LLM call the
-- claim counted (begin_extract counts one when it claims) was not made and is uncounted.
DROP FUNCTION ibex_core.persist_result(
    uuid, uuid, integer, uuid, jsonb, integer, integer, integer, text, text, integer);

CREATE FUNCTION ibex_core.persist_result(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_token uuid, p_result jsonb,
    p_memory_count integer, p_prompt_tokens integer, p_completion_tokens integer,
    p_provider text, p_model text, p_lease_seconds integer, p_input_hash text DEFAULT NULL,
    p_reused boolean DEFAULT false)
RETURNS TABLE (mine boolean, result jsonb, provider text, model text, prompt_tokens integer,
               completion_tokens integer, written integer[], agent_id uuid, user_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    RETURN QUERY
    WITH stored AS (
        UPDATE ibex_core.extraction_turns e
           SET result = p_result, memory_count = p_memory_count,
               prompt_tokens = p_prompt_tokens, completion_tokens = p_completion_tokens,
               provider = p_provider, model = p_model, input_hash = p_input_hash,
               reused = p_reused,
               llm_calls = CASE WHEN p_reused THEN GREATEST(e.llm_calls - 1, 0)
                                ELSE e.llm_calls END,
               attempts = CASE WHEN p_reused THEN GREATEST(e.attempts - 1, 0)
                               ELSE e.attempts END,
               state = 'extracted', extracted_at = now(), last_error = NULL,
               claim_token = NULL, claim_expires_at = NULL,
               lease_expires_at = GREATEST(COALESCE(e.lease_expires_at, now()),
                                           now() + make_interval(secs => p_lease_seconds))
          FROM ibex_core.sessions s
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index AND e.result IS NULL
           AND s.id = e.session_id
        RETURNING true, e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,
            ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                   WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),
            s.agent_id, s.user_id
    )
    SELECT * FROM stored;
    IF FOUND THEN
        RETURN;
    END IF;
    UPDATE ibex_core.extraction_turns e SET claim_token = NULL, claim_expires_at = NULL
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.claim_token = p_token;
    RETURN QUERY
    SELECT false, e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,
           ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                  WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),
           NULL::uuid, NULL::uuid
      FROM ibex_core.extraction_turns e
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.result IS NOT NULL
       FOR UPDATE OF e;
END
$$;

-- begin_extract (000010) with the related memories: one more trailing parameter, p_related
-- (how many to list, EXTRACTION_RELATED_MEMORIES; 0 by default: none), and three more columns
-- when claimed: related (a JSON array of {id, content, kind}, best first), and the session's
-- agent and user (the scope of the extraction's input hash). Same decisions, same locks; the
-- related read is one more statement inside the same round trip.
DROP FUNCTION ibex_core.begin_extract(
    uuid, uuid, integer, integer, integer, integer, integer, uuid, boolean, uuid);

CREATE FUNCTION ibex_core.begin_extract(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_claim_seconds integer,
    p_lease_seconds integer, p_max_attempts integer, p_first_turn integer, p_takeover uuid,
    p_call_llm boolean, p_token uuid, p_related integer DEFAULT 0)
RETURNS TABLE (outcome text, turn_count integer, result jsonb, provider text, model text,
               prompt_tokens integer, completion_tokens integer, written integer[],
               retry_after double precision, attempts integer, last_error text, turns jsonb,
               related jsonb, agent_id uuid, user_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    v_pointer integer;
    v_count integer;
    v_joined record;
    v_turn ibex_core.extraction_turns;
    v_live boolean;
    v_left double precision;
    v_counted integer;
    v_agent uuid;
    v_user uuid;
    v_related jsonb := '[]'::jsonb;
    v_query tsquery;
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    -- Usually the scan recorded the row: lock it and read its session in one statement.
    SELECT s.last_extracted_turn AS pointer, s.turn_count AS n, e AS turn, s.agent_id AS agent,
           s.user_id AS usr INTO v_joined
      FROM ibex_core.extraction_turns e
      JOIN ibex_core.sessions s ON s.id = e.session_id
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       FOR UPDATE OF e;
    IF FOUND THEN
        v_pointer := v_joined.pointer;
        v_count := v_joined.n;
        v_turn := v_joined.turn;
        v_agent := v_joined.agent;
        v_user := v_joined.usr;
    ELSE
        SELECT s.last_extracted_turn, s.turn_count, s.agent_id, s.user_id
          INTO v_pointer, v_count, v_agent, v_user
          FROM ibex_core.sessions s WHERE s.id = p_session_id;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'no_session'::text, NULL::integer, NULL::jsonb, NULL::text,
                NULL::text, NULL::integer, NULL::integer, NULL::integer[], NULL::float8,
                NULL::integer, NULL::text, NULL::jsonb,
                NULL::jsonb, NULL::uuid, NULL::uuid;
            RETURN;
        END IF;
        v_turn := NULL;
    END IF;
    IF p_turn_index > v_count THEN
        RETURN QUERY SELECT 'no_turn'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
            NULL::integer, NULL::integer, NULL::integer[], NULL::float8, NULL::integer,
            NULL::text, NULL::jsonb,
                NULL::jsonb, NULL::uuid, NULL::uuid;
        RETURN;
    END IF;
    IF v_turn.session_id IS NULL THEN
        IF p_turn_index <= v_pointer THEN
            -- Below the pointer every turn is done, even one recorded before this table.
            RETURN QUERY SELECT 'done'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
                NULL::integer, NULL::integer, NULL::integer[], NULL::float8, NULL::integer,
                NULL::text, NULL::jsonb,
                NULL::jsonb, NULL::uuid, NULL::uuid;
            RETURN;
        END IF;
        INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index)
        VALUES (p_org_id, p_session_id, p_turn_index) ON CONFLICT DO NOTHING;
        SELECT * INTO v_turn FROM ibex_core.extraction_turns e
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index FOR UPDATE;
    END IF;
    PERFORM ibex_core.stage_pause('begin_extract.locked');
    IF v_turn.state = 'done' THEN
        RETURN QUERY SELECT 'done'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
            NULL::integer, NULL::integer, NULL::integer[], NULL::float8, NULL::integer,
            NULL::text, NULL::jsonb,
                NULL::jsonb, NULL::uuid, NULL::uuid;
        RETURN;
    END IF;
    IF v_turn.state = 'failed' THEN
        -- A failed turn is only delivered again by an operator's replay (the scan skips it):
        -- start a fresh series of attempts, where its persisted state says.
        v_turn.attempts := 0;
        UPDATE ibex_core.extraction_turns e
           SET state = CASE WHEN e.result IS NULL THEN 'pending'::ibex_core.turn_state
                            ELSE 'extracted'::ibex_core.turn_state END,
               attempts = 0
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
    END IF;
    IF v_turn.result IS NOT NULL THEN
        RETURN QUERY SELECT 'persisted'::text, v_count, v_turn.result, v_turn.provider,
            v_turn.model, v_turn.prompt_tokens, v_turn.completion_tokens,
            ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                   WHERE x.session_id = p_session_id AND x.turn_index = p_turn_index),
            NULL::float8, v_turn.attempts, NULL::text, NULL::jsonb,
                NULL::jsonb, NULL::uuid, NULL::uuid;
        RETURN;
    END IF;
    v_live := COALESCE(v_turn.claim_expires_at > now(), false);
    IF v_live AND v_turn.claim_token = p_token THEN
        -- Our own claim: this very call ran before and its answer was lost with the connection.
        v_counted := 0;
    ELSE
        IF v_live AND (p_takeover IS NULL OR v_turn.claim_token <> p_takeover) THEN
            v_left := GREATEST(EXTRACT(EPOCH FROM v_turn.claim_expires_at - now()), 0);
            RETURN QUERY SELECT 'busy'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
                NULL::integer, NULL::integer, NULL::integer[], v_left, v_turn.attempts,
                NULL::text, NULL::jsonb,
                NULL::jsonb, NULL::uuid, NULL::uuid;
            RETURN;
        END IF;
        IF p_call_llm AND v_turn.attempts >= p_max_attempts THEN
            RETURN QUERY SELECT 'gave_up'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
                NULL::integer, NULL::integer, NULL::integer[], NULL::float8, v_turn.attempts,
                v_turn.last_error, NULL::jsonb,
                NULL::jsonb, NULL::uuid, NULL::uuid;
            RETURN;
        END IF;
        v_counted := CASE WHEN p_call_llm THEN 1 ELSE 0 END;
        UPDATE ibex_core.extraction_turns e
           SET claim_token = p_token,
               claim_expires_at = now() + make_interval(secs => p_claim_seconds),
               attempts = e.attempts + v_counted, llm_calls = e.llm_calls + v_counted,
               lease_expires_at = GREATEST(COALESCE(e.lease_expires_at, now()),
                                           now() + make_interval(secs => p_lease_seconds))
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
    END IF;
    -- With the claim: the scope's current memories most related to the turn (at most
    -- p_related), for the prompt to list, so the answer can say which one a new memory
    -- replaces. The scope is exactly the session's (agent, user): a memory may only supersede
    -- one of its own scope. Ranked as search ranks text: full-text rank (ts_rank_cd) of each
    -- memory against the words of the turn (its messages and completion), then recency, among
    -- the newest RELATED_WINDOW (200) current memories of the scope: a memory older than those
    -- is not listed. A scope with at most p_related memories lists them all, so a fact said in
    -- other words ("moved to Oslo" against "lives in Lisbon") is still in the prompt.
    IF p_related > 0 THEN
        SELECT NULLIF(array_to_string(ARRAY(
                   SELECT quote_literal(l)
                     FROM unnest(tsvector_to_array(
                              to_tsvector('english', p.messages)
                              || to_tsvector('english', p.completion))) l
                    WHERE l NOT IN ('user', 'assist', 'system', 'content', 'role')
                    LIMIT 64), ' | '), '')::tsquery
          INTO v_query
          FROM ibex_core.checkpoints c
          JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id
         WHERE c.session_id = p_session_id AND c.turn_index = p_turn_index;
        SELECT COALESCE(jsonb_agg(jsonb_build_object('id', r.id, 'content', r.content,
                                                     'kind', r.kind)
                                  ORDER BY r.rank DESC, r.created_at DESC, r.id), '[]'::jsonb)
          INTO v_related
          FROM (SELECT w.id, w.content, w.kind, w.created_at,
                       COALESCE(ts_rank_cd(w.content_tsv, v_query), 0) AS rank
                  FROM (SELECT m.id, m.content, m.kind, m.created_at, m.content_tsv
                          FROM ibex_memory.memories m
                         WHERE m.org_id = p_org_id AND m.agent_id = v_agent
                           AND ((v_user IS NULL AND m.user_id IS NULL) OR m.user_id = v_user)
                           AND m.deleted_at IS NULL AND m.superseded_by IS NULL
                         ORDER BY m.created_at DESC LIMIT 200) w
                 ORDER BY 5 DESC, w.created_at DESC, w.id
                 LIMIT p_related) r;
    END IF;
    -- With the claim: the turn and the turns before it that give its context, with content.
    RETURN QUERY
    SELECT 'claimed'::text, v_count, NULL::jsonb, NULL::text, NULL::text, NULL::integer,
           NULL::integer, NULL::integer[], NULL::float8, v_turn.attempts + v_counted,
           NULL::text,
           COALESCE(jsonb_agg(jsonb_build_object(
                        'turn_index', c.turn_index, 'prompt_tokens', c.prompt_tokens,
                        'completion_tokens', c.completion_tokens, 'latency_ms', c.latency_ms,
                        'messages', p.messages, 'completion', p.completion)
                    ORDER BY c.turn_index), '[]'::jsonb),
           v_related, v_agent, v_user
      FROM ibex_core.checkpoints c
      JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id
     WHERE c.session_id = p_session_id
       AND c.turn_index BETWEEN GREATEST(p_first_turn, 1) AND p_turn_index;
END
$$;

REVOKE ALL ON FUNCTION
    ibex_memory.create_memory(uuid, uuid, uuid, integer, integer, text, text, text, jsonb, text,
                              text, uuid, uuid[], boolean, real),
    ibex_core.begin_extract(uuid, uuid, integer, integer, integer, integer, integer, uuid,
                            boolean, uuid, integer),
    ibex_core.persist_result(uuid, uuid, integer, uuid, jsonb, integer, integer, integer, text,
                             text, integer, text, boolean),
    ibex_core.find_result(uuid, text)
FROM PUBLIC;
-- The near-duplicate lookup is called by create_memory as the tenant role, as the search
-- functions are; the history walk runs under the caller's row-level security.
REVOKE ALL ON FUNCTION
    ibex_memory.near_duplicate_of(uuid, uuid, text, text, real, uuid[]),
    ibex_memory.memory_history(uuid)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    ibex_memory.near_duplicate_of(uuid, uuid, text, text, real, uuid[]),
    ibex_memory.memory_history(uuid)
TO ibex_app;
