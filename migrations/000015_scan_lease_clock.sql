-- Two scans at once could both lease a turn that one of them had just recorded.
--
-- Scan A inserts a new turn with its lease; scan B, whose snapshot did not see that row,
-- tries to insert it too, waits for A to commit, and then re-checks A's row in its ON CONFLICT
-- DO UPDATE. A's lease is A's now() + the lease; when B's transaction started before A's,
-- that is more than B's now() + the lease, which the function took for a lease granted under
-- a higher setting (the case that lets lowering the setting shorten old leases) and leased the
-- turn again: both scans sent it. The check now compares with the clock at the re-check,
-- which is never earlier than A's start. Only that comparison changes.
CREATE OR REPLACE FUNCTION ibex_core.scan_record_and_lease(
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
               -- A row another scan inserted meanwhile is re-read here once that scan has
               -- committed, and its lease was granted from that scan's start, which can be
               -- later than this one's now(): the "longer than the setting" test reads the
               -- clock, or it would take that fresh lease as one from a higher setting.
               AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now()
                    OR t.lease_expires_at > clock_timestamp() + v_lease)
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

