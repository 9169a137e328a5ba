-- What each turn cost, and where each turn stands.
--
--   ibex_core.turn_usage          one row per extracted turn: the LLM call's usage (input and
--                                 output tokens, model, provider, latency), the embedding
--                                 request's tokens and the LLM calls counted for the turn;
--                                 written by persist_result in the statement that stores the
--                                 result, insert-once on the turn, so a retry, a redelivery or
--                                 a dead-letter replay never counts a turn twice
--   ibex_core.persist_result      takes the latency and the embedding tokens and writes the
--                                 ledger row with the result
--   ibex_core.turn_state          a turn's extraction state, computed from the pipeline's rows
--   ibex_core.session_turns       a session's turns with content, state and usage (the turns
--                                 read-back route), under the caller's row-level security
--   ibex_core.turn_state_counts   the org's turns counted by state
--   ibex_core.org_budgets         a token limit per org and period; begin_extract refuses the
--                                 LLM claim over it (the turn waits: waiting_for_budget) and
--                                 persist_result counts each stored result's tokens into it
--   api_tokens scopes             usage:read (GET /v1/usage, GET /v1/budget)
--
-- The ledger is kept when the per-turn state is pruned (`ibex prune`): it is what a day or an
-- org cost, and holds no conversation text. It has no foreign key to the session, so erasing
-- a session leaves what it cost.

CREATE TABLE ibex_core.turn_usage (
    org_id            uuid NOT NULL REFERENCES ibex_core.orgs (id),
    agent_id          uuid NOT NULL,
    session_id        uuid NOT NULL,
    turn_index        integer NOT NULL CHECK (turn_index >= 1),
    provider          text,
    model             text,
    llm_calls         integer NOT NULL DEFAULT 0 CHECK (llm_calls >= 0),
    input_tokens      integer NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens     integer NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    embedding_tokens  integer NOT NULL DEFAULT 0 CHECK (embedding_tokens >= 0),
    embedding_model   text,
    latency_ms        integer NOT NULL DEFAULT 0 CHECK (latency_ms >= 0),
    reused            boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, turn_index)
);

CREATE INDEX idx_turn_usage_org_time ON ibex_core.turn_usage (org_id, created_at);

GRANT SELECT, INSERT ON ibex_core.turn_usage TO ibex_app;
GRANT SELECT ON ibex_core.turn_usage TO ibex_ops;
ALTER TABLE ibex_core.turn_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE ibex_core.turn_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_core.turn_usage
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));
CREATE POLICY operator_read ON ibex_core.turn_usage FOR SELECT TO ibex_ops USING (true);

-- Budgets: a token limit per org and period (a calendar month or day, UTC). `used` is the LLM
-- tokens (input + output) of the turns whose results were stored in `period_start`'s period,
-- added by persist_result with each result (the same statement: counted once); a row whose
-- period_start is not the current period's counts 0 (the period turned). Written by the owner
-- (`ibex budget`), read by the tenant role.
CREATE TABLE ibex_core.org_budgets (
    org_id        uuid PRIMARY KEY REFERENCES ibex_core.orgs (id),
    token_limit   bigint NOT NULL CHECK (token_limit >= 0),
    period        text NOT NULL CHECK (period IN ('month', 'day')),
    period_start  timestamptz NOT NULL,
    used          bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    -- The last threshold (80, 100) reported in period_start's period.
    reported      integer NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, UPDATE (used, period_start, reported) ON ibex_core.org_budgets TO ibex_app;
GRANT SELECT ON ibex_core.org_budgets TO ibex_ops;
-- Enabled, not forced: the owner (`ibex budget`) writes any org's row, the tenant role sees
-- and counts its own org's only.
ALTER TABLE ibex_core.org_budgets ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_core.org_budgets
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));
CREATE POLICY operator_read ON ibex_core.org_budgets FOR SELECT TO ibex_ops USING (true);

-- A turn the budget holds back: no LLM call until the budget allows one.
ALTER TABLE ibex_core.extraction_turns
    ADD COLUMN waiting_for_budget boolean NOT NULL DEFAULT false;

