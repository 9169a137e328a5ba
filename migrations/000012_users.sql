-- Users: whose memory it is. An org's agent serves many people; a session and a memory are
-- about one of them (user_id set) or about none (user_id NULL: agent-wide, shared by everyone
-- the agent talks to). Additive: every row written before this migration keeps user_id NULL
-- and means what it meant.
--
--   ibex_core.users            the application's people, by its own key (external_id)
--   sessions.user_id           whose conversation it is; set once
--   memories.user_id           whose memory it is; a memory from a session with a user
--                              carries that user (checked on insert)
--   api_tokens.user_id         a user-bound token (it may see and write that user's data only)
--   ibex_core.forget_user      soft-deletes a user, their sessions and memories, and revokes
--                              their tokens, in one transaction; `ibex prune
--                              --deleted-older-than` then erases what is soft-deleted.

CREATE TABLE ibex_core.users (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id       uuid NOT NULL REFERENCES ibex_core.orgs (id),
    external_id  text NOT NULL
                 CHECK (length(external_id) BETWEEN 1 AND 200 AND external_id !~ '[[:cntrl:]]'),
    created_at   timestamptz NOT NULL DEFAULT now(),
    deleted_at   timestamptz,
    UNIQUE (id, org_id)
);

-- One live user per application key. A forgotten user's key is free again at once: the same
-- key then names a new person with no past (their old rows wait, deleted, for the prune).
CREATE UNIQUE INDEX users_org_external_id_live
    ON ibex_core.users (org_id, external_id) WHERE deleted_at IS NULL;
-- The prune's walk over soft-deleted users.
CREATE INDEX idx_users_deleted ON ibex_core.users (deleted_at) WHERE deleted_at IS NOT NULL;

GRANT SELECT, INSERT, UPDATE ON ibex_core.users TO ibex_app;
GRANT SELECT ON ibex_core.users TO ibex_ops;

ALTER TABLE ibex_core.users ENABLE ROW LEVEL SECURITY;
ALTER TABLE ibex_core.users FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_core.users
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));
CREATE POLICY operator_read ON ibex_core.users FOR SELECT TO ibex_ops USING (true);

-- Sessions: whose conversation. MATCH SIMPLE: an agent-wide session (NULL) is not checked.
ALTER TABLE ibex_core.sessions ADD COLUMN user_id uuid;
ALTER TABLE ibex_core.sessions ADD CONSTRAINT sessions_user_fkey
    FOREIGN KEY (user_id, org_id) REFERENCES ibex_core.users (id, org_id);
-- A user's sessions (forget, erasure, listing by user), deleted or not.
CREATE INDEX idx_sessions_user ON ibex_core.sessions (org_id, user_id) WHERE user_id IS NOT NULL;
-- The prune's walk over soft-deleted sessions.
CREATE INDEX idx_sessions_deleted ON ibex_core.sessions (deleted_at) WHERE deleted_at IS NOT NULL;

-- Memories: whose memory.
ALTER TABLE ibex_memory.memories ADD COLUMN user_id uuid;
ALTER TABLE ibex_memory.memories ADD CONSTRAINT memories_user_fkey
    FOREIGN KEY (user_id, org_id) REFERENCES ibex_core.users (id, org_id);

-- One live row per content within one scope: the agent-wide memories as before, and each
-- user's apart (two people may both be allergic to soy). The NULL user is one scope, so the
-- agent-wide rows are exactly as unique as they were.
CREATE UNIQUE INDEX memories_org_agent_user_content_live
    ON ibex_memory.memories
       (org_id, agent_id, COALESCE(user_id, '00000000-0000-0000-0000-000000000000'::uuid),
        content_hash)
    WHERE deleted_at IS NULL;
DROP INDEX ibex_memory.memories_org_agent_content_live;

-- User-scoped reads (list, search, context): one user's memories and the agent-wide ones
-- (user_id NULL) of one agent, newest first. idx_memories_agent (000006) and the per-agent GIN
-- indexes (000009) stay: a user-scoped search still finds its words through them and keeps
-- the rows of the scope.
CREATE INDEX idx_memories_agent_user
    ON ibex_memory.memories (org_id, agent_id, user_id, created_at DESC)
    WHERE deleted_at IS NULL;
-- Every memory of one user across agents, deleted or not (forget, erasure).
CREATE INDEX idx_memories_user ON ibex_memory.memories (org_id, user_id) WHERE user_id IS NOT NULL;
-- The prune's walk over soft-deleted memories.
CREATE INDEX idx_memories_deleted ON ibex_memory.memories (deleted_at)
    WHERE deleted_at IS NOT NULL;

