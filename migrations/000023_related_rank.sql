-- The related memories of the extraction prompt ranked by ts_rank instead of ts_rank_cd.
--
-- begin_extract (000022) lists, with the claim, up to p_related current memories of the
-- session's scope most related to the turn: each of the scope's 200 newest current memories
-- ranked against the OR of the turn's lexemes. For such a query every cover is one matched
-- word, so cover density (ts_rank_cd) ranks by the matched words as ts_rank does, at many times
-- its cost: 10-40 us a memory against well under 1 (7.9 ms of begin_extract's 8 per call on
-- a 144-memory scope, the largest share of Postgres' CPU per turn). Same parameters, same
-- columns, same outcomes; only the rank function differs.

CREATE OR REPLACE FUNCTION ibex_core.begin_extract(
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
    v_budget record;
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
        IF p_call_llm THEN
            -- The org's budget, in the statement that takes the claim: over it, no LLM call;
            -- the turn waits (no attempt counted, never dead-lettered) and the scan sends it
            -- again when its short lease ends.
            SELECT b.token_limit, b.used, b.period_start, ibex_core.budget_period_start(b.period)
                   AS current_start
              INTO v_budget
              FROM ibex_core.org_budgets b WHERE b.org_id = p_org_id;
            IF FOUND AND (CASE WHEN v_budget.period_start = v_budget.current_start
                               THEN v_budget.used ELSE 0 END) >= v_budget.token_limit THEN
                UPDATE ibex_core.extraction_turns e
                   SET waiting_for_budget = true,
                       lease_expires_at = now() + make_interval(secs => 30)
                 WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
                RETURN QUERY SELECT 'over_budget'::text, v_count, NULL::jsonb, NULL::text,
                    NULL::text, NULL::integer, NULL::integer, NULL::integer[], NULL::float8,
                    v_turn.attempts, NULL::text, NULL::jsonb, NULL::jsonb, NULL::uuid,
                    NULL::uuid;
                RETURN;
            END IF;
        END IF;
        v_counted := CASE WHEN p_call_llm THEN 1 ELSE 0 END;
        UPDATE ibex_core.extraction_turns e
           SET claim_token = p_token, waiting_for_budget = false,
               claim_expires_at = now() + make_interval(secs => p_claim_seconds),
               attempts = e.attempts + v_counted, llm_calls = e.llm_calls + v_counted,
               lease_expires_at = GREATEST(COALESCE(e.lease_expires_at, now()),
                                           now() + make_interval(secs => p_lease_seconds))
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
    END IF;
    -- With the claim: the scope's current memories most related to the turn (at most
    -- p_related), for the prompt to list, so the answer can say which one a new memory
    -- replaces. The scope is exactly the session's (agent, user): a memory may only supersede
    -- one of its own scope. Ranked by full-text rank (ts_rank; see the head of 000023) of each
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
                       COALESCE(ts_rank(w.content_tsv, v_query), 0) AS rank
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
