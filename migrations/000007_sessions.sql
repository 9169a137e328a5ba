-- The sessions API (POST /v1/sessions, turns, complete, abandon, GET, DELETE) and the
-- scheduler's idle closing.
--
-- Tokens may carry the two new scopes, sessions:read and sessions:write.
-- Listing a tenant's live sessions newest first (GET /v1/sessions) pages through an index, as
-- GET /v1/memories does. The scheduler finds active sessions idle for SESSION_IDLE_SECONDS
-- through a partial index that holds only live active sessions, so closing them costs nothing
-- when there are none, however many sessions are stored.

ALTER TABLE ibex_memory.api_tokens DROP CONSTRAINT api_tokens_scopes;
ALTER TABLE ibex_memory.api_tokens ADD CONSTRAINT api_tokens_scopes
    CHECK (cardinality(scopes) >= 1
           AND scopes <@ ARRAY['memory:read', 'memory:write', 'sessions:read', 'sessions:write']);

CREATE INDEX idx_sessions_list ON ibex_core.sessions (org_id, created_at DESC, id DESC)
    WHERE deleted_at IS NULL;

CREATE INDEX idx_sessions_idle ON ibex_core.sessions (updated_at)
    WHERE status = 'active' AND deleted_at IS NULL;
