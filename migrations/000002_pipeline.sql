-- The extraction pipeline's own state: one row per turn, one per written memory slot, and the
-- Postgres mirror of the dead-letter queue.
--
-- extraction_turns.state:
--   pending    recorded by the scan, no persisted result yet
--   extracted  the validated LLM result is persisted (first one wins); slots being written
--   done       every slot written; the pointer may pass this turn
--   failed     dead-lettered; blocks its own session's pointer until replayed

CREATE TYPE ibex_core.turn_state AS ENUM ('pending', 'extracted', 'done', 'failed');

CREATE TABLE ibex_core.extraction_turns (
    org_id             uuid NOT NULL,
    session_id         uuid NOT NULL,
    turn_index         integer NOT NULL CHECK (turn_index >= 1),
    state              ibex_core.turn_state NOT NULL DEFAULT 'pending',
    -- The scan's lease: while it is live the turn is in flight and is not sent again.
    lease_expires_at   timestamptz,
    -- The LLM claim: one delivery at a time may call the LLM for this turn.
    claim_token        uuid,
    claim_expires_at   timestamptz,
    attempts           integer NOT NULL DEFAULT 0,
    llm_calls          integer NOT NULL DEFAULT 0,
    result             jsonb,
    memory_count       integer CHECK (memory_count >= 0),
    prompt_tokens      integer NOT NULL DEFAULT 0,
    completion_tokens  integer NOT NULL DEFAULT 0,
    provider           text,
    model              text,
    last_error         text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    extracted_at       timestamptz,
    done_at            timestamptz,
    PRIMARY KEY (session_id, turn_index),
    FOREIGN KEY (session_id, org_id) REFERENCES ibex_core.sessions (id, org_id),
    -- A result, once persisted, is what every later attempt uses.
    CONSTRAINT extraction_turns_result_shape
        CHECK ((result IS NULL) = (memory_count IS NULL)),
    CONSTRAINT extraction_turns_done_has_result
        CHECK (state IN ('pending', 'failed') OR result IS NOT NULL)
);

CREATE INDEX idx_extraction_turns_open
    ON ibex_core.extraction_turns (org_id, state, lease_expires_at)
    WHERE state <> 'done';

CREATE TRIGGER extraction_turns_touch BEFORE UPDATE ON ibex_core.extraction_turns
    FOR EACH ROW EXECUTE FUNCTION ibex_core.touch_updated_at();

-- The persisted result never changes once written.
CREATE FUNCTION ibex_core.extraction_result_first_wins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.result IS NOT NULL AND NEW.result IS DISTINCT FROM OLD.result THEN
        RAISE EXCEPTION 'the persisted extraction result of a turn cannot change'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER extraction_turns_first_wins BEFORE UPDATE ON ibex_core.extraction_turns
    FOR EACH ROW EXECUTE FUNCTION ibex_core.extraction_result_first_wins();

CREATE TABLE ibex_core.extraction_slots (
    org_id           uuid NOT NULL,
    session_id       uuid NOT NULL,
    turn_index       integer NOT NULL,
    ordinal          integer NOT NULL CHECK (ordinal >= 0),
    idempotency_key  uuid NOT NULL,
    memory_id        uuid,
    outcome          text NOT NULL,
    written_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, turn_index, ordinal),
    FOREIGN KEY (session_id, turn_index) REFERENCES ibex_core.extraction_turns (session_id, turn_index)
);

GRANT SELECT, INSERT, UPDATE ON ibex_core.extraction_turns TO ibex_app;
GRANT SELECT, INSERT ON ibex_core.extraction_slots TO ibex_app;

ALTER TABLE ibex_core.extraction_turns ENABLE ROW LEVEL SECURITY;
ALTER TABLE ibex_core.extraction_turns FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_core.extraction_turns
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));
ALTER TABLE ibex_core.extraction_slots ENABLE ROW LEVEL SECURITY;
ALTER TABLE ibex_core.extraction_slots FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ibex_core.extraction_slots
    USING (ibex_core.rls_org_visible(org_id)) WITH CHECK (ibex_core.rls_org_visible(org_id));

-- Every failed message, mirrored from the broker's after_nack. Operator data, not tenant data:
-- an invalid message may name no org at all. Written and read by the owner role only.
CREATE TABLE ibex_core.dead_letters (
    id                 bigserial PRIMARY KEY,
    redis_message_id   text NOT NULL UNIQUE,
    message_id         text NOT NULL,
    queue_name         text NOT NULL,
    actor_name         text NOT NULL,
    org_id             uuid,
    session_id         uuid,
    turn_index         integer,
    ordinal            integer,
    payload            jsonb NOT NULL,
    exception_type     text,
    exception_message  text,
    traceback          text,
    attempts           integer NOT NULL DEFAULT 0,
    failed_at          timestamptz NOT NULL DEFAULT now(),
    replayed_at        timestamptz,
    replayed_as        text,
    purged_at          timestamptz
);

CREATE INDEX idx_dead_letters_open ON ibex_core.dead_letters (queue_name, failed_at)
    WHERE replayed_at IS NULL AND purged_at IS NULL;
CREATE INDEX idx_dead_letters_slot ON ibex_core.dead_letters (session_id, turn_index);
