-- ibex_ops: the operators' read-only view across orgs (`ibex status`, `ibex dlq`).
--
-- Tenant tables FORCE row-level security, so even their owner sees nothing without an org
-- unless it is a superuser. Operator commands therefore read as this role, which may SELECT
-- every table and has a SELECT-only policy that shows every org. It cannot write tenant data.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ibex_ops') THEN
        CREATE ROLE ibex_ops NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT ibex_ops TO %I', current_user);
    END IF;
END
$$;

GRANT USAGE ON SCHEMA ibex_core, ibex_memory TO ibex_ops;
GRANT SELECT ON ALL TABLES IN SCHEMA ibex_core TO ibex_ops;
GRANT SELECT ON ibex_memory.memories TO ibex_ops;
GRANT SELECT (id, org_id, name, prefix, scopes, is_service, created_at, last_used_at, revoked_at)
    ON ibex_memory.api_tokens TO ibex_ops;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['ibex_core.agents', 'ibex_core.directives',
                             'ibex_core.directive_versions', 'ibex_core.sessions',
                             'ibex_core.checkpoints', 'ibex_core.checkpoint_payloads',
                             'ibex_core.extraction_turns', 'ibex_core.extraction_slots',
                             'ibex_memory.memories']
    LOOP
        EXECUTE format('CREATE POLICY operator_read ON %s FOR SELECT TO ibex_ops USING (true)', t);
    END LOOP;
END
$$;