-- Tokens: a user-bound token belongs to one org and one of its users. The scopes a user-scoped
-- API needs are allowed: memory:admin (reads across users) and users:delete (forget a user).
ALTER TABLE ibex_memory.api_tokens ADD COLUMN user_id uuid;
ALTER TABLE ibex_memory.api_tokens ADD CONSTRAINT api_tokens_user_fkey
    FOREIGN KEY (user_id, org_id) REFERENCES ibex_core.users (id, org_id);
ALTER TABLE ibex_memory.api_tokens ADD CONSTRAINT api_tokens_user_has_org
    CHECK (user_id IS NULL OR org_id IS NOT NULL);
ALTER TABLE ibex_memory.api_tokens DROP CONSTRAINT api_tokens_scopes;
ALTER TABLE ibex_memory.api_tokens ADD CONSTRAINT api_tokens_scopes
    CHECK (cardinality(scopes) >= 1
           AND scopes <@ ARRAY['memory:read', 'memory:write', 'sessions:read', 'sessions:write',
                               'memory:admin', 'users:delete']);
CREATE INDEX idx_api_tokens_user ON ibex_memory.api_tokens (user_id) WHERE user_id IS NOT NULL;
GRANT SELECT (user_id) ON ibex_memory.api_tokens TO ibex_ops;

-- Every memory insert: a memory of a deleted session is stored deleted (000007), and now also
-- a memory of a forgotten user; a memory whose source session has a user must carry that same
-- user, else the insert fails with check_violation naming memories_user_of_session (the
-- memory service answers 422). Locks: the session row, then the user row, FOR KEY SHARE (as
-- the foreign-key checks do, so updates of the rows do not wait); forget_user takes the same
-- rows FOR UPDATE in the same order, so a write and a forget never deadlock, and a write that
-- comes while a forget runs waits for it and is stored deleted.
CREATE OR REPLACE FUNCTION ibex_memory.memory_of_deleted_session() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_deleted_at timestamptz;
    v_user uuid;
BEGIN
    IF NEW.session_id IS NOT NULL THEN
        SELECT s.deleted_at, s.user_id INTO v_deleted_at, v_user
          FROM ibex_core.sessions s
         WHERE s.id = NEW.session_id AND s.org_id = NEW.org_id
           FOR KEY SHARE;
        IF v_user IS NOT NULL AND NEW.user_id IS DISTINCT FROM v_user THEN
            RAISE EXCEPTION 'the memory''s user (%) is not its source session''s user (%)',
                COALESCE(NEW.user_id::text, 'none'), v_user
                USING ERRCODE = 'check_violation', CONSTRAINT = 'memories_user_of_session',
                      TABLE = 'memories', SCHEMA = 'ibex_memory';
        END IF;
        IF v_deleted_at IS NOT NULL AND NEW.deleted_at IS NULL THEN
            NEW.deleted_at := now();
        END IF;
    END IF;
    IF NEW.user_id IS NOT NULL AND NEW.deleted_at IS NULL THEN
        SELECT u.deleted_at INTO v_deleted_at
          FROM ibex_core.users u
         WHERE u.id = NEW.user_id AND u.org_id = NEW.org_id
           FOR KEY SHARE;
        IF v_deleted_at IS NOT NULL THEN
            NEW.deleted_at := now();
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- create_memory (000003) with the memory's user as a trailing parameter, NULL by default: a
-- caller of the eleven-parameter form writes an agent-wide memory exactly as before. The row
-- that wins a content conflict is looked up within the same scope (agent and user).
DROP FUNCTION ibex_memory.create_memory(
    uuid, uuid, uuid, integer, integer, text, text, text, jsonb, text, text);

CREATE FUNCTION ibex_memory.create_memory(
    p_org_id uuid, p_agent_id uuid, p_session_id uuid, p_turn_index integer, p_ordinal integer,
    p_content text, p_content_hash text, p_kind text, p_metadata jsonb,
    p_idempotency_key text, p_request_fingerprint text, p_user_id uuid DEFAULT NULL)
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
                 metadata, idempotency_key, request_fingerprint, user_id)
            VALUES (p_org_id, p_agent_id, p_session_id, p_turn_index, p_ordinal, p_content,
                    p_content_hash, p_kind, p_metadata, p_idempotency_key,
                    p_request_fingerprint, p_user_id)
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
                    AND m.user_id IS NOT DISTINCT FROM p_user_id
                    AND m.deleted_at IS NULL))
         ORDER BY COALESCE(m.idempotency_key = p_idempotency_key, false) DESC
         LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The write stage's reads (000010) also return the session's user, so the POST of a slot
-- carries it: persist_result for the slots this process fans out, load_slot for every other
-- delivery. Same parameters; one more column at the end.
DROP FUNCTION ibex_core.persist_result(
    uuid, uuid, integer, uuid, jsonb, integer, integer, integer, text, text, integer);

CREATE FUNCTION ibex_core.persist_result(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_token uuid, p_result jsonb,
    p_memory_count integer, p_prompt_tokens integer, p_completion_tokens integer,
    p_provider text, p_model text, p_lease_seconds integer)
