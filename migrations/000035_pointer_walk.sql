-- The pointer's walk stops at the first turn that is not done.
--
-- complete_turn found the highest t such that every turn pointer+1..t is done as the least
-- turn of pointer+1..turn_count that is missing or not done: a join of every turn index from
-- the pointer to the session's end, evaluated whole under the session row's lock, on every
-- move of the pointer. A session of n turns sent at once paid about n^2/2 lookups over its
-- turns (a 700-turn conversation, some 245,000). The walk now reads the session's turn rows
-- after the pointer in key order and stops at the first one that is not done or is not the
-- next index (the turn before it is missing): a move reads the turns it passes, plus one.
--
--   ibex_core.complete_turn   000010's, the walk as above; the same answers (a missing turn
--                             still stops the pointer), locks and test seam

SET LOCAL search_path = pg_catalog;

CREATE OR REPLACE FUNCTION ibex_core.complete_turn(
    p_org_id uuid, p_session_id uuid, p_turn_index integer)
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
    v_turn integer;
    v_turn_state ibex_core.turn_state;
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
    -- The highest t such that every turn pointer+1..t is done (a missing row is not done):
    -- the session's rows after the pointer in key order, up to the first that is not done
    -- or not the next index.
    v_walked := v_pointer;
    FOR v_turn, v_turn_state IN
        SELECT e.turn_index, e.state FROM ibex_core.extraction_turns e
         WHERE e.session_id = p_session_id AND e.turn_index > v_pointer
           AND e.turn_index <= v_count
         ORDER BY e.turn_index
    LOOP
        EXIT WHEN v_turn <> v_walked + 1 OR v_turn_state <> 'done';
        v_walked := v_turn;
    END LOOP;
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
