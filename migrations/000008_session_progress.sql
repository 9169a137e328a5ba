-- A session's extraction progress, as the sessions API reports it (GET /v1/sessions): how many
-- of its turns are done and how many failed. The per-turn state belongs to the pipeline, which
-- alone writes it; the sessions API may not import the pipeline's code, and must not copy its
-- query either. So the one read of extraction_turns from outside the pipeline is defined here,
-- next to the table and the CHECK on its states, and the API calls it.
--
-- SECURITY INVOKER (the default): it runs under the caller's row-level security, so a tenant
-- transaction counts only its own org's turns, and a session of another org counts nothing.
CREATE FUNCTION ibex_core.session_progress(p_session_ids uuid[])
RETURNS TABLE (session_id uuid, done bigint, failed bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, public
AS $$
    SELECT t.session_id,
           count(*) FILTER (WHERE t.state = 'done'),
           count(*) FILTER (WHERE t.state = 'failed')
      FROM ibex_core.extraction_turns t
     WHERE t.session_id = ANY(p_session_ids)
     GROUP BY t.session_id
$$;

REVOKE ALL ON FUNCTION ibex_core.session_progress(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ibex_core.session_progress(uuid[]) TO ibex_app;
