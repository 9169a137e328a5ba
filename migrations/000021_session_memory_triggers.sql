-- What happens to a session's memories when the session changes is the database's rule, not a
-- second writer of the memories table: the sessions' code writes sessions only.
--
--   ibex_core.session_given_user   AFTER UPDATE OF user_id ON sessions, when an agent-wide
--                                  session gets its user: the memories already drawn from it
--                                  are about that person and take the user; one that would
--                                  repeat a live memory of the user (same agent and content)
--                                  is soft-deleted as its duplicate. (The session store ran
--                                  these two statements itself.)
--   ibex_core.session_deleted      AFTER UPDATE OF deleted_at ON sessions, when a session is
--                                  soft-deleted: its live memories are soft-deleted in the same
--                                  transaction. (The sessions service ran this statement
--                                  through the memory store.)
--   ibex_core.forget_user          000012's function with the memories soft-deleted before the
--                                  sessions, so its count of memories stays the whole count
--
-- Both triggers run as the statement's role under its org (row-level security applies to the
-- memories they change), after the session row is locked by the UPDATE that fires them: a
-- memory insert, which reads the session row FOR KEY SHARE (000012), is committed before and
-- changed here, or comes after and sees the session's new user or deletion.

CREATE FUNCTION ibex_core.session_given_user() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ibex_memory.memories m SET deleted_at = now()
     WHERE m.org_id = NEW.org_id AND m.session_id = NEW.id AND m.user_id IS NULL
       AND m.deleted_at IS NULL
       AND EXISTS (SELECT 1 FROM ibex_memory.memories d
                    WHERE d.org_id = m.org_id AND d.agent_id = m.agent_id
                      AND d.user_id = NEW.user_id AND d.content_hash = m.content_hash
                      AND d.deleted_at IS NULL);
    UPDATE ibex_memory.memories m SET user_id = NEW.user_id
     WHERE m.org_id = NEW.org_id AND m.session_id = NEW.id AND m.user_id IS NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER session_given_user
    AFTER UPDATE OF user_id ON ibex_core.sessions
    FOR EACH ROW WHEN (OLD.user_id IS NULL AND NEW.user_id IS NOT NULL)
    EXECUTE FUNCTION ibex_core.session_given_user();

CREATE FUNCTION ibex_core.session_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ibex_memory.memories m SET deleted_at = now()
     WHERE m.org_id = NEW.org_id AND m.session_id = NEW.id AND m.deleted_at IS NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER session_deleted
    AFTER UPDATE OF deleted_at ON ibex_core.sessions
    FOR EACH ROW WHEN (OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL)
    EXECUTE FUNCTION ibex_core.session_deleted();

REVOKE ALL ON FUNCTION ibex_core.session_given_user(), ibex_core.session_deleted() FROM PUBLIC;

CREATE OR REPLACE FUNCTION ibex_core.forget_user(p_org_id uuid, p_user_id uuid)
RETURNS TABLE (sessions integer, memories integer, tokens integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    v_sessions integer;
    v_memories integer;
    v_tokens integer;
BEGIN
    UPDATE ibex_memory.api_tokens t SET revoked_at = now()
     WHERE t.org_id = p_org_id AND t.user_id = p_user_id AND t.revoked_at IS NULL;
    GET DIAGNOSTICS v_tokens = ROW_COUNT;
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    PERFORM 1 FROM ibex_core.sessions s
      WHERE s.org_id = p_org_id AND s.user_id = p_user_id
      ORDER BY s.id
        FOR UPDATE;
    PERFORM 1 FROM ibex_core.users u
      WHERE u.id = p_user_id AND u.org_id = p_org_id AND u.deleted_at IS NULL
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE ibex_core.users u SET deleted_at = now()
     WHERE u.id = p_user_id AND u.org_id = p_org_id;
    UPDATE ibex_memory.memories m SET deleted_at = now()
     WHERE m.org_id = p_org_id AND m.deleted_at IS NULL
       AND (m.user_id = p_user_id
            OR m.session_id IN (SELECT s.id FROM ibex_core.sessions s
                                 WHERE s.org_id = p_org_id AND s.user_id = p_user_id));
    GET DIAGNOSTICS v_memories = ROW_COUNT;
    UPDATE ibex_core.sessions s SET deleted_at = now()
     WHERE s.org_id = p_org_id AND s.user_id = p_user_id AND s.deleted_at IS NULL;
    GET DIAGNOSTICS v_sessions = ROW_COUNT;
    RETURN QUERY SELECT v_sessions, v_memories, v_tokens;
END
$$;
