-- A keyed write finds its key by the key's index, with or without statistics.
--
-- create_memory looks its idempotency key up first (org_id = ... AND idempotency_key = ...).
-- plpgsql keeps the plan it makes for that statement in the first calls of a connection, until
-- the table's statistics change. Made while memories has none (a new database: reltuples
-- -1, before autovacuum's first ANALYZE; or a server that runs without autovacuum, where that
-- is never), the plan took idx_memories_session, whose first column is org_id too, and read the
-- org's every memory on every keyed write: 2.4 ms of Postgres time a write at 14,000 memories
-- of one org, and growing, where the key's own index reads one entry.
--
-- idx_memories_session now holds only the memories that have a source session: every query
-- that reads it names a session (session_id = ..., which implies the predicate), and a lookup
-- that names none can no longer take it. Without statistics the key lookup's only index is
-- then its own (memories_org_idempotency_key); with statistics nothing changes.

DROP INDEX ibex_memory.idx_memories_session;
CREATE INDEX idx_memories_session ON ibex_memory.memories (org_id, session_id, turn_index, ordinal)
    WHERE session_id IS NOT NULL;