RETURNS TABLE (mine boolean, result jsonb, provider text, model text, prompt_tokens integer,
               completion_tokens integer, written integer[], agent_id uuid, user_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    -- Store ours (and end our claim) unless a result is stored; RETURNING gives back exactly
    -- what was stored, the slots already written and the session's agent and user.
    RETURN QUERY
    WITH stored AS (
        UPDATE ibex_core.extraction_turns e
           SET result = p_result, memory_count = p_memory_count,
               prompt_tokens = p_prompt_tokens, completion_tokens = p_completion_tokens,
               provider = p_provider, model = p_model,
               state = 'extracted', extracted_at = now(), last_error = NULL,
               claim_token = NULL, claim_expires_at = NULL,
               lease_expires_at = GREATEST(COALESCE(e.lease_expires_at, now()),
                                           now() + make_interval(secs => p_lease_seconds))
          FROM ibex_core.sessions s
         WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index AND e.result IS NULL
           AND s.id = e.session_id
        RETURNING true, e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,
            ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                   WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),
            s.agent_id, s.user_id
    )
    SELECT * FROM stored;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Another delivery persisted first: its result wins; our claim (if still ours) is over.
    UPDATE ibex_core.extraction_turns e SET claim_token = NULL, claim_expires_at = NULL
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.claim_token = p_token;
    RETURN QUERY
    SELECT false, e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,
           ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x
                  WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),
           NULL::uuid, NULL::uuid
      FROM ibex_core.extraction_turns e
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index
       AND e.result IS NOT NULL
       FOR UPDATE OF e;
END
$$;

DROP FUNCTION ibex_core.load_slot(uuid, uuid, integer, integer);

CREATE FUNCTION ibex_core.load_slot(
    p_org_id uuid, p_session_id uuid, p_turn_index integer, p_ordinal integer)
RETURNS TABLE (state text, agent_id uuid, result jsonb, provider text, model text,
               prompt_tokens integer, completion_tokens integer, recorded boolean,
               user_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
#variable_conflict use_column
BEGIN
    SET LOCAL ROLE ibex_app;
    PERFORM set_config('ibex.org_id', p_org_id::text, true);
    RETURN QUERY
    SELECT e.state::text, s.agent_id, e.result, e.provider, e.model, e.prompt_tokens,
           e.completion_tokens,
           EXISTS (SELECT 1 FROM ibex_core.extraction_slots x
                    WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index
                      AND x.ordinal = p_ordinal),
           s.user_id
      FROM ibex_core.extraction_turns e
      JOIN ibex_core.sessions s ON s.id = e.session_id
     WHERE e.session_id = p_session_id AND e.turn_index = p_turn_index;
END
$$;

-- Forget a user (DELETE /v1/users/{user}, `ibex user forget`): in one transaction, revoke the
-- tokens bound to them, then soft-delete the user, their sessions (of every agent) and every
-- memory scoped to them or drawn from their sessions. Returns one row with the counts, or no
-- row when the org has no live user with that id (unknown, or forgotten already).
--
-- The tokens are revoked as the caller (the owner: the tenant role may not touch tokens);
-- the rest runs as the tenant role with the org set, under row-level security, as
-- create_memory does. Lock order as the memory insert trigger's: the user's sessions, then
-- the user. A session or memory written for the user after this commits is stored deleted
-- (the trigger) or refused (a deleted user is not resolved again: the key names a new user).
-- Executable by the owner only.
CREATE FUNCTION ibex_core.forget_user(p_org_id uuid, p_user_id uuid)
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
    UPDATE ibex_core.sessions s SET deleted_at = now()
     WHERE s.org_id = p_org_id AND s.user_id = p_user_id AND s.deleted_at IS NULL;
    GET DIAGNOSTICS v_sessions = ROW_COUNT;
    UPDATE ibex_memory.memories m SET deleted_at = now()
     WHERE m.org_id = p_org_id AND m.deleted_at IS NULL
       AND (m.user_id = p_user_id
            OR m.session_id IN (SELECT s.id FROM ibex_core.sessions s
                                 WHERE s.org_id = p_org_id AND s.user_id = p_user_id));
    GET DIAGNOSTICS v_memories = ROW_COUNT;
    RETURN QUERY SELECT v_sessions, v_memories, v_tokens;
END
$$;

REVOKE ALL ON FUNCTION
    ibex_memory.create_memory(uuid, uuid, uuid, integer, integer, text, text, text, jsonb, text,
                              text, uuid),
    ibex_core.persist_result(uuid, uuid, integer, uuid, jsonb, integer, integer, integer, text,
                             text, integer),
    ibex_core.load_slot(uuid, uuid, integer, integer),
    ibex_core.forget_user(uuid, uuid)
FROM PUBLIC;
