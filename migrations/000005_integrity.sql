-- Integrity and roles: a memory's source session belongs to the memory's org, and each role
-- can do only what its name says.
--
--   ibex_app   tenant data of the one org set for the transaction; with no org set it sees and
--              writes nothing, and may only authenticate a bearer token whose hash it holds.
--   ibex_scan  the identity and progress columns of sessions, across orgs; nothing else.
--   ibex_ops   reads every org (never a token hash) and writes nothing, not even through a
--              function.
-- The owner (the user that runs migrations and the services) does everything else: creating
-- orgs and tokens, the dead-letter mirror, and ibex_memory.create_memory, which switches to
-- the tenant role itself.

-- A memory's source session must exist in the memory's org. MATCH SIMPLE: a memory without a
-- source (session_id NULL) is not checked. Foreign-key checks ignore row-level security, so
-- the tenant role cannot probe other orgs' sessions through it beyond "not in your org".
ALTER TABLE ibex_memory.memories
    ADD CONSTRAINT memories_source_session_fkey
    FOREIGN KEY (session_id, org_id) REFERENCES ibex_core.sessions (id, org_id);

-- Tokens: the tenant role no longer reads or updates the table (every org's hashes were
-- readable, and any token's last_used_at could be stamped). A bearer token is looked up
-- through this function, which returns only the row whose hash the caller already holds and
-- stamps that row's last_used_at at most once a minute (a live token only).
REVOKE ALL ON ibex_memory.api_tokens FROM ibex_app;

CREATE FUNCTION ibex_memory.authenticate_token(p_token_hash text)
RETURNS TABLE (id uuid, org_id uuid, name text, token_hash text, prefix text, scopes text[],
               is_service boolean, created_at timestamptz, last_used_at timestamptz,
               revoked_at timestamptz)
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
           t.created_at, t.last_used_at, t.revoked_at
      FROM ibex_memory.api_tokens t
     WHERE t.token_hash = p_token_hash;
END
$$;

-- The org registry is read by the owner only (slugs are resolved before a tenant transaction
-- starts; foreign-key checks do not need the privilege): a tenant does not list other orgs.
REVOKE ALL ON ibex_core.orgs FROM ibex_app;

-- Functions are executable by their owner only, unless granted below. Trigger functions fire
-- whatever the privilege, so no role needs EXECUTE on them; create_memory is the memory
-- service's own write path (it sets the role and org itself, so any role allowed to call it
-- could write for any org).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ibex_core, ibex_memory FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA ibex_core, ibex_memory REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- The predicate of every policy: evaluated as the querying role.
GRANT EXECUTE ON FUNCTION ibex_core.rls_org_visible(uuid) TO ibex_app, ibex_scan, ibex_ops;
GRANT EXECUTE ON FUNCTION ibex_memory.authenticate_token(text) TO ibex_app;
