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
- ``sessions.last_extracted_turn``, moved only by :meth:`TurnStore.advance_pointer`, under a
  lock on the session row (:meth:`TurnStore.complete_turn`), and only ever upwards.

Once the pointer has passed a turn nothing reads its rows for correctness (a turn at or below
the pointer is done, with or without a row: :meth:`TurnStore.begin_extract` says so, the scan
and the pointer walk look only above it), so :meth:`TurnStore.prune_done` may delete them.

Every tenant operation runs in :func:`core.db.tenant` (row-level security for that org). Lock
order is always session row before turn row, never the reverse, so the stages cannot deadlock
on each other.

Over 400 lines but one idea: the one owner of the per-turn state, whose transitions must sit
together to keep one lock order and one name per transition.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import peewee

from core.db import tenant, transaction
from core.errors import ConfigError, NotFoundError
from extraction.caches import AnswerCache, SlotCache
from extraction.values import (
    AlreadyDone,
    BeginOutcome,
    Busy,
    Claimed,
    GaveUp,
    Persisted,
    PersistedResult,
    PointerOutcome,
    SlotView,
    TurnRef,
    TurnStatus,
    UUIDLike,
    uuid_text,
)
from models.store import Turn, select_turns

# w = the highest t such that every turn pointer+1..t is done (a missing row is not done).
_WALK_POINTER = """
SELECT COALESCE(MIN(g), %(n)s + 1) - 1
  FROM generate_series(%(p)s + 1, %(n)s) AS g
  LEFT JOIN ibex_core.extraction_turns e ON e.session_id = %(s)s AND e.turn_index = g
 WHERE e.state IS DISTINCT FROM 'done'
"""

# A failed turn returns to where its persisted state says: extracted when a result is stored.
_REOPEN_STATE = (
    "state = CASE WHEN result IS NULL THEN 'pending'::ibex_core.turn_state"
    "             ELSE 'extracted'::ibex_core.turn_state END"
)

