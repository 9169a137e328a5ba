"""The owner of the per-turn state in Postgres: every statement on ``extraction_turns``,
``extraction_slots`` and the session pointer, as named transitions the stages, ``ibex extract``
and ``ibex dlq replay`` call (the scan's batch record-and-lease is in
:mod:`extraction.scan_queries`).

Dramatiq delivers at least once, may run one message on two workers at once, and has paths that
drop a retry silently, so nothing here trusts the broker. Every decision a stage takes is taken
in a transaction over these rows:

- ``extraction_turns`` (one row per turn): state ``pending → extracted → done`` (or ``failed``
  when its message was dead-lettered), the scan's lease, the LLM claim, our own attempt and LLM
  call counters, and the first validated result (a trigger forbids changing it once written);
- ``extraction_slots`` (one row per written memory slot);
- ``sessions.last_extracted_turn``, moved under a lock on the session row by
  :meth:`TurnStore.complete_turn` (and by :meth:`TurnStore.advance_pointer`, which no stage
  calls), and only ever upwards.

Once the pointer has passed a turn nothing reads its rows for correctness (a turn at or below
the pointer is done, with or without a row: :meth:`TurnStore.begin_extract` says so, the scan
and the pointer walk look only above it), so :meth:`TurnStore.prune_done` may delete them.

The hot transitions (``begin_extract``, ``persist_result``, ``load_slot``, ``record_slot``,
``complete_turn``, ``turn_status``) are each one round trip: a server-side function of
migration ``000010_stage_functions.sql`` of the same name, sent as one statement in its own
implicit transaction through :func:`core.db.one_statement` (a dead pooled connection is
replaced and the statement sent again; each function is safe to run again). The function sets
the tenant role and org itself, as ``ibex_memory.create_memory`` does, so row-level security
applies to every row it touches; it takes the decision this module documents and returns it,
and the method turns the answer into the same value types. The points where a race test holds
one transaction (between a locking read and the write it decides) are calls of
``ibex_core.stage_pause`` in those functions. The rarer transitions (the failure paths, the
pruning) run their statements in :func:`core.db.tenant` (row-level security for that org).
Lock order is always session row before turn row, never the reverse, so the stages cannot
deadlock on each other.

Three of the hot transitions commit without waiting for the WAL flush (``synchronous_commit``
off for their transaction, set by the same round trip: :data:`NOT_AWAITED`): the claim
(``begin_extract``), a slot's record (``record_slot``) and the pointer's move
(``complete_turn``). A commit is visible to every other session at once either way; what is
not awaited is only its durability against a crash of the Postgres server itself (a clean
stop, fast or smart, writes every commit out). The WAL is one ordered log, so a crash loses a
suffix of it: a record that survives brings every earlier commit with it. What a crash could
lose is therefore redone, and never wrongly: a lost claim or attempt count is taken again; a
lost slot record is written again as a replay (its memory, a synchronous commit of the memory
service, came before it); a lost pointer move is made again by the scan; and the pointer never
passes a memory that was not kept, since the memories' commits precede the move in the log.
The result (``persist_result``) is awaited: losing it would mean a second LLM call. Under load
the flush is what these statements wait on most (``LWLock:WALWrite`` and ``IO:WALSync`` in
``pg_stat_activity``), and the turn row's lock that ``record_slot`` takes is held until its
commit, so the three writes of a turn each waited for the others' flushes.

Over 400 lines but one idea: the one owner of the per-turn state, whose transitions must sit
together to keep one lock order and one name per transition.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import peewee

from core import fastjson
from core.db import one_statement, require_bypass_rls, tenant, transaction
from core.errors import RowNotFoundError
from extraction.caches import AnswerCache, SlotCache
from extraction.values import (
    AlreadyDone,
    BeginOutcome,
    Busy,
    Claimed,
    GaveUp,
    OverBudget,
    Persisted,
    PersistedResult,
    PointerOutcome,
    SlotView,
    TurnRef,
    TurnStatus,
    UUIDLike,
    uuid_text,
)
from sessions.store import advance_pointer
from sessions.turns import TurnRecord

# The stage functions of migration 000010: each one round trip in its own implicit transaction.
# 000014 added begin_extract's related-memories count and persist_result's input hash.
_BEGIN_EXTRACT = (
    "SELECT * FROM ibex_core.begin_extract("
    "%s::uuid, %s::uuid, %s, %s, %s, %s, %s, %s::uuid, %s, %s::uuid, %s)"
)
#: The stored result comes back only when it is another attempt's (``mine`` false): the one
#: this call stored is the one it sent, and writing it out (and parsing it here) again, vectors
#: and all, was 2 % of a worker's CPU.
_PERSIST_RESULT = (
    "SELECT p.mine, CASE WHEN p.mine THEN NULL ELSE p.result END, p.provider, p.model,"
    "       p.prompt_tokens, p.completion_tokens, p.written, p.agent_id, p.user_id,"
    "       p.budget_crossed"
    "  FROM ibex_core.persist_result("
    "%s::uuid, %s::uuid, %s, %s::uuid, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) p"
)
_FIND_RESULT = "SELECT * FROM ibex_core.find_result(%s::uuid, %s)"
_COMPLETE_TURN = "SELECT * FROM ibex_core.complete_turn(%s::uuid, %s::uuid, %s)"
#: Sent before a transition's statement, in the same round trip (the two run as one implicit
#: transaction): its commit does not wait for the WAL flush (module docstring).
NOT_AWAITED = "SET LOCAL synchronous_commit TO off; "

# A failed turn returns to where its persisted state says: extracted when a result is stored.
_REOPEN_STATE = (
    "state = CASE WHEN result IS NULL THEN 'pending'::ibex_core.turn_state"
    "             ELSE 'extracted'::ibex_core.turn_state END"
)


# The turns prune_done may delete: done, passed by their session's pointer, done before the
# cutoff. Keyset order on the primary key, so each batch resumes where the last one ended.
_PRUNABLE = """
  FROM ibex_core.extraction_turns e
  JOIN ibex_core.sessions s ON s.id = e.session_id
 WHERE e.state = 'done' AND e.turn_index <= s.last_extracted_turn
   AND COALESCE(e.done_at, e.updated_at) < %(cutoff)s
