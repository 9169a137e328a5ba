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

-- persist_result (000014) with three trailing parameters: the LLM call's latency, the
-- embedding request's tokens and the embedding model. The result and the ledger row are written by one statement: both
-- or neither, and only by the call that stores the result (first wins), so the usage of a turn
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
    )
    SELECT true, st.res, st.prov, st.mdl, st.pt, st.ct, st.wr, st.agent, st.usr FROM stored st;
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

-- A turn's extraction state (DESIGN's names), from its per-turn row (NULL: none recorded) and
-- its session's pointer:
--   pending         not yet recorded by the scan, or recorded and waiting for its delivery
--   extracting      under a live LLM claim, or its result persisted and its memories being
--                   written
--   extracted       done with memories (or passed by the pointer after its row was pruned)
--   empty           done, nothing extracted
--   failed          its last attempt failed and it will be retried (the reason class below)
--   dead_lettered   its message is in the dead-letter queue (`ibex dlq replay` sends it again)
-- waiting_for_budget is a state of the contract that no turn takes until budgets exist.
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
    ibex_core.turn_state_counts(uuid[])
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    ibex_core.turn_state(ibex_core.extraction_turns, integer, integer),
    ibex_core.turn_failure_class(text),
    ibex_core.session_turns(uuid, integer, integer),
    ibex_core.turn_state_counts(uuid[])
TO ibex_app;