_ADVANCE_POINTER = (
    "UPDATE ibex_core.sessions"
    " SET last_extracted_turn = GREATEST(last_extracted_turn, LEAST(%s, turn_count))"
    " WHERE id = %s RETURNING last_extracted_turn"
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


_TURN_COLUMNS = """
state::text, result, memory_count, attempts, llm_calls, provider, model, prompt_tokens,
completion_tokens, last_error, claim_token,
COALESCE(claim_expires_at > now(), false),
GREATEST(EXTRACT(EPOCH FROM claim_expires_at - now()), 0)
"""


# The same columns qualified, for the turn row joined to its session.
_TURN_COLUMNS_E = """
e.state::text, e.result, e.memory_count, e.attempts, e.llm_calls, e.provider, e.model,
e.prompt_tokens, e.completion_tokens, e.last_error, e.claim_token,
COALESCE(e.claim_expires_at > now(), false),
GREATEST(EXTRACT(EPOCH FROM e.claim_expires_at - now()), 0)
"""


def _no_pause(point: str) -> None:
    return None


class TurnStore:
    """The per-turn state on ``db`` (shared with the :class:`~models.store.SessionStore`, and
    its per-thread connections), with this process's caches of it."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        self.slot_cache = SlotCache()
        self.answers = AnswerCache()
        #: A test seam, a no-op here: called with the name of each point that sits between a
        #: locking read and the write it decides (``begin_extract.locked``,
        #: ``record_slot.counted``, ``complete_turn.walked``), inside the transaction, so a
        #: race test can hold one transaction there and show that another one waits.
        self.pause: Callable[[str], None] = _no_pause

    def _sql(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        return self.db.execute_sql(sql, params)

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
    ) -> BeginOutcome:
        """Transaction 1 of ``extract_turn``: lock the turn row (creating it when missing) and
        decide. Takes the LLM claim only when no result is stored and no live claim exists;
        with the claim, the same transaction reads the turn and ``context_turns`` turns before
        it (:attr:`Claimed.turns`).

        ``takeover`` is the token of a claim that an earlier attempt of the same message gave
        up without releasing (it failed while the database was unavailable): that live claim
        is taken over at once, since its holder has ended. Any other live claim means wait.
        ``call_llm`` is False when the caller holds an answer already: the claim then counts
        no attempt and no LLM call."""
        with tenant(self.db, ref.org_id):
            # Usually the scan recorded the row: lock it and read its session in one statement.
            joined = self._sql(
                f"SELECT s.last_extracted_turn, s.turn_count, {_TURN_COLUMNS_E}"
                "  FROM ibex_core.extraction_turns e"
                "  JOIN ibex_core.sessions s ON s.id = e.session_id"
                " WHERE e.session_id = %s AND e.turn_index = %s FOR UPDATE OF e",
                (str(ref.session_id), ref.turn_index),
            ).fetchone()
            if joined is not None:
                pointer, turn_count = int(joined[0]), int(joined[1])
                row: tuple[Any, ...] | None = tuple(joined[2:])
            else:
                session = self._sql(
                    "SELECT last_extracted_turn, turn_count FROM ibex_core.sessions WHERE id = %s",
                    (str(ref.session_id),),
                ).fetchone()
                if session is None:
                    raise NotFoundError(f"session {ref.session_id} not found")
                pointer, turn_count = int(session[0]), int(session[1])
                row = None
            if ref.turn_index > turn_count:
                raise NotFoundError(
                    f"turn {ref.turn_index} of session {ref.session_id} not found"
                    f" (the session has {turn_count})"
                )
            if row is None:
                if ref.turn_index <= pointer:
                    # Below the pointer every turn is done, even one recorded before this table.
                    return AlreadyDone()
                self._sql(
                    "INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index)"
                    " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    (str(ref.org_id), str(ref.session_id), ref.turn_index),
                )
                row = self._lock_turn(ref)
                assert row is not None
            (state, result, _count, attempts, _calls, provider, model, pt, ct, last_error,
             claim_token, claim_live, claim_left) = row  # fmt: skip
            self.pause("begin_extract.locked")
            if state == "done":
                return AlreadyDone()
            if state == "failed":
                # A failed turn is only delivered again by an operator's replay (the scan skips
                # it): start a fresh series of attempts.
                attempts = 0
                self._sql(
                    f"UPDATE ibex_core.extraction_turns SET {_REOPEN_STATE}, attempts = 0"
                    " WHERE session_id = %s AND turn_index = %s",
                    (str(ref.session_id), ref.turn_index),
                )
            if result is not None:
                return Persisted(
                    PersistedResult.from_row(result, provider, model, pt, ct),
                    self._written(ref),
                )
            if claim_live and (takeover is None or str(claim_token) != str(takeover)):
                return Busy(float(claim_left))
            if call_llm and attempts >= max_attempts:
                return GaveUp(attempts, last_error)
            token = uuid.uuid4()
            counted = 1 if call_llm else 0
            self._sql(
                "UPDATE ibex_core.extraction_turns"
                "   SET claim_token = %s,"
                "       claim_expires_at = now() + make_interval(secs => %s),"
                "       attempts = attempts + %s, llm_calls = llm_calls + %s,"
                "       lease_expires_at = GREATEST(COALESCE(lease_expires_at, now()),"
                "                                   now() + make_interval(secs => %s))"
                " WHERE session_id = %s AND turn_index = %s",
                (
                    str(token),
                    claim_seconds,
                    counted,
                    counted,
                    lease_seconds,
                    str(ref.session_id),
                    ref.turn_index,
                ),
            )
            first = max(1, ref.turn_index - context_turns)
            return Claimed(token, attempts + counted, self._read_turns(ref, first))

    def _read_turns(self, ref: TurnRef, first: int) -> tuple[Turn, ...]:
        """Turns ``first..ref.turn_index`` with their content, in the current transaction
        (what :meth:`SessionStore.read_turns` reads in a transaction of its own)."""
        return tuple(select_turns(ref.session_id, first, ref.turn_index))

    def _lock_turn(self, ref: TurnRef) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._sql(
            f"SELECT {_TURN_COLUMNS} FROM ibex_core.extraction_turns"
            " WHERE session_id = %s AND turn_index = %s FOR UPDATE",
            (str(ref.session_id), ref.turn_index),
        ).fetchone()
        return row

    def _written(self, ref: TurnRef) -> frozenset[int]:
        rows = self._sql(
            "SELECT ordinal FROM ibex_core.extraction_slots"
            " WHERE session_id = %s AND turn_index = %s",
            (str(ref.session_id), ref.turn_index),
        ).fetchall()
        return frozenset(int(r[0]) for r in rows)

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
    ) -> Persisted:
        """Transaction 2 of ``extract_turn``: store ``result`` unless one is stored already
        (first wins), then return the stored one and the slots already written."""
        memory_count = len(result["memories"])
        with tenant(self.db, ref.org_id):
            # Store ours (and end our claim) unless a result is stored; RETURNING gives back
            # exactly what was stored, the slots already written and the session's agent.
            mine = self._sql(
                "UPDATE ibex_core.extraction_turns e"
                "   SET result = %s::jsonb, memory_count = %s,"
                "       prompt_tokens = %s, completion_tokens = %s, provider = %s, model = %s,"
                "       state = 'extracted', extracted_at = now(), last_error = NULL,"
                "       claim_token = NULL, claim_expires_at = NULL,"
                "       lease_expires_at = GREATEST(COALESCE(lease_expires_at, now()),"
                "                                   now() + make_interval(secs => %s))"
                " WHERE session_id = %s AND turn_index = %s AND result IS NULL"
                " RETURNING e.result, e.provider, e.model, e.prompt_tokens, e.completion_tokens,"
                "   ARRAY(SELECT x.ordinal FROM ibex_core.extraction_slots x"
                "          WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index),"
                "   (SELECT s.agent_id FROM ibex_core.sessions s WHERE s.id = e.session_id)",
                (
                    json.dumps(result, ensure_ascii=False),
                    memory_count,
                    prompt_tokens,
                    completion_tokens,
                    provider,
                    model,
                    lease_seconds,
                    str(ref.session_id),
                    ref.turn_index,
                ),
            ).fetchone()
            if mine is not None:
                stored = PersistedResult.from_row(mine[0], mine[1], mine[2], mine[3], mine[4])
                self.slot_cache.put(ref, uuid.UUID(str(mine[6])), stored)
                return Persisted(stored, frozenset(int(o) for o in mine[5] or ()))
            # Another delivery persisted first: its result wins; our claim (if still ours) is
            # over.
            self._sql(
                "UPDATE ibex_core.extraction_turns SET claim_token = NULL, claim_expires_at = NULL"
                " WHERE session_id = %s AND turn_index = %s AND claim_token = %s",
                (str(ref.session_id), ref.turn_index, str(token)),
            )
            row = self._lock_turn(ref)
            if row is None or row[1] is None:
                raise NotFoundError(f"turn {ref.turn_index} of {ref.session_id} vanished")
            stored = PersistedResult.from_row(row[1], row[5], row[6], row[7], row[8])
            return Persisted(stored, self._written(ref))

    # -- write_memory ----------------------------------------------------------------------

    def load_slot(self, ref: TurnRef, ordinal: int) -> SlotView:
        """The turn's stored result, the session's agent, and whether the slot is recorded."""
        with tenant(self.db, ref.org_id):
            row = self._sql(
                "SELECT e.state::text, s.agent_id, e.result, e.provider, e.model,"
                "       e.prompt_tokens, e.completion_tokens,"
                "       EXISTS (SELECT 1 FROM ibex_core.extraction_slots x"
                "                WHERE x.session_id = e.session_id"
                "                  AND x.turn_index = e.turn_index AND x.ordinal = %s)"
                "  FROM ibex_core.extraction_turns e"
                "  JOIN ibex_core.sessions s ON s.id = e.session_id"
                " WHERE e.session_id = %s AND e.turn_index = %s",
                (ordinal, str(ref.session_id), ref.turn_index),
            ).fetchone()
        if row is None:
            raise NotFoundError(
                f"turn {ref.turn_index} of session {ref.session_id} has no extraction state"
            )
        state, agent, result, provider, model, pt, ct, recorded = row
        persisted = (
            None if result is None else PersistedResult.from_row(result, provider, model, pt, ct)
        )
        return SlotView(state, uuid.UUID(str(agent)), persisted, bool(recorded))

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
        with tenant(self.db, ref.org_id):
            turn = self._sql(
                "SELECT memory_count, state::text FROM ibex_core.extraction_turns"
                " WHERE session_id = %s AND turn_index = %s FOR UPDATE",
                (str(ref.session_id), ref.turn_index),
            ).fetchone()
            if turn is None or turn[0] is None:
                raise NotFoundError(f"turn {ref.turn_index} of {ref.session_id} has no result")
            memory_count, state = int(turn[0]), turn[1]
            # Insert and count in one statement: the count's snapshot (taken after the row lock
            # above was granted) sees every slot committed before, plus ours if inserted.
            written = self._sql(
                "WITH ins AS ("
                " INSERT INTO ibex_core.extraction_slots"
                " (org_id, session_id, turn_index, ordinal, idempotency_key, memory_id, outcome)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1)"
                " SELECT (SELECT count(*) FROM ibex_core.extraction_slots"
                "          WHERE session_id = %s AND turn_index = %s)"
                "      + (SELECT count(*) FROM ins)",
                (
                    str(ref.org_id),
                    str(ref.session_id),
                    ref.turn_index,
                    ordinal,
                    idempotency_key,
                    str(memory_id) if memory_id else None,
                    outcome,
                    str(ref.session_id),
                    ref.turn_index,
                ),
            ).fetchone()[0]
            self.pause("record_slot.counted")
            return bool(int(written) >= memory_count and state != "done")

    # -- advance_pointer -------------------------------------------------------------------

    def complete_turn(
        self, ref: TurnRef, *, fault: Callable[[str], None] | None = None
    ) -> PointerOutcome:
        """Mark the turn done if every slot is recorded, and move the session pointer to the
        highest t with every turn 1..t done — one transaction under the session row's lock, so
        two turns finishing at once cannot each miss the other. Never moves it backwards."""
        with tenant(self.db, ref.org_id):
            session = self._sql(
                "SELECT last_extracted_turn, turn_count FROM ibex_core.sessions"
                " WHERE id = %s FOR UPDATE",
                (str(ref.session_id),),
            ).fetchone()
            if session is None:
                raise NotFoundError(f"session {ref.session_id} not found")
            pointer, turn_count = int(session[0]), int(session[1])
            turn = self._sql(
                "SELECT state::text, memory_count FROM ibex_core.extraction_turns"
                " WHERE session_id = %s AND turn_index = %s FOR UPDATE",
                (str(ref.session_id), ref.turn_index),
            ).fetchone()
            if turn is None or turn[1] is None:
                # Nothing stored for this turn (yet): the write that completes it sends its own
                # advance_pointer, so there is nothing to do here.
                return PointerOutcome(False, False, pointer, pointer)
            state, memory_count = turn[0], int(turn[1])
            newly_done = False
            if state != "done":
                written = self._sql(
                    "SELECT count(*) FROM ibex_core.extraction_slots"
                    " WHERE session_id = %s AND turn_index = %s",
                    (str(ref.session_id), ref.turn_index),
                ).fetchone()[0]
                if int(written) < memory_count:
                    return PointerOutcome(False, False, pointer, pointer)
                self._sql(
                    "UPDATE ibex_core.extraction_turns"
                    "   SET state = 'done', done_at = now(), lease_expires_at = NULL,"
                    "       claim_token = NULL, claim_expires_at = NULL, last_error = NULL"
                    " WHERE session_id = %s AND turn_index = %s",
                    (str(ref.session_id), ref.turn_index),
                )
                newly_done = True
            if fault is not None:
                fault("after_mark_done")
            walked = self._sql(
                _WALK_POINTER, {"p": pointer, "n": turn_count, "s": str(ref.session_id)}
            ).fetchone()[0]
            self.pause("complete_turn.walked")
            after = pointer
            if int(walked) > pointer:
                after = self._advance_pointer(ref.session_id, int(walked))
            return PointerOutcome(True, newly_done, pointer, after)

    def advance_pointer(self, org_id: UUIDLike, session_id: UUIDLike, turn: int) -> int:
        """Move ``last_extracted_turn`` up to ``turn`` (never down, never past turn_count);
        return the pointer now stored. The pipeline moves it only in :meth:`complete_turn`."""
        with tenant(self.db, org_id):
            return self._advance_pointer(session_id, turn)

    def _advance_pointer(self, session_id: UUIDLike, turn: int) -> int:
        row = self._sql(_ADVANCE_POINTER, (turn, uuid_text(session_id))).fetchone()
        if row is None:
            raise NotFoundError(f"session {session_id} not found")
        return int(row[0])

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

    def _check_can_prune(self) -> None:
        # Across every org, as the connecting role: row-level security would show it no rows
        # (and the delete would silently do nothing) unless it bypasses RLS.
        allowed = self._sql(
            "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        if not (allowed and allowed[0]):
            raise ConfigError(
                "pruning needs the role that runs `ibex migrate` (a superuser or a role with"
                " BYPASSRLS) in DATABASE_URL",
                variable="DATABASE_URL",
            )

    def count_prunable(self, cutoff: dt.datetime) -> Pruned:
        """The rows :meth:`prune_done` would delete for ``cutoff`` now, across every org."""
        with transaction(self.db):
            self._check_can_prune()
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
            self._check_can_prune()
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
        with tenant(self.db, ref.org_id):
            row = self._sql(
                "SELECT state::text, attempts, llm_calls, memory_count, last_error,"
                "       COALESCE(lease_expires_at > now(), false),"
                "       COALESCE(claim_expires_at > now(), false),"
                "       (SELECT count(*) FROM ibex_core.extraction_slots x"
                "         WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index)"
                "  FROM ibex_core.extraction_turns e"
                " WHERE session_id = %s AND turn_index = %s",
                (str(ref.session_id), ref.turn_index),
            ).fetchone()
        if row is None:
            return None
        state, attempts, calls, count, error, lease, claim, slots = row
        return TurnStatus(state, attempts, calls, count, int(slots), error, lease, claim)


__all__ = ["Pruned", "TurnStore"]