"""

_COUNT_PRUNABLE = f"""
SELECT count(*),
       COALESCE(sum((SELECT count(*) FROM ibex_core.extraction_slots x
                      WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index)), 0)
{_PRUNABLE}
"""

# One batch in one statement: lock the batch's turns (skipping any a late message holds), delete
# their slots and them (the slots' foreign key is checked at the end of the statement, when
# both are gone), and report what went and where the batch ended.
_PRUNE_BATCH = f"""
WITH batch AS (
    SELECT e.session_id, e.turn_index
    {_PRUNABLE}
       AND (e.session_id, e.turn_index) > (%(after_session)s::uuid, %(after_turn)s)
     ORDER BY e.session_id, e.turn_index
     LIMIT %(limit)s
       FOR UPDATE OF e SKIP LOCKED
), slots AS (
    DELETE FROM ibex_core.extraction_slots x USING batch b
     WHERE x.session_id = b.session_id AND x.turn_index = b.turn_index
    RETURNING 1
), turns AS (
    DELETE FROM ibex_core.extraction_turns e USING batch b
     WHERE e.session_id = b.session_id AND e.turn_index = b.turn_index
    RETURNING 1
), last AS (
    SELECT session_id, turn_index FROM batch ORDER BY session_id DESC, turn_index DESC LIMIT 1
)
SELECT (SELECT count(*) FROM turns), (SELECT count(*) FROM slots),
       (SELECT session_id FROM last), (SELECT turn_index FROM last)
