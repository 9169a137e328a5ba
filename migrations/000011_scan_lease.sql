-- The scan's record-and-lease for one batch of candidate sessions, all its orgs in one call.
--
-- The scan records every unextracted turn of its candidate sessions and leases, per agent, up
-- to that agent's budget of the turns that are not done, not failed and not leased: the turns
-- it sends. Row-level security admits one org per statement, so the batch costs one statement
-- per org; run from the client, that would be one round trip and one planning per org (about a
-- hundred per scan). Here the loop runs in the server: one round trip for the batch, and the
-- statement's plan is cached by PL/pgSQL across the orgs.
--
-- Each org's statement runs as ibex_app with ibex.org_id set to that org (SET LOCAL ROLE and
-- set_config inside, as create_memory does), so row-level security applies to every row it
-- reads or writes, whoever calls. The arguments come grouped by org: p_orgs[i] owns the
-- sessions p_sessions[p_session_ends[i-1] + 1 : p_session_ends[i]] and the agents (with their
-- budgets) p_agents[p_agent_ends[i-1] + 1 : p_agent_ends[i]], the first slices starting at 1.
-- Agents without a positive budget are left out by the caller.
--
-- New rows are inserted carrying their lease (no UPDATE, no row triggers); rows recorded
-- earlier whose lease is free or expired are taken with SKIP LOCKED, so two scans never lease
-- the same turn, and leased through the same INSERT's ON CONFLICT DO UPDATE, which finds them
-- by the primary key (a row another scan inserted meanwhile is leased only if its lease is
-- free). A lease runs at most p_lease_seconds from now: lowering the setting shortens the
-- leases granted under the old one.
--
-- The statement is planned once for all the orgs of a call, possibly while extraction_turns
-- is still small (the first scan of a large backlog), so its lookups of single turns are
-- written to stay primary-key probes as the table grows during the call: the existence test
-- cannot become a join over the whole table (OFFSET 0), and there is no UPDATE joined to the
-- batch. ANALYZE invalidates the cached plan, so a long-lived connection plans it again.
--
-- Returns the leased turns with their agent, in no particular order; ibex.org_id is cleared
-- before returning.
CREATE FUNCTION ibex_core.scan_record_and_lease(
    p_orgs uuid[], p_session_ends integer[], p_sessions uuid[],
    p_agent_ends integer[], p_agents uuid[], p_budgets integer[], p_lease_seconds integer)
RETURNS TABLE (org_id uuid, agent_id uuid, session_id uuid, turn_index integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    v_session_start integer := 1;
    v_agent_start integer := 1;
    v_ids uuid[];
    v_agents uuid[];
    v_budgets integer[];
    v_lease interval := make_interval(secs => p_lease_seconds);
BEGIN
    SET LOCAL ROLE ibex_app;
    FOR n IN 1 .. coalesce(array_length(p_orgs, 1), 0) LOOP
        PERFORM set_config('ibex.org_id', p_orgs[n]::text, true);
        v_ids := p_sessions[v_session_start : p_session_ends[n]];
        v_agents := p_agents[v_agent_start : p_agent_ends[n]];
        v_budgets := p_budgets[v_agent_start : p_agent_ends[n]];
        v_session_start := p_session_ends[n] + 1;
        v_agent_start := p_agent_ends[n] + 1;
        RETURN QUERY
        WITH budget AS (
            SELECT b.agent_id, b.budget
              FROM unnest(v_agents, v_budgets) AS b(agent_id, budget)
        ),
        sess AS (
            SELECT s.id, s.org_id, s.agent_id, s.last_extracted_turn, s.turn_count,
                   (s.status = 'completed' AND s.deleted_at IS NULL) AS recordable
              FROM ibex_core.sessions s
             WHERE s.id = ANY(v_ids)
        ),
        free AS (
            SELECT e.org_id, e.session_id, e.turn_index, s.agent_id
              FROM ibex_core.extraction_turns e
              JOIN sess s ON s.id = e.session_id
             WHERE e.session_id = ANY(v_ids)
               AND e.state IN ('pending', 'extracted')
               AND e.turn_index > s.last_extracted_turn
               AND e.turn_index <= s.turn_count
               AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= now()
                    OR e.lease_expires_at > now() + v_lease)
               FOR UPDATE OF e SKIP LOCKED
        ),
        missing AS (
            SELECT s.org_id, s.id AS session_id, g AS turn_index, s.agent_id
              FROM sess s
             CROSS JOIN LATERAL generate_series(s.last_extracted_turn + 1, s.turn_count) AS g
             WHERE s.recordable
               -- OFFSET 0 keeps this a probe of the primary key per turn: as an anti join
               -- the plan (cached across the orgs, made while the table may be small) reads
               -- the whole table once per org.
               AND NOT EXISTS (SELECT 1 FROM ibex_core.extraction_turns x
                                WHERE x.session_id = s.id AND x.turn_index = g OFFSET 0)
        ),
        ranked AS (
            SELECT c.org_id, c.agent_id, c.session_id, c.turn_index, c.is_new,
                   row_number() OVER (PARTITION BY c.agent_id ORDER BY c.turn_index, c.session_id)
                       <= b.budget AS lease
              FROM (SELECT org_id, session_id, turn_index, agent_id, false AS is_new FROM free
                    UNION ALL
                    SELECT org_id, session_id, turn_index, agent_id, true FROM missing) c
              JOIN budget b ON b.agent_id = c.agent_id
        ),
        written AS (
            INSERT INTO ibex_core.extraction_turns AS t
                (org_id, session_id, turn_index, lease_expires_at)
            SELECT r.org_id, r.session_id, r.turn_index,
                   CASE WHEN r.lease THEN now() + v_lease END
              FROM ranked r
             WHERE r.is_new OR r.lease
            ON CONFLICT (session_id, turn_index) DO UPDATE
               SET lease_expires_at = excluded.lease_expires_at
             WHERE excluded.lease_expires_at IS NOT NULL
               AND t.state IN ('pending', 'extracted')
               AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now()
                    OR t.lease_expires_at > now() + v_lease)
            RETURNING t.session_id, t.turn_index, t.lease_expires_at IS NOT NULL AS leased
        ),
        leased AS (
            SELECT w.session_id, w.turn_index FROM written w WHERE w.leased
        )
        SELECT p_orgs[n], s.agent_id, l.session_id, l.turn_index
          FROM leased l
          JOIN sess s ON s.id = l.session_id;
    END LOOP;
    PERFORM set_config('ibex.org_id', '', true);
END
$$;

-- Like create_memory, it is called by the application's login role (a member of ibex_app),
-- which the function switches from; no role is granted EXECUTE.
REVOKE ALL ON FUNCTION ibex_core.scan_record_and_lease(
    uuid[], integer[], uuid[], integer[], uuid[], integer[], integer) FROM PUBLIC;