-- The start of the current period (UTC).
CREATE FUNCTION ibex_core.budget_period_start(p_period text)
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, public
AS $$
    SELECT date_trunc(p_period, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
$$;

-- begin_extract (000014) with the budget check before the claim: same parameters, same
-- columns; one more outcome, over_budget.
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

-- persist_result (000014) with three trailing parameters: the LLM call's latency, the
-- embedding request's tokens and the embedding model, and one more column: the budget
-- threshold (80, 100) this result made the org cross, if any. The result and the ledger row
-- are written by one statement: both or neither, and only by the call that stores the result (first wins), so the usage of a turn
-- is counted exactly once whatever the retries. A reused result (p_reused) records the LLM
-- calls left after uncounting the claim's (0 unless an earlier attempt called and failed).
DROP FUNCTION ibex_core.persist_result(
    uuid, uuid, integer, uuid, jsonb, integer, integer, integer, text, text, integer, text,
    boolean);

CREATE FUNCTION ibex_core.persist_result(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_token uuid, p_result jsonb,
    p_memory_count integer, p_prompt_tokens integer, p_completion_tokens integer,
    p_provider text, p_model text, p_lease_seconds integer, p_input_hash text DEFAULT NULL,
    p_reused boolean DEFAULT false, p_latency_ms integer DEFAULT 0,
    p_embedding_tokens integer DEFAULT 0, p_embedding_model text DEFAULT NULL)
RETURNS TABLE (mine boolean, result jsonb, provider text, model text, prompt_tokens integer,
               completion_tokens integer, written integer[], agent_id uuid, user_id uuid,
               budget_crossed integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    v_row record;
    v_tokens bigint;
    v_budget record;
    v_crossed integer;
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
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
               claim_token = NULL, claim_expires_at = NULL, waiting_for_budget = false,
               lease_expires_at = GREATEST(COALESCE(e.lease_expires_at, now()),
                                           now() + make_interval(secs => p_lease_seconds))
          FROM ibex_core.sessions s
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index AND e.result IS NULL
           AND s.id = e.session_id
        RETURNING e.org_id AS org, e.session_id AS sid, e.turn_index AS idx,
            e.llm_calls AS calls, e.result AS res, e.provider AS prov, e.model AS mdl,
            e.prompt_tokens AS pt, e.completion_tokens AS ct,
            ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                   WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index) AS wr,
            s.agent_id AS agent, s.user_id AS usr
    ), ledger AS (
        INSERT INTO ibex_core.turn_usage
            (org_id, agent_id, session_id, turn_index, provider, model, llm_calls,
             input_tokens, output_tokens, embedding_tokens, embedding_model, latency_ms,
             reused)
        SELECT st.org, st.agent, st.sid, st.idx, st.prov, st.mdl, st.calls,
               GREATEST(st.pt, 0), GREATEST(st.ct, 0), GREATEST(p_embedding_tokens, 0),
               p_embedding_model, GREATEST(p_latency_ms, 0), p_reused
          FROM stored st
        ON CONFLICT (session_id, turn_index) DO NOTHING
        RETURNING input_tokens::bigint + output_tokens AS tokens
    )
    SELECT st.*, (SELECT l.tokens FROM ledger l) AS tokens INTO v_row FROM stored st;
    IF v_row.res IS NOT NULL THEN
        -- The org's budget (if it has one) counts the tokens of the result just stored, in
        -- the same transaction; a period that turned starts again from these.
        v_tokens := COALESCE(v_row.tokens, 0);
        IF v_tokens > 0 THEN
            UPDATE ibex_core.org_budgets b
               SET used = CASE WHEN b.period_start = ibex_core.budget_period_start(b.period)
                               THEN b.used ELSE 0 END + v_tokens,
                   reported = CASE WHEN b.period_start = ibex_core.budget_period_start(b.period)
                                   THEN b.reported ELSE 0 END,
                   period_start = ibex_core.budget_period_start(b.period)
             WHERE b.org_id = p_org_id
            RETURNING b.used, b.token_limit, b.reported INTO v_budget;
            IF FOUND THEN
                v_crossed := CASE
                    WHEN v_budget.used >= v_budget.token_limit AND v_budget.reported < 100
                        THEN 100
                    WHEN v_budget.used * 5 >= v_budget.token_limit * 4
                         AND v_budget.reported < 80 THEN 80
                END;
                IF v_crossed IS NOT NULL THEN
                    UPDATE ibex_core.org_budgets b SET reported = v_crossed
                     WHERE b.org_id = p_org_id;
                END IF;
            END IF;
        END IF;
        RETURN QUERY SELECT true, v_row.res, v_row.prov, v_row.mdl, v_row.pt, v_row.ct,
            v_row.wr, v_row.agent, v_row.usr, v_crossed;
        RETURN;
    END IF;
    UPDATE ibex_core.extraction_turns e SET claim_token = NULL, claim_expires_at = NULL
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.claim_token = p_token;
    RETURN QUERY
    SELECT false, e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,
           ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                  WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),
           NULL::uuid, NULL::uuid, NULL::integer
      FROM ibex_core.extraction_turns e
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.result IS NOT NULL
       FOR UPDATE OF e;
END
$$;

-- A turn's extraction state (DESIGN's names), from its per-turn row (NULL: none recorded) and
-- its session's pointer:
--   pending         not yet recorded by the scan, or recorded and waiting for its delivery
--   extracting      under a live LLM claim, or its result persisted and its memories being
--                   written
--   extracted       done with memories (or passed by the pointer after its row was pruned)
--   empty           done, nothing extracted
--   failed          its last attempt failed and it will be retried (the reason class below)
--   dead_lettered   its message is in the dead-letter queue (`ibex dlq replay` sends it again)
--   waiting_for_budget  its org's token budget is spent: no LLM call until it allows one
CREATE FUNCTION ibex_core.turn_state(e ibex_core.extraction_turns, p_turn_index integer,
                                     p_pointer integer)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, public
