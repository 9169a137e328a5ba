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

-- DELETE /v1/sessions/{id} soft-deletes the session and its memories in one transaction. A
-- memory written afterwards for that session (its extraction was already in flight) is stored
-- deleted, so it never shows: the write still succeeds, and the pipeline records its slot as
-- for any other. The session row is read FOR KEY SHARE (as the foreign-key check reads it, so
-- the pointer's updates do not wait for it) while the deletion holds it FOR UPDATE: a write
-- that comes while a deletion runs waits for it and sees the session deleted; a deletion that
-- comes while a write runs waits for the write's commit and then deletes that memory too.
CREATE FUNCTION ibex_memory.memory_of_deleted_session() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_deleted_at timestamptz;
BEGIN
    IF NEW.session_id IS NOT NULL AND NEW.deleted_at IS NULL THEN
        SELECT s.deleted_at INTO v_deleted_at
          FROM ibex_core.sessions s
         WHERE s.id = NEW.session_id AND s.org_id = NEW.org_id
           FOR KEY SHARE;
        IF v_deleted_at IS NOT NULL THEN
            NEW.deleted_at := now();
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- A trigger function: it fires whatever the privilege, and no role calls it.
REVOKE ALL ON FUNCTION ibex_memory.memory_of_deleted_session() FROM PUBLIC;

CREATE TRIGGER memories_of_deleted_session BEFORE INSERT ON ibex_memory.memories
    FOR EACH ROW EXECUTE FUNCTION ibex_memory.memory_of_deleted_session();
