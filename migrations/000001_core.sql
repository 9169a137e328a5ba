-- Sessions side: orgs, agents, directives, sessions, checkpoints and the turn-payload archive.
--
-- Roles (cluster-wide, created once):
--   ibex_app   the tenant role. Every tenant-scoped transaction of the worker, the memory
--              service and the CLI runs `SET LOCAL ROLE ibex_app` plus the org setting, so row
--              level security holds even when DATABASE_URL names a superuser.
--   ibex_scan  the one cross-org reader: the extraction scan. It may read identity and
--              progress columns of sessions only (column grants), through its own policy.
-- The user that runs migrations owns every object and must be able to SET ROLE to both.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ibex_app') THEN
        CREATE ROLE ibex_app NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ibex_scan') THEN
        CREATE ROLE ibex_scan NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
END
$$;

DO $$
BEGIN
    -- A superuser may SET ROLE to anything; anyone else needs membership.
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT ibex_app, ibex_scan TO %I', current_user);
    END IF;
END
$$;

CREATE SCHEMA IF NOT EXISTS ibex_core;
GRANT USAGE ON SCHEMA ibex_core TO ibex_app, ibex_scan;

-- The single tenant predicate of every policy: the org set for this transaction with
-- set_config('ibex.org_id', ..., true). With no org set nothing is visible.
CREATE FUNCTION ibex_core.rls_org_visible(p_org_id uuid) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT p_org_id = NULLIF(current_setting('ibex.org_id', true), '')::uuid
$$;

CREATE FUNCTION ibex_core.touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE FUNCTION ibex_core.reject_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%.% is append-only: rows cannot be updated', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TYPE ibex_core.session_status AS ENUM ('active', 'completed', 'abandoned', 'error');

-- The tenant registry. Not tenant data: slugs are resolved before an org is known.
CREATE TABLE ibex_core.orgs (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    slug        text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    name        text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ibex_core.agents (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id      uuid NOT NULL REFERENCES ibex_core.orgs (id),
    slug        text NOT NULL CHECK (slug ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    name        text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org_id, slug),
    UNIQUE (id, org_id)
);

CREATE TABLE ibex_core.directives (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id      uuid NOT NULL REFERENCES ibex_core.orgs (id),
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org_id, name),
    UNIQUE (id, org_id)
);

CREATE TABLE ibex_core.directive_versions (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id        uuid NOT NULL,
    directive_id  uuid NOT NULL,
    version       integer NOT NULL CHECK (version >= 1),
    body          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (directive_id, version),
    UNIQUE (id, org_id),
    FOREIGN KEY (directive_id, org_id) REFERENCES ibex_core.directives (id, org_id)
);

CREATE TABLE ibex_core.sessions (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id                uuid NOT NULL REFERENCES ibex_core.orgs (id),
    agent_id              uuid NOT NULL,
    external_id           text CHECK (length(external_id) BETWEEN 1 AND 255),
    status                ibex_core.session_status NOT NULL DEFAULT 'active',
    model                 text,
    provider              text,
    turn_count            integer NOT NULL DEFAULT 0 CHECK (turn_count >= 0),
    prompt_tokens         bigint NOT NULL DEFAULT 0,
    completion_tokens     bigint NOT NULL DEFAULT 0,
    total_latency_ms      bigint NOT NULL DEFAULT 0,
    last_extracted_turn   integer NOT NULL DEFAULT 0,
    directive_version_id  uuid,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    completed_at          timestamptz,
    deleted_at            timestamptz,
    UNIQUE (id, org_id),
    FOREIGN KEY (agent_id, org_id) REFERENCES ibex_core.agents (id, org_id),
    FOREIGN KEY (directive_version_id, org_id)
        REFERENCES ibex_core.directive_versions (id, org_id) ON DELETE RESTRICT,
    CONSTRAINT sessions_pointer_in_range
        CHECK (last_extracted_turn >= 0 AND last_extracted_turn <= turn_count)
);

CREATE UNIQUE INDEX idx_sessions_external_id
    ON ibex_core.sessions (org_id, agent_id, external_id) WHERE external_id IS NOT NULL;

-- The extraction candidates, and nothing else: small however many sessions are done.
CREATE INDEX idx_sessions_agent_extraction
    ON ibex_core.sessions (agent_id, last_extracted_turn)
    WHERE status = 'completed' AND deleted_at IS NULL AND last_extracted_turn < turn_count;

CREATE INDEX idx_sessions_org_agent ON ibex_core.sessions (org_id, agent_id);

