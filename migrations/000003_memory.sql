-- Memory service side: memories and API tokens.
--
-- The database, not a check-then-insert, makes a duplicate impossible:
--   UNIQUE (org_id, idempotency_key)                          one row per key, forever
--   UNIQUE (org_id, agent_id, content_hash) WHERE not deleted one live row per content
-- so losing the Redis idempotency record (TTL, FLUSHALL, eviction) never lets one through.

CREATE SCHEMA IF NOT EXISTS ibex_memory;
GRANT USAGE ON SCHEMA ibex_memory TO ibex_app;

CREATE TABLE ibex_memory.memories (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id               uuid NOT NULL REFERENCES ibex_core.orgs (id),
    agent_id             uuid NOT NULL,
    session_id           uuid,
    turn_index           integer CHECK (turn_index >= 1),
    ordinal              integer CHECK (ordinal >= 0),
    content              text NOT NULL CHECK (length(content) BETWEEN 1 AND 4000),
    content_hash         text NOT NULL,
    kind                 text NOT NULL DEFAULT 'fact'
                         CHECK (kind IN ('fact', 'preference', 'event', 'other')),
    metadata             jsonb NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key      text CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_fingerprint  text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    deleted_at           timestamptz,
    FOREIGN KEY (agent_id, org_id) REFERENCES ibex_core.agents (id, org_id),
    CONSTRAINT memories_org_idempotency_key UNIQUE (org_id, idempotency_key),
    CONSTRAINT memories_key_has_fingerprint
        CHECK (idempotency_key IS NULL OR request_fingerprint IS NOT NULL)
);

CREATE UNIQUE INDEX memories_org_agent_content_live
    ON ibex_memory.memories (org_id, agent_id, content_hash) WHERE deleted_at IS NULL;

-- Keyset pagination of listings: newest first, ties broken by id.
CREATE INDEX idx_memories_list ON ibex_memory.memories (org_id, created_at DESC, id DESC)
    WHERE deleted_at IS NULL;
CREATE INDEX idx_memories_session ON ibex_memory.memories (org_id, session_id, turn_index, ordinal);

-- Tokens are stored as SHA-256 hashes, never in clear. A token belongs to one org, or is a
-- service token (org_id NULL) that may act for any org named in X-IBEX-Org-ID. Looked up by
-- hash before any org is known, so this table is not row-level secured; the tenant role may
-- only read it and stamp last_used_at.
CREATE TABLE ibex_memory.api_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id        uuid REFERENCES ibex_core.orgs (id),
    name          text,
    token_hash    text NOT NULL UNIQUE,
    prefix        text NOT NULL,
    scopes        text[] NOT NULL,
    is_service    boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    CONSTRAINT api_tokens_owner CHECK (is_service = (org_id IS NULL)),
    CONSTRAINT api_tokens_scopes
        CHECK (cardinality(scopes) >= 1 AND scopes <@ ARRAY['memory:read', 'memory:write'])
);

GRANT SELECT, INSERT, UPDATE ON ibex_memory.memories TO ibex_app;
GRANT SELECT, UPDATE (last_used_at) ON ibex_memory.api_tokens TO ibex_app;

ALTER TABLE ibex_memory.memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE ibex_memory.memories FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_memory.memories
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));
