-- The pipeline's hot transitions of the per-turn state, each one round trip: called as a single
-- SELECT in its own implicit transaction (no BEGIN, no SET, no COMMIT), like
-- ibex_memory.create_memory. extraction.turns.TurnStore is the one caller; it keeps the names,
-- the decisions and the lock order it documents:
--
--   begin_extract   lock (or create) the turn row, decide, and with the LLM claim return the
--                   turns to extract
--   persist_result  store the first validated result; return the stored one
--   load_slot       the stored result, the session's agent and whether a slot is recorded
--   record_slot     record a slot and count under the turn row's lock
--   complete_turn   session row lock, then turn row lock: mark done, walk, move the pointer
--   turn_status     the turn's state as `ibex extract` reports it after each turn
--
-- SECURITY INVOKER: each switches its transaction to the tenant role and org first (exactly
-- what core.db.tenant() does), so every row it reads or writes is under row-level security,
-- and both settings end with the transaction. Executable by the owner only, as create_memory:
-- a role allowed to call them could act for any org.
--
-- Each is safe to run again after a lost answer (the caller sends it again when its pooled
-- connection turns out dead, and the answer of a committed call may be what was lost): every
-- decision is taken from the rows it locks, and begin_extract knows its own claim by the token
-- the caller made.

-- A test seam, a no-op: called at each point that sits between a locking read and the write it
-- decides (begin_extract.locked, record_slot.counted, complete_turn.walked), inside the
-- transaction and as the tenant role. A race test replaces it in its own database with one
-- that holds one transaction there, to show that a second one waits on the lock.
CREATE FUNCTION ibex_core.stage_pause(p_point text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    NULL;
END
$$;

CREATE FUNCTION ibex_core.begin_extract(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_claim_seconds integer,
    p_lease_seconds integer, p_max_attempts integer, p_first_turn integer, p_takeover uuid,
    p_call_llm boolean, p_token uuid)
RETURNS TABLE (outcome text, turn_count integer, result jsonb, provider text, model text,
               prompt_tokens integer, completion_tokens integer, written integer[],
               retry_after double precision, attempts integer, last_error text, turns jsonb)
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
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    -- Usually the scan recorded the row: lock it and read its session in one statement.
    SELECT s.last_extracted_turn AS pointer, s.turn_count AS n, e AS turn INTO v_joined
      FROM ibex_core.extraction_turns e
      JOIN ibex_core.sessions s ON s.id = e.session_id
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       FOR UPDATE OF e;
    IF FOUND THEN
        v_pointer := v_joined.pointer;
        v_count := v_joined.n;
        v_turn := v_joined.turn;
    ELSE
        SELECT s.last_extracted_turn, s.turn_count INTO v_pointer, v_count
          FROM ibex_core.sessions s WHERE s.id = p_session_id;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'no_session'::text, NULL::integer, NULL::jsonb, NULL::text,
                NULL::text, NULL::integer, NULL::integer, NULL::integer[], NULL::float8,
                NULL::integer, NULL::text, NULL::jsonb;
            RETURN;
        END IF;
        v_turn := NULL;
    END IF;
    IF p_turn_index > v_count THEN
        RETURN QUERY SELECT 'no_turn'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
            NULL::integer, NULL::integer, NULL::integer[], NULL::float8, NULL::integer,
            NULL::text, NULL::jsonb;
        RETURN;
    END IF;
    IF v_turn.session_id IS NULL THEN
        IF p_turn_index <= v_pointer THEN
            -- Below the pointer every turn is done, even one recorded before this table.
            RETURN QUERY SELECT 'done'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
                NULL::integer, NULL::integer, NULL::integer[], NULL::float8, NULL::integer,
                NULL::text, NULL::jsonb;
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
            NULL::text, NULL::jsonb;
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
            NULL::float8, v_turn.attempts, NULL::text, NULL::jsonb;
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
                NULL::text, NULL::jsonb;
            RETURN;
        END IF;
        IF p_call_llm AND v_turn.attempts >= p_max_attempts THEN
            RETURN QUERY SELECT 'gave_up'::text, v_count, NULL::jsonb, NULL::text, NULL::text,
                NULL::integer, NULL::integer, NULL::integer[], NULL::float8, v_turn.attempts,
                v_turn.last_error, NULL::jsonb;
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
    -- With the claim: the turn and the turns before it that give its context, with content.
    RETURN QUERY
    SELECT 'claimed'::text, v_count, NULL::jsonb, NULL::text, NULL::text, NULL::integer,
           NULL::integer, NULL::integer[], NULL::float8, v_turn.attempts + v_counted,
           NULL::text,
           COALESCE(jsonb_agg(jsonb_build_object(
                        'turn_index', c.turn_index, 'prompt_tokens', c.prompt_tokens,
                        'completion_tokens', c.completion_tokens, 'latency_ms', c.latency_ms,
                        'messages', p.messages, 'completion', p.completion)
                    ORDER BY c.turn_index), '[]'::jsonb)
      FROM ibex_core.checkpoints c
      JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id
     WHERE c.session_id = p_session_id
       AND c.turn_index BETWEEN GREATEST(p_first_turn, 1) AND p_turn_index;
END
$$;

CREATE FUNCTION ibex_core.persist_result(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_token uuid, p_result jsonb,
    p_memory_count integer, p_prompt_tokens integer, p_completion_tokens integer,
    p_provider text, p_model text, p_lease_seconds integer)
RETURNS TABLE (mine boolean, result jsonb, provider text, model text, prompt_tokens integer,
               completion_tokens integer, written integer[], agent_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    -- Store ours (and end our claim) unless a result is stored; RETURNING gives back exactly
    -- what was stored, the slots already written and the session's agent.
    RETURN QUERY
    WITH stored AS (
        UPDATE ibex_core.extraction_turns e
           SET result = p_result, memory_count = p_memory_count,
               prompt_tokens = p_prompt_tokens, completion_tokens = p_completion_tokens,
               provider = p_provider, model = p_model,
               state = 'extracted', extracted_at = now(), last_error = NULL,
               claim_token = NULL, claim_expires_at = NULL,
               lease_expires_at = GREATEST(COALESCE(e.lease_expires_at, now()),
                                           now() + make_interval(secs => p_lease_seconds))
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index AND e.result IS NULL
        RETURNING true, e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,
            ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                   WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),
            (SELECT s.agent_id FROM ibex_core.sessions s WHERE s.id = e.session_id)
    )
    SELECT * FROM stored;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Another delivery persisted first: its result wins; our claim (if still ours) is over.
    UPDATE ibex_core.extraction_turns e SET claim_token = NULL, claim_expires_at = NULL
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.claim_token = p_token;
    RETURN QUERY
    SELECT false, e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,
           ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                  WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),
           NULL::uuid
      FROM ibex_core.extraction_turns e
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.result IS NOT NULL
       FOR UPDATE OF e;