CREATE TRIGGER sessions_touch BEFORE UPDATE ON ibex_core.sessions
    FOR EACH ROW EXECUTE FUNCTION ibex_core.touch_updated_at();

-- The pointer and the turn count only ever grow, whatever the statement says.
CREATE FUNCTION ibex_core.sessions_monotonic() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_extracted_turn < OLD.last_extracted_turn THEN
        RAISE EXCEPTION 'last_extracted_turn cannot move backwards (% -> %)',
            OLD.last_extracted_turn, NEW.last_extracted_turn
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.turn_count < OLD.turn_count THEN
        RAISE EXCEPTION 'turn_count cannot decrease (% -> %)', OLD.turn_count, NEW.turn_count
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sessions_monotonic BEFORE UPDATE ON ibex_core.sessions
    FOR EACH ROW EXECUTE FUNCTION ibex_core.sessions_monotonic();

-- Deleting a directive version detaches the sessions that used it (the FK itself restricts).
CREATE FUNCTION ibex_core.directive_version_detach() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ibex_core.sessions SET directive_version_id = NULL
     WHERE directive_version_id = OLD.id AND org_id = OLD.org_id;
    RETURN OLD;
END
$$;

CREATE TRIGGER directive_versions_detach BEFORE DELETE ON ibex_core.directive_versions
    FOR EACH ROW EXECUTE FUNCTION ibex_core.directive_version_detach();

-- One row per turn (one LLM call of the conversation). Hashes only: content is archived apart.
CREATE TABLE ibex_core.checkpoints (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id             uuid NOT NULL,
    session_id         uuid NOT NULL,
    turn_index         integer NOT NULL CHECK (turn_index >= 1),
    messages_hash      text NOT NULL,
    completion_hash    text NOT NULL,
    prompt_tokens      integer NOT NULL DEFAULT 0,
    completion_tokens  integer NOT NULL DEFAULT 0,
    latency_ms         integer NOT NULL DEFAULT 0,
    is_streaming       boolean NOT NULL DEFAULT false,
    is_complete        boolean NOT NULL DEFAULT true,
    created_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, turn_index),
    FOREIGN KEY (session_id, org_id) REFERENCES ibex_core.sessions (id, org_id)
);

CREATE TRIGGER checkpoints_append_only BEFORE UPDATE ON ibex_core.checkpoints
    FOR EACH ROW EXECUTE FUNCTION ibex_core.reject_update();

-- The turn content: messages and completion exactly as recorded. Append-only as well.
CREATE TABLE ibex_core.checkpoint_payloads (
    checkpoint_id  uuid PRIMARY KEY REFERENCES ibex_core.checkpoints (id),
    org_id         uuid NOT NULL,
    session_id     uuid NOT NULL,
    turn_index     integer NOT NULL,
    messages       jsonb NOT NULL,
    completion     jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, turn_index)
);

CREATE TRIGGER checkpoint_payloads_append_only BEFORE UPDATE ON ibex_core.checkpoint_payloads
    FOR EACH ROW EXECUTE FUNCTION ibex_core.reject_update();

-- Grants. The tenant role never deletes; checkpoints and payloads are SELECT + INSERT only.
GRANT SELECT ON ibex_core.orgs TO ibex_app;
GRANT SELECT, INSERT ON ibex_core.agents TO ibex_app;
GRANT SELECT, INSERT, UPDATE ON ibex_core.directives TO ibex_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ibex_core.directive_versions TO ibex_app;
GRANT SELECT, INSERT, UPDATE ON ibex_core.sessions TO ibex_app;
GRANT SELECT, INSERT ON ibex_core.checkpoints TO ibex_app;
GRANT SELECT, INSERT ON ibex_core.checkpoint_payloads TO ibex_app;
GRANT SELECT (id, org_id, agent_id, status, turn_count, last_extracted_turn, deleted_at)
    ON ibex_core.sessions TO ibex_scan;

-- Row-level security: ENABLE + FORCE on every tenant table, one predicate.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['agents', 'directives', 'directive_versions', 'sessions',
                             'checkpoints', 'checkpoint_payloads']
    LOOP
        EXECUTE format('ALTER TABLE ibex_core.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE ibex_core.%I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON ibex_core.%I
                 USING (ibex_core.rls_org_visible(org_id))
                 WITH CHECK (ibex_core.rls_org_visible(org_id))', t);
    END LOOP;
END
$$;

-- The extraction scan reads identities across orgs, and only through this role.
CREATE POLICY scan_identities ON ibex_core.sessions FOR SELECT TO ibex_scan USING (true);