AS $$
    SELECT CASE
        WHEN e.session_id IS NULL THEN
            CASE WHEN p_turn_index <= p_pointer THEN 'extracted' ELSE 'pending' END
        WHEN e.state = 'failed' THEN 'dead_lettered'
        WHEN e.state = 'done' THEN
            CASE WHEN e.memory_count = 0 THEN 'empty' ELSE 'extracted' END
        WHEN e.state = 'extracted' THEN 'extracting'
        WHEN e.claim_expires_at > now() THEN 'extracting'
        WHEN e.waiting_for_budget THEN 'waiting_for_budget'
        WHEN e.last_error IS NOT NULL THEN 'failed'
        ELSE 'pending'
    END
$$;

-- The reason class of a failed or dead-lettered turn: the exception's class name that starts
-- its last error, never its message (which may quote an answer).
CREATE FUNCTION ibex_core.turn_failure_class(p_last_error text)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, public
AS $$
    SELECT substring(p_last_error FROM '^([A-Za-z_][A-Za-z0-9_.]*)')
$$;

-- A session's turns after p_after, at most p_limit, in order: content as recorded, the state,
-- the failure's class, the extraction's counts and the turn's usage (NULL columns: not yet
-- known). SECURITY INVOKER: under the caller's row-level security, so another org's session
-- has no turns.
CREATE FUNCTION ibex_core.session_turns(p_session_id uuid, p_after integer, p_limit integer)
RETURNS TABLE (turn_index integer, messages jsonb, completion jsonb, state text, reason text,
               memories integer, superseding integer, reused boolean, llm_calls integer,
               input_tokens integer, output_tokens integer, embedding_tokens integer,
               latency_ms integer, provider text, model text, embedding_model text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, public
AS $$
    SELECT c.turn_index, p.messages, p.completion, st.state,
           CASE WHEN st.state IN ('failed', 'dead_lettered')
                THEN ibex_core.turn_failure_class(e.last_error) END,
           e.memory_count,
           CASE WHEN e.result IS NOT NULL THEN
               (SELECT count(*)::integer FROM jsonb_array_elements(e.result -> 'memories') m
                 WHERE jsonb_array_length(COALESCE(m -> 'supersedes', '[]'::jsonb)) > 0) END,
           CASE WHEN e.result IS NOT NULL THEN e.reused END,
           u.llm_calls, u.input_tokens, u.output_tokens, u.embedding_tokens, u.latency_ms,
           u.provider, u.model, u.embedding_model
      FROM ibex_core.sessions s
      JOIN ibex_core.checkpoints c ON c.session_id = s.id
      JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id
      LEFT JOIN ibex_core.extraction_turns e
        ON e.session_id = c.session_id AND e.turn_index = c.turn_index
      LEFT JOIN ibex_core.turn_usage u
        ON u.session_id = c.session_id AND u.turn_index = c.turn_index
      CROSS JOIN LATERAL
           (SELECT ibex_core.turn_state(e, c.turn_index, s.last_extracted_turn) AS state) st
     WHERE s.id = p_session_id AND s.deleted_at IS NULL AND c.turn_index > p_after
     ORDER BY c.turn_index
     LIMIT p_limit
$$;

-- The turns of the org's live sessions (or of the given ones) counted by state, under the
-- caller's row-level security.
CREATE FUNCTION ibex_core.turn_state_counts(p_session_ids uuid[] DEFAULT NULL)
RETURNS TABLE (session_id uuid, state text, turns bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, public
AS $$
    SELECT c.session_id, ibex_core.turn_state(e, c.turn_index, s.last_extracted_turn),
           count(*)
      FROM ibex_core.sessions s
      JOIN ibex_core.checkpoints c ON c.session_id = s.id
      LEFT JOIN ibex_core.extraction_turns e
        ON e.session_id = c.session_id AND e.turn_index = c.turn_index
     WHERE s.deleted_at IS NULL
       AND (p_session_ids IS NULL OR s.id = ANY(p_session_ids))
     GROUP BY 1, 2
$$;

REVOKE ALL ON FUNCTION
    ibex_core.persist_result(uuid, uuid, integer, uuid, jsonb, integer, integer, integer, text,
                             text, integer, text, boolean, integer, integer, text),
    ibex_core.turn_state(ibex_core.extraction_turns, integer, integer),
    ibex_core.turn_failure_class(text),
    ibex_core.session_turns(uuid, integer, integer),
    ibex_core.turn_state_counts(uuid[]),
    ibex_core.budget_period_start(text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    ibex_core.turn_state(ibex_core.extraction_turns, integer, integer),
    ibex_core.turn_failure_class(text),
    ibex_core.session_turns(uuid, integer, integer),
    ibex_core.turn_state_counts(uuid[]),
    ibex_core.budget_period_start(text)
TO ibex_app;

-- Tokens may carry usage:read (GET /v1/usage: the org's usage, org-wide).
ALTER TABLE ibex_memory.api_tokens DROP CONSTRAINT api_tokens_scopes;
ALTER TABLE ibex_memory.api_tokens ADD CONSTRAINT api_tokens_scopes
    CHECK (cardinality(scopes) >= 1
           AND scopes <@ ARRAY['memory:read', 'memory:write', 'sessions:read', 'sessions:write',
                               'memory:admin', 'users:delete', 'usage:read']);