END
$$;

CREATE FUNCTION ibex_core.load_slot(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_ordinal integer)
RETURNS TABLE (state text, agent_id uuid, result jsonb, provider text, model text,
               prompt_tokens integer, completion_tokens integer, recorded boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    RETURN QUERY
    SELECT e.state::text, s.agent_id, e.result, e.provider, e.model, e.prompt_tokens,
           e.completion_tokens,
           EXISTS (SELECT 1 FROM ibex_core.extraction_slots x
                    WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index
                      AND x.ordinal = p_ordinal)
      FROM ibex_core.extraction_turns e
      JOIN ibex_core.sessions s ON s.id = e.session_id
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
END
$$;

-- NULL when the turn has no stored result; else whether the caller must send advance_pointer
-- (every slot recorded and the turn not yet done).
CREATE FUNCTION ibex_core.record_slot(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_ordinal integer,
    p_idempotency_key uuid, p_memory_id uuid, p_outcome text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
    v_memory_count integer;
    v_state ibex_core.turn_state;
    v_written bigint;
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    SELECT e.memory_count, e.state INTO v_memory_count, v_state
      FROM ibex_core.extraction_turns e
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       FOR UPDATE;
    IF v_memory_count IS NULL THEN
        RETURN NULL;
    END IF;
    -- Insert and count in one statement: its snapshot (taken after the row lock above was
    -- granted) sees every slot committed before, plus ours if inserted.
    WITH ins AS (
        INSERT INTO ibex_core.extraction_slots
            (org_id, session_id, turn_index, ordinal, idempotency_key, memory_id, outcome)
        VALUES (p_org_id, p_session_id, p_turn_index, p_ordinal, p_idempotency_key,
                p_memory_id, p_outcome)
        ON CONFLICT DO NOTHING RETURNING 1
    )
    SELECT (SELECT count(*) FROM ibex_core.extraction_slots x
             WHERE x.session_id = p_session_id AND x.turn_index = p_turn_index)
         + (SELECT count(*) FROM ins)
      INTO v_written;
    PERFORM ibex_core.stage_pause('record_slot.counted');
    RETURN v_written >= v_memory_count AND v_state <> 'done';
END
$$;

-- No row when the session does not exist. Otherwise: whether every slot is recorded, whether
-- this call marked the turn done, and the pointer before and after.
CREATE FUNCTION ibex_core.complete_turn(p_org_id uuid, p_session_id uuid, p_turn_index integer)
RETURNS TABLE (complete boolean, newly_done boolean, pointer_before integer,
               pointer_after integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    v_pointer integer;
    v_count integer;
    v_state ibex_core.turn_state;
    v_memory_count integer;
    v_written bigint;
    v_newly_done boolean := false;
    v_walked integer;
    v_after integer;
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    -- Lock order: the session row, then the turn row.
    SELECT s.last_extracted_turn, s.turn_count INTO v_pointer, v_count
      FROM ibex_core.sessions s WHERE s.id = p_session_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT e.state, e.memory_count INTO v_state, v_memory_count
      FROM ibex_core.extraction_turns e
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       FOR UPDATE;
    IF v_memory_count IS NULL THEN
        -- Nothing stored for this turn (yet): the write that completes it sends its own
        -- advance_pointer.
        RETURN QUERY SELECT false, false, v_pointer, v_pointer;
        RETURN;
    END IF;
    IF v_state <> 'done' THEN
        SELECT count(*) INTO v_written FROM ibex_core.extraction_slots x
         WHERE x.session_id = p_session_id AND x.turn_index = p_turn_index;
        IF v_written < v_memory_count THEN
            RETURN QUERY SELECT false, false, v_pointer, v_pointer;
            RETURN;
        END IF;
        UPDATE ibex_core.extraction_turns e
           SET state = 'done', done_at = now(), lease_expires_at = NULL,
               claim_token = NULL, claim_expires_at = NULL, last_error = NULL
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
        v_newly_done := true;
    END IF;
    -- The highest t such that every turn pointer+1..t is done (a missing row is not done).
    SELECT COALESCE(MIN(g), v_count + 1) - 1 INTO v_walked
      FROM generate_series(v_pointer + 1, v_count) AS g
      LEFT JOIN ibex_core.extraction_turns e
        ON e.session_id = p_session_id AND e.turn_index = g
     WHERE e.state IS DISTINCT FROM 'done';
    PERFORM ibex_core.stage_pause('complete_turn.walked');
    v_after := v_pointer;
    IF v_walked > v_pointer THEN
        UPDATE ibex_core.sessions s
           SET last_extracted_turn = GREATEST(s.last_extracted_turn, LEAST(v_walked, s.turn_count))
         WHERE s.id = p_session_id
        RETURNING s.last_extracted_turn INTO v_after;
    END IF;
    RETURN QUERY SELECT true, v_newly_done, v_pointer, v_after;
END
$$;

-- What `ibex extract` reads after each turn: the turn's state, counters and slots recorded.
CREATE FUNCTION ibex_core.turn_status(p_org_id uuid, p_session_id uuid, p_turn_index integer)
RETURNS TABLE (state text, attempts integer, llm_calls integer, memory_count integer,
               last_error text, leased boolean, claimed boolean, slots bigint)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    RETURN QUERY
    SELECT e.state::text, e.attempts, e.llm_calls, e.memory_count, e.last_error,
           COALESCE(e.lease_expires_at > now(), false),
           COALESCE(e.claim_expires_at > now(), false),
           (SELECT count(*) FROM ibex_core.extraction_slots x
             WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index)
      FROM ibex_core.extraction_turns e
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
END
$$;

-- The seam runs as the tenant role (the stage functions call it after switching); the stage
-- functions themselves stay the owner's (005 revoked EXECUTE from PUBLIC by default).
REVOKE ALL ON FUNCTION ibex_core.stage_pause(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ibex_core.stage_pause(text) TO ibex_app;
REVOKE ALL ON FUNCTION
    ibex_core.begin_extract(uuid, uuid, integer, integer, integer, integer, integer, uuid,
                            boolean, uuid),
    ibex_core.persist_result(uuid, uuid, integer, uuid, jsonb, integer, integer, integer, text,
                             text, integer),
    ibex_core.load_slot(uuid, uuid, integer, integer),
    ibex_core.record_slot(uuid, uuid, integer, integer, uuid, uuid, text),
    ibex_core.complete_turn(uuid, uuid, integer),
    ibex_core.turn_status(uuid, uuid, integer)
FROM PUBLIC;
