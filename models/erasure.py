"""Erasure: hard-delete what was soft-deleted long enough ago (``ibex prune
--deleted-older-than``), across every org, in short batches.

Soft deletion (``DELETE /v1/sessions/{id}``, ``DELETE /v1/memories/{id}``,
``ibex_core.forget_user``) hides rows at once; this removes them for good:

- a session deleted before the cutoff, with everything that names it: its checkpoints and
  payload archive, its extraction state (turns and slots), the memories drawn from it (deleted
  with it, or stored deleted when written afterwards), and the dead-letter mirror of its
  messages;
- a memory deleted before the cutoff (of a session kept, or of no session);
- a user forgotten before the cutoff once no session or memory names them any more, with the
  tokens bound to them (revoked when the user was forgotten).

Nothing else is touched: the append-only tables lose rows only with their session. It deletes
as the table owner across orgs, like the prune of done extraction state
(:meth:`extraction.turns.TurnStore.prune_done`): the role must be a superuser or have
BYPASSRLS (row-level security would otherwise show it no rows). Each batch is one statement in
its own short transaction, rows locked by another transaction are skipped (the next prune
takes them), and ``stop`` may end it between batches with nothing half done.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import peewee

from core.db import require_bypass_rls, transaction

_NIL_UUID = "00000000-0000-0000-0000-000000000000"

# One batch of deleted sessions and every row that names them, in one statement: foreign keys
# are checked at the end of the statement, when children and parents are gone together.
_SESSIONS_BATCH = """
WITH batch AS (
    SELECT s.id FROM ibex_core.sessions s
     WHERE s.deleted_at < %(cutoff)s AND s.id > %(after)s::uuid
     ORDER BY s.id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), slots AS (
    DELETE FROM ibex_core.extraction_slots x USING batch b WHERE x.session_id = b.id RETURNING 1
), turns AS (
    DELETE FROM ibex_core.extraction_turns e USING batch b WHERE e.session_id = b.id RETURNING 1
), memories AS (
    DELETE FROM ibex_memory.memories m USING batch b WHERE m.session_id = b.id RETURNING 1
), payloads AS (
    DELETE FROM ibex_core.checkpoint_payloads p USING batch b WHERE p.session_id = b.id
    RETURNING 1
), checkpoints AS (
    DELETE FROM ibex_core.checkpoints c USING batch b WHERE c.session_id = b.id RETURNING 1
), letters AS (
    DELETE FROM ibex_core.dead_letters d USING batch b WHERE d.session_id = b.id RETURNING 1
), sessions AS (
    DELETE FROM ibex_core.sessions s USING batch b WHERE s.id = b.id RETURNING 1
)
SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM checkpoints),
       (SELECT count(*) FROM payloads), (SELECT count(*) FROM turns),
       (SELECT count(*) FROM slots), (SELECT count(*) FROM memories),
       (SELECT count(*) FROM letters), (SELECT max(id::text) FROM batch)
"""

_MEMORIES_BATCH = """
WITH batch AS (
    SELECT m.id FROM ibex_memory.memories m
     WHERE m.deleted_at < %(cutoff)s AND m.id > %(after)s::uuid
     ORDER BY m.id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), memories AS (
    DELETE FROM ibex_memory.memories m USING batch b WHERE m.id = b.id RETURNING 1
)
SELECT (SELECT count(*) FROM memories), (SELECT max(id::text) FROM batch)
"""

# A forgotten user goes once nothing names them (a session or memory deleted after the cutoff
# keeps them until a later prune).
_USERS_BATCH = """
WITH batch AS (
    SELECT u.id, u.org_id FROM ibex_core.users u
     WHERE u.deleted_at < %(cutoff)s AND u.id > %(after)s::uuid
       AND NOT EXISTS (SELECT 1 FROM ibex_core.sessions s
                        WHERE s.org_id = u.org_id AND s.user_id = u.id)
       AND NOT EXISTS (SELECT 1 FROM ibex_memory.memories m
                        WHERE m.org_id = u.org_id AND m.user_id = u.id)
     ORDER BY u.id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), tokens AS (
    DELETE FROM ibex_memory.api_tokens t USING batch b WHERE t.user_id = b.id RETURNING 1
), users AS (
    DELETE FROM ibex_core.users u USING batch b WHERE u.id = b.id RETURNING 1
)
SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM tokens),
       (SELECT max(id::text) FROM batch)
