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

Nothing else is touched: the append-only tables lose rows only with their session. Each table
is erased by the module that owns it (:func:`sessions.store.erase_sessions`,
:func:`sessions.turns.erase_turns_of`, :func:`extraction.turns.erase_turns_of`,
:func:`extraction.deadletter_rows.erase_of_sessions`,
:func:`memories.store.erase_of_sessions`, :func:`memories.tokens.erase_tokens_of`,
:func:`sessions.users.erase_users`); this module only asks them, children before parents, in
one transaction per batch. It deletes as the table owner across orgs, like the prune of done
extraction state (:meth:`extraction.turns.TurnStore.prune_done`): the role must be a superuser
or have BYPASSRLS (row-level security would otherwise show it no rows). Rows locked by another
transaction are skipped (the next prune takes them), and ``stop`` may end it between batches
with nothing half done.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, fields

import peewee

from core.db import require_bypass_rls, transaction
from extraction import deadletter_rows
from extraction import turns as extraction_turns
from memories import store as memory_rows
from memories import tokens
from sessions import store as session_rows
from sessions import turns as session_turns
from sessions import users

_NIL_UUID = "00000000-0000-0000-0000-000000000000"


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

    def count(self, cutoff: dt.datetime) -> Erased:
        """What :meth:`erase` would delete for ``cutoff`` now, across every org (the users
        once their sessions and memories are gone)."""
        db = self.db
        with transaction(db):
            require_bypass_rls(db)
            sessions = session_rows.count_erasable_sessions(db, cutoff)
            checkpoints, payloads = session_turns.count_turns_of_deleted(db, cutoff)
            turns, slots = extraction_turns.count_turns_of_deleted(db, cutoff)
            quit = users.forgotten_before(db, cutoff)
            return Erased(
                sessions=sessions,
                checkpoints=checkpoints,
                payloads=payloads,
                turns=turns,
                slots=slots,
                memories=memory_rows.count_erasable_memories(db, cutoff),
                dead_letters=deadletter_rows.count_of_deleted_sessions(db, cutoff),
                users=len(quit),
                tokens=tokens.count_tokens_of(db, quit),
            )

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
        db = self.db
        ids = session_rows.deleted_sessions(db, cutoff, after, limit)
        if not ids:
            return Erased(), None
        turns, slots = extraction_turns.erase_turns_of(db, ids)
        letters = deadletter_rows.erase_of_sessions(db, ids)
        memories = memory_rows.erase_of_sessions(db, ids)
        checkpoints, payloads = session_turns.erase_turns_of(db, ids)
        sessions = session_rows.erase_sessions(db, ids)
        erased = Erased(
            sessions=sessions,
            checkpoints=checkpoints,
            payloads=payloads,
            turns=turns,
            slots=slots,
            memories=memories,
            dead_letters=letters,
        )
        return erased, ids[-1]

    def _memories_batch(
        self, cutoff: dt.datetime, after: str, limit: int
    ) -> tuple[Erased, str | None]:
        ids = memory_rows.deleted_memories(self.db, cutoff, after, limit)
        if not ids:
            return Erased(), None
        return Erased(memories=memory_rows.erase_memories(self.db, ids)), ids[-1]

    def _users_batch(
        self, cutoff: dt.datetime, after: str, limit: int
    ) -> tuple[Erased, str | None]:
        db = self.db
        found = users.forgotten_users(db, cutoff, after, limit)
        if not found:
            return Erased(), None
        # A user a memory still names stays until a later prune (its memory was deleted
        # after the cutoff).
        named = memory_rows.users_named(db, found)
        ids = [u for u in found if u not in named]
        gone_tokens = tokens.erase_tokens_of(db, ids) if ids else 0
        gone_users = users.erase_users(db, ids) if ids else 0
        return Erased(users=gone_users, tokens=gone_tokens), found[-1]