"""

_NIL_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Pruned:
    """Rows of per-turn state deleted (or, in a dry run, that would be)."""

    turns: int = 0
    slots: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(self.turns + other.turns, self.slots + other.slots)


def _user(value: object) -> uuid.UUID | None:
    """A session's ``user_id`` as a stage function returns it (NULL: agent-wide)."""
    return None if value is None else uuid.UUID(str(value))


def _turn(session_id: uuid.UUID, row: dict[str, Any]) -> TurnRecord:
    """A turn as ``ibex_core.begin_extract`` returns it with the claim (a JSON object)."""
    return TurnRecord(
        session_id,
        int(row["turn_index"]),
        row["messages"],
        row["completion"],
        int(row["prompt_tokens"]),
        int(row["completion_tokens"]),
        int(row["latency_ms"]),
    )


class TurnStore:
    """The per-turn state on ``db`` (shared with the :class:`~sessions.store.SessionStore`, and
    its per-thread connections), with this process's caches of it."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        self.slot_cache = SlotCache()
        self.answers = AnswerCache()

    def _sql(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        return self.db.execute_sql(sql, params)

    def _call(self, sql: str, params: Sequence[Any], *, awaited: bool = True) -> Any:
        """One stage function, one round trip: it sets the tenant role and org itself. Not
        ``awaited``: its commit does not wait for the WAL flush (module docstring)."""
        return one_statement(self.db, sql if awaited else NOT_AWAITED + sql, params)

    # -- extract_turn ----------------------------------------------------------------------

    def begin_extract(
        self,
        ref: TurnRef,
        *,
        claim_seconds: int,
        lease_seconds: int,
        max_attempts: int,
        context_turns: int = 0,
        takeover: uuid.UUID | None = None,
        call_llm: bool = True,
        related: int = 0,
    ) -> BeginOutcome:
        """Transaction 1 of ``extract_turn``: lock the turn row (creating it when missing) and
        decide. Takes the LLM claim only when no result is stored and no live claim exists;
        with the claim, the same transaction reads the turn and ``context_turns`` turns before
        it (:attr:`Claimed.turns`).

        ``takeover`` is the token of a claim that an earlier attempt of the same message gave
        up without releasing (it failed while the database was unavailable): that live claim
        is taken over at once, since its holder has ended. Any other live claim means wait.
        ``call_llm`` is False when the caller holds an answer already: the claim then counts
        no attempt and no LLM call. The claim's token is made here and sent with the call, so a
        call sent again after its answer was lost finds its own claim and takes it again,
        counting nothing twice.

        With the claim it also returns up to ``related`` current memories of the session's
        scope (agent and user) most related to the turn (:attr:`Claimed.related`), read in
        the same statement, and the session's agent and user."""
        token = uuid.uuid4()
        row = self._call(
            _BEGIN_EXTRACT,
            (
                str(ref.org_id),
                str(ref.session_id),
                ref.turn_index,
                claim_seconds,
                lease_seconds,
                max_attempts,
                max(1, ref.turn_index - context_turns),
                str(takeover) if takeover is not None else None,
                call_llm,
                str(token),
                related,
            ),
            awaited=False,
        ).fetchone()
        (outcome, turn_count, result, provider, model, pt, ct, written, retry_after, attempts,
         last_error, turns, related_rows, agent, user) = row  # fmt: skip
        if outcome == "no_session":
            raise RowNotFoundError(f"session {ref.session_id} not found")
        if outcome == "no_turn":
            raise RowNotFoundError(
                f"turn {ref.turn_index} of session {ref.session_id} not found"
                f" (the session has {turn_count})"
            )
        if outcome == "done":
            return AlreadyDone()
        if outcome == "persisted":
            return Persisted(
                PersistedResult.from_row(result, provider, model, pt, ct),
                frozenset(int(o) for o in written or ()),
            )
        if outcome == "busy":
            return Busy(float(retry_after))
        if outcome == "gave_up":
            return GaveUp(int(attempts), last_error)
        if outcome == "over_budget":
            return OverBudget()
        assert outcome == "claimed", outcome
        return Claimed(
            token,
            int(attempts),
            tuple(_turn(ref.session_id, t) for t in turns),
            related=tuple(
                (str(m["id"]), str(m["content"]), str(m["kind"])) for m in related_rows or ()
            ),
            agent_id=_user(agent),
            user_id=_user(user),
        )

    def find_result(
        self, ref: TurnRef, input_hash: str
    ) -> tuple[dict[str, Any], str | None, str | None] | None:
        """A result persisted for another turn whose LLM input hashed to ``input_hash`` (the
        hash covers the scope), with its provider and model; None when there is none."""
        row = self._call(_FIND_RESULT, (str(ref.org_id), input_hash)).fetchone()
        if row is None:
            return None
        result, provider, model = row
        return (result if isinstance(result, dict) else fastjson.loads(result)), provider, model

    def release_claim(self, ref: TurnRef, token: uuid.UUID, error: str) -> None:
        """After a failed LLM call: drop our claim (so the retry need not wait) and keep why."""
        with tenant(self.db, ref.org_id):
            self._sql(
                "UPDATE ibex_core.extraction_turns"
                "   SET claim_token = NULL, claim_expires_at = NULL, last_error = %s"
                " WHERE session_id = %s AND turn_index = %s AND claim_token = %s",
                (error[:2000], str(ref.session_id), ref.turn_index, str(token)),
            )

    def release_lease(self, ref: TurnRef, error: str) -> bool:
        """A run that will not retry the turn itself (``ibex extract`` gave up on it): end its
        lease and its claim, keep why, and start a fresh series of attempts, so that the next
        scan sends it again at once. A done turn is left alone."""
        with tenant(self.db, ref.org_id):
            updated = self._sql(
                "UPDATE ibex_core.extraction_turns"
                "   SET lease_expires_at = NULL, claim_token = NULL, claim_expires_at = NULL,"
                "       attempts = 0, last_error = %s"
                " WHERE session_id = %s AND turn_index = %s AND state <> 'done'",
                (error[:2000], str(ref.session_id), ref.turn_index),
            ).rowcount
        return bool(updated)

    def last_errors(self, refs: Sequence[TurnRef]) -> dict[TurnRef, str]:
        """The turns of ``refs`` that are not done and failed last time, with their error."""
        by_org: dict[uuid.UUID, list[TurnRef]] = {}
        for ref in refs:
            by_org.setdefault(ref.org_id, []).append(ref)
        found: dict[TurnRef, str] = {}
        for org, group in by_org.items():
            with tenant(self.db, org):
                rows = self._sql(
                    "SELECT e.session_id, e.turn_index, e.last_error"
                    "  FROM ibex_core.extraction_turns e"
                    "  JOIN unnest(%s::uuid[], %s::int[]) AS r(session_id, turn_index)"
                    "    ON r.session_id = e.session_id AND r.turn_index = e.turn_index"
                    " WHERE e.last_error IS NOT NULL AND e.state <> 'done'",
                    ([str(r.session_id) for r in group], [r.turn_index for r in group]),
                ).fetchall()
            for sid, turn_index, error in rows:
                found[TurnRef(org, uuid.UUID(str(sid)), int(turn_index))] = str(error)
        return found

    def release_budget_waits(self, org_id: UUIDLike) -> int:
        """The org's budget changed: end the short leases of its turns waiting for it, so
        the next scan sends them at once (each checks the budget again before any LLM
        call). How many were waiting."""
        with tenant(self.db, org_id):
            return int(
                self._sql(
                    "UPDATE ibex_core.extraction_turns SET lease_expires_at = NULL"
                    " WHERE waiting_for_budget AND state = 'pending'"
                ).rowcount
            )

    def keep_leased(self, ref: TurnRef, lease_seconds: int, error: str) -> None:
        """A write of this turn failed and will be retried: keep the scan from sending the turn
        again meanwhile (a lost retry still ends with the lease, and the scan takes over)."""
        with tenant(self.db, ref.org_id):
            self._sql(
                "UPDATE ibex_core.extraction_turns"
                "   SET lease_expires_at = GREATEST(COALESCE(lease_expires_at, now()),"
                "                                   now() + make_interval(secs => %s)),"
                "       last_error = %s"
                " WHERE session_id = %s AND turn_index = %s AND state <> 'done'",
                (lease_seconds, error[:2000], str(ref.session_id), ref.turn_index),
            )

    def persist_result(
        self,
        ref: TurnRef,
        token: uuid.UUID,
        result: dict[str, Any],
        *,
        provider: str | None,
        model: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        lease_seconds: int,
        input_hash: str | None = None,
        reused: bool = False,
        latency_ms: int = 0,
        embedding_tokens: int = 0,
        embedding_model: str | None = None,
    ) -> Persisted:
        """Transaction 2 of ``extract_turn``: store ``result`` unless one is stored already
        (first wins), then return the stored one and the slots already written. The input
        hash is stored with it, for a repeated turn to find; the turn's usage (the tokens,
        the LLM calls counted, ``latency_ms``, ``embedding_tokens`` of ``embedding_model``)
        goes into the usage ledger (``ibex_core.turn_usage``) by the same statement, only when
        this call stores the result: a turn's usage is counted once, whatever the retries."""
        row = self._call(
            _PERSIST_RESULT,
            (
                str(ref.org_id),
                str(ref.session_id),
                ref.turn_index,
                str(token),
                fastjson.dumps(result),
                len(result["memories"]),
                prompt_tokens,
                completion_tokens,
                provider,
                model,
                lease_seconds,
                input_hash,
                reused,
                latency_ms,
                embedding_tokens,
                embedding_model,
            ),
        ).fetchone()
        if row is None:
            raise RowNotFoundError(f"turn {ref.turn_index} of {ref.session_id} vanished")
        (mine, stored_result, stored_provider, stored_model, pt, ct, written, agent, user,
         crossed) = row  # fmt: skip
        stored = PersistedResult.from_row(
            result if mine else stored_result, stored_provider, stored_model, pt, ct
        )
        if mine:
            self.slot_cache.put(ref, uuid.UUID(str(agent)), _user(user), stored)
        return Persisted(
            stored,
            frozenset(int(o) for o in written or ()),
            bool(mine),
            None if crossed is None else int(crossed),
        )

    # -- write_memory ----------------------------------------------------------------------

    def load_slot(self, ref: TurnRef, ordinal: int) -> SlotView:
        """The turn's stored result, the session's agent and user, and whether the slot is
        recorded."""
        row = self._call(
            "SELECT * FROM ibex_core.load_slot(%s::uuid, %s::uuid, %s, %s)",
            (str(ref.org_id), str(ref.session_id), ref.turn_index, ordinal),
        ).fetchone()
        if row is None:
            raise RowNotFoundError(
                f"turn {ref.turn_index} of session {ref.session_id} has no extraction state"
            )
        state, agent, result, provider, model, pt, ct, recorded, user = row
        persisted = (
            None if result is None else PersistedResult.from_row(result, provider, model, pt, ct)
        )
        return SlotView(state, uuid.UUID(str(agent)), persisted, bool(recorded), _user(user))

    def record_slot(
        self,
        ref: TurnRef,
        ordinal: int,
        *,
        idempotency_key: str,
        memory_id: uuid.UUID | None,
        outcome: str,
    ) -> bool:
        """Record the slot as written (first record wins) and say whether the turn is now
        complete and not yet done, i.e. whether the caller must send ``advance_pointer``.

        Under the turn row's lock: two writes finishing at the same moment are serialized, so
        the second always sees the first's slot and one of them sees the turn complete."""
        complete = self._call(
            "SELECT ibex_core.record_slot(%s::uuid, %s::uuid, %s, %s, %s::uuid, %s::uuid, %s)",
            (
                str(ref.org_id),
                str(ref.session_id),
                ref.turn_index,
                ordinal,
                idempotency_key,
                str(memory_id) if memory_id else None,
                outcome,
            ),
            awaited=False,
        ).fetchone()[0]
        if complete is None:
            raise RowNotFoundError(f"turn {ref.turn_index} of {ref.session_id} has no result")
        return bool(complete)

    # -- advance_pointer -------------------------------------------------------------------

    def complete_turn(
        self, ref: TurnRef, *, fault: Callable[[str], None] | None = None
    ) -> PointerOutcome:
        """Mark the turn done if every slot is recorded, and move the session pointer to the
        highest t with every turn 1..t done — one transaction under the session row's lock, so
        two turns finishing at once cannot each miss the other. Never moves it backwards."""
        params = (str(ref.org_id), str(ref.session_id), ref.turn_index)
        if fault is None:
            row = self._call(_COMPLETE_TURN, params, awaited=False).fetchone()
        else:
            # The fault point sits inside the transaction, after the turn is marked done: a
            # crash there rolls all of it back, as a crash at any point before the commit.
            with transaction(self.db):
                row = self._call(_COMPLETE_TURN, params, awaited=False).fetchone()
                if row is not None and row[0]:
                    fault("after_mark_done")
        if row is None:
            raise RowNotFoundError(f"session {ref.session_id} not found")
        completed, newly_done, before, after = row
        return PointerOutcome(bool(completed), bool(newly_done), int(before), int(after))

    def advance_pointer(self, org_id: UUIDLike, session_id: UUIDLike, turn: int) -> int:
        """Move ``last_extracted_turn`` up to ``turn`` (never down, never past turn_count);
        return the pointer now stored. The pipeline moves it only in :meth:`complete_turn`."""
        with tenant(self.db, org_id):
            return self._advance_pointer(session_id, turn)

    def _advance_pointer(self, session_id: UUIDLike, turn: int) -> int:
        # The statement is the session store's (it owns the sessions table); this store
        # decides when, under the session row's lock.
        moved = advance_pointer(self.db, uuid_text(session_id), turn)
        if moved is None:
            raise RowNotFoundError(f"session {session_id} not found")
        return moved

    # -- failures --------------------------------------------------------------------------

    def mark_failed(self, ref: TurnRef, error: str) -> bool:
        """The turn's message was dead-lettered: ``failed`` (unless already done) with why.
        It blocks its own session's pointer until a replay succeeds. The attempt counter starts
        again at zero, so a replay gets a fresh series of attempts (``llm_calls`` keeps the
        total)."""
        with tenant(self.db, ref.org_id):
            updated = self._sql(
                "UPDATE ibex_core.extraction_turns"
                "   SET state = 'failed', last_error = %s, attempts = 0"
                " WHERE session_id = %s AND turn_index = %s AND state <> 'done'",
                (error[:2000], str(ref.session_id), ref.turn_index),
            ).rowcount
        return bool(updated)

    def reopen_for_replay(self, ref: TurnRef, lease_seconds: int) -> bool:
        """An operator replays the turn's dead letter: a ``failed`` turn returns to where its
        persisted state says, with a fresh series of attempts and a fresh lease (so the scan
        does not send it as well). In the caller's transaction when there is one."""
        with tenant(self.db, ref.org_id):
            updated = self._sql(
                f"UPDATE ibex_core.extraction_turns SET {_REOPEN_STATE},"
                "     last_error = NULL, attempts = 0,"
                "     lease_expires_at = now() + make_interval(secs => %s)"
                " WHERE session_id = %s AND turn_index = %s AND state = 'failed'",
                (lease_seconds, str(ref.session_id), ref.turn_index),
            ).rowcount
        return bool(updated)

    # -- pruning ---------------------------------------------------------------------------

    def count_prunable(self, cutoff: dt.datetime) -> Pruned:
        """The rows :meth:`prune_done` would delete for ``cutoff`` now, across every org."""
        with transaction(self.db):
            require_bypass_rls(self.db)
            turns, slots = self._sql(_COUNT_PRUNABLE, {"cutoff": cutoff}).fetchone()
        return Pruned(int(turns), int(slots))

    def prune_done(
        self,
        cutoff: dt.datetime,
        *,
        batch_size: int = 1000,
        progress: Callable[[Pruned], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Pruned:
        """Delete the ``extraction_turns`` and ``extraction_slots`` rows of every turn that is
        done, passed by its session's pointer, and was done before ``cutoff``, across every
        org; return what went.

        In batches of ``batch_size`` turns, each its own short transaction (row locks on one
        batch only, never a table lock), walking the primary key so no batch rescans what an
        earlier one kept. A turn a late message holds locked is skipped (the next prune takes
        it). ``stop`` is asked before each batch: True ends the prune there (a later one
        resumes, nothing is half done). Safe to run while the pipeline runs: a redelivered
        message of a pruned turn finds it below the pointer and answers "already done"; a
        session that grows later gets new rows above the pointer only."""
        with transaction(self.db):
            require_bypass_rls(self.db)
        total = Pruned()
        after: tuple[str, int] = (_NIL_UUID, 0)
        while stop is None or not stop():
            with transaction(self.db):
                turns, slots, last_session, last_turn = self._sql(
                    _PRUNE_BATCH,
                    {
                        "cutoff": cutoff,
                        "after_session": after[0],
                        "after_turn": after[1],
                        "limit": batch_size,
                    },
                ).fetchone()
            if last_session is None:
                return total
            total += Pruned(int(turns), int(slots))
            after = (str(last_session), int(last_turn))
            if progress is not None:
                progress(total)
        return total

    # -- inspection ------------------------------------------------------------------------

    def turn_status(self, ref: TurnRef) -> TurnStatus | None:
        row = self._call(
            "SELECT * FROM ibex_core.turn_status(%s::uuid, %s::uuid, %s)",
            (str(ref.org_id), str(ref.session_id), ref.turn_index),
        ).fetchone()
        if row is None:
            return None
        state, attempts, calls, count, error, lease, claim, slots = row
        return TurnStatus(state, attempts, calls, count, int(slots), error, lease, claim)


__all__ = ["Pruned", "TurnStore"]


# -- erasure of deleted sessions (``ibex prune --deleted-older-than``): the owner role ------


def erase_turns_of(db: peewee.Database, session_ids: Sequence[str]) -> tuple[int, int]:
    """Hard-delete the per-turn state of these (erased) sessions: (turns, slots)."""
    slots = db.execute_sql(
        "DELETE FROM ibex_core.extraction_slots WHERE session_id = ANY(%s::uuid[])",
        (list(session_ids),),
    ).rowcount
    turns = db.execute_sql(
        "DELETE FROM ibex_core.extraction_turns WHERE session_id = ANY(%s::uuid[])",
        (list(session_ids),),
    ).rowcount
    return int(turns), int(slots)


def count_turns_of_deleted(db: peewee.Database, cutoff: dt.datetime) -> tuple[int, int]:
    """What :func:`erase_turns_of` would delete for the sessions deleted before ``cutoff``."""
    row = db.execute_sql(
        "WITH gone AS (SELECT s.id FROM ibex_core.sessions s WHERE s.deleted_at < %(cutoff)s)"
        " SELECT (SELECT count(*) FROM ibex_core.extraction_turns e"
        "   JOIN gone g ON g.id = e.session_id),"
        " (SELECT count(*) FROM ibex_core.extraction_slots x JOIN gone g ON g.id = x.session_id)",
        {"cutoff": cutoff},
    ).fetchone()
    return int(row[0]), int(row[1])