"""

# What a prune would delete now (the users once their sessions and memories are gone).
_COUNT = """
WITH gone AS (SELECT s.id FROM ibex_core.sessions s WHERE s.deleted_at < %(cutoff)s),
     quit AS (SELECT u.id FROM ibex_core.users u WHERE u.deleted_at < %(cutoff)s)
SELECT (SELECT count(*) FROM gone),
       (SELECT count(*) FROM ibex_core.checkpoints c JOIN gone g ON g.id = c.session_id),
       (SELECT count(*) FROM ibex_core.checkpoint_payloads p JOIN gone g ON g.id = p.session_id),
       (SELECT count(*) FROM ibex_core.extraction_turns e JOIN gone g ON g.id = e.session_id),
       (SELECT count(*) FROM ibex_core.extraction_slots x JOIN gone g ON g.id = x.session_id),
       (SELECT count(*) FROM ibex_memory.memories m
         WHERE m.session_id IN (SELECT id FROM gone) OR m.deleted_at < %(cutoff)s),
       (SELECT count(*) FROM ibex_core.dead_letters d JOIN gone g ON g.id = d.session_id),
       (SELECT count(*) FROM quit),
       (SELECT count(*) FROM ibex_memory.api_tokens t JOIN quit q ON q.id = t.user_id)
"""


@dataclass(frozen=True)
class Erased:
    """Rows hard-deleted (or, in a dry run, that would be), per table."""

    sessions: int = 0
    checkpoints: int = 0
    payloads: int = 0
    turns: int = 0
    slots: int = 0
    memories: int = 0
    dead_letters: int = 0
    users: int = 0
    tokens: int = 0

    def __add__(self, other: Erased) -> Erased:
        return Erased(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_json(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def describe(self) -> str:
        return (
            f"{self.sessions} sessions ({self.checkpoints} checkpoints, {self.payloads} payloads,"
            f" {self.turns} extraction turns, {self.slots} slots, {self.dead_letters} dead"
            f" letters), {self.memories} memories, {self.users} users ({self.tokens} tokens)"
        )


class Erasure:
    """Hard deletion of soft-deleted sessions, memories and users on ``db``."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def _sql(self, sql: str, params: dict[str, Any]) -> Any:
        return self.db.execute_sql(sql, params)

    def count(self, cutoff: dt.datetime) -> Erased:
        """What :meth:`erase` would delete for ``cutoff`` now, across every org."""
        with transaction(self.db):
            require_bypass_rls(self.db)
            row = self._sql(_COUNT, {"cutoff": cutoff}).fetchone()
        return Erased(*(int(v) for v in row))

    def erase(
        self,
        cutoff: dt.datetime,
        *,
        batch_size: int = 1000,
        progress: Callable[[Erased], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Erased:
        """Hard-delete every session, memory and user soft-deleted before ``cutoff`` (see the
        module), ``batch_size`` parents per transaction; return what went."""
        with transaction(self.db):
            require_bypass_rls(self.db)
        total = Erased()
        for step in (self._sessions_batch, self._memories_batch, self._users_batch):
            after = _NIL_UUID
            while stop is None or not stop():
                with transaction(self.db):
                    erased, last = step(cutoff, after, batch_size)
                if last is None:
                    break
                total += erased
                after = last
                if progress is not None:
                    progress(total)
        return total

    def _sessions_batch(
        self, cutoff: dt.datetime, after: str, limit: int
    ) -> tuple[Erased, str | None]:
        row = self._sql(_SESSIONS_BATCH, {"cutoff": cutoff, "after": after, "limit": limit})
        sessions, checkpoints, payloads, turns, slots, memories, letters, last = row.fetchone()
        erased = Erased(
            sessions=int(sessions),
            checkpoints=int(checkpoints),
            payloads=int(payloads),
            turns=int(turns),
            slots=int(slots),
            memories=int(memories),
            dead_letters=int(letters),
        )
        return erased, last

    def _memories_batch(
        self, cutoff: dt.datetime, after: str, limit: int
    ) -> tuple[Erased, str | None]:
        row = self._sql(_MEMORIES_BATCH, {"cutoff": cutoff, "after": after, "limit": limit})
        memories, last = row.fetchone()
        return Erased(memories=int(memories)), last

    def _users_batch(
        self, cutoff: dt.datetime, after: str, limit: int
    ) -> tuple[Erased, str | None]:
        row = self._sql(_USERS_BATCH, {"cutoff": cutoff, "after": after, "limit": limit})
        users, tokens, last = row.fetchone()
        return Erased(users=int(users), tokens=int(tokens)), last
