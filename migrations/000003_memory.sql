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

-- POST /v1/memories in one round trip: called as a single SELECT in its own (implicit)
-- transaction. SECURITY INVOKER, so it can do nothing its caller could not: it switches the
-- transaction to the tenant role and org itself (exactly what core.db.tenant() does), so the
-- INSERT and the read run under row-level security, and both settings end with the statement.
--
-- The INSERT is ON CONFLICT DO NOTHING: the unique constraints decide. When it inserts nothing,
-- the row that won is read in the same transaction: the key's row first (a replay or a
-- conflict), else the live row with this content. Postgres makes a conflicting insert wait for
-- the transaction holding the other row, so that row is committed and visible by then (READ
-- COMMITTED takes a new snapshot per statement). A loser can find no winner only if the winner
-- was soft-deleted in between; the content is free again then, so it tries again, at most three
-- times, and returns no row if it still found none. An unknown org or agent raises the foreign
-- key violation (23503) naming the constraint.
CREATE FUNCTION ibex_memory.create_memory(
    p_org_id uuid, p_agent_id uuid, p_session_id uuid, p_turn_index integer, p_ordinal integer,
    p_content text, p_content_hash text, p_kind text, p_metadata jsonb,
    p_idempotency_key text, p_request_fingerprint text)
RETURNS TABLE (outcome text, id uuid, org_id uuid, agent_id uuid, session_id uuid,
               turn_index integer, ordinal integer, content text, content_hash text, kind text,
               metadata jsonb, created_at timestamptz, idempotency_key text,
               request_fingerprint text)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    FOR attempt IN 1..3 LOOP
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO ibex_memory.memories AS m
                (org_id, agent_id, session_id, turn_index, ordinal, content, content_hash, kind,
                 metadata, idempotency_key, request_fingerprint)
            VALUES (p_org_id, p_agent_id, p_session_id, p_turn_index, p_ordinal, p_content,
                    p_content_hash, p_kind, p_metadata, p_idempotency_key,
                    p_request_fingerprint)
            ON CONFLICT DO NOTHING
            RETURNING m.id, m.org_id, m.agent_id, m.session_id, m.turn_index, m.ordinal,
                      m.content, m.content_hash, m.kind, m.metadata, m.created_at,
                      m.idempotency_key, m.request_fingerprint
        )
        SELECT 'created'::text, i.* FROM inserted i;
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY
        SELECT CASE WHEN m.idempotency_key = p_idempotency_key THEN 'key_exists'
                    ELSE 'content_exists' END,
               m.id, m.org_id, m.agent_id, m.session_id, m.turn_index, m.ordinal, m.content,
               m.content_hash, m.kind, m.metadata, m.created_at, m.idempotency_key,
               m.request_fingerprint
          FROM ibex_memory.memories m
         WHERE m.org_id = p_org_id
           AND (m.idempotency_key = p_idempotency_key
                OR (m.agent_id = p_agent_id AND m.content_hash = p_content_hash
                    AND m.deleted_at IS NULL))
         ORDER BY COALESCE(m.idempotency_key = p_idempotency_key, false) DESC
         LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
