"""The pipeline's per-turn state in Postgres: the single source of truth of extraction progress.

Dramatiq delivers at least once, may run one message on two workers at once, and has paths that
drop a retry silently, so nothing here trusts the broker. Every decision a stage takes is taken
in a transaction over these rows:

- ``extraction_turns`` (one row per turn): state ``pending → extracted → done`` (or ``failed``
  when its message was dead-lettered), the scan's lease, the LLM claim, our own attempt and LLM
  call counters, and the first validated result (a trigger forbids changing it once written);
- ``extraction_slots`` (one row per written memory slot);
- ``sessions.last_extracted_turn``, moved only by :meth:`ExtractionState.complete_turn` under a
  lock on the session row, and only ever upwards.

Every tenant operation runs in :func:`core.db.tenant` (row-level security for that org). Lock
order is always session row before turn row, never the reverse, so the stages cannot deadlock
on each other.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playhouse.postgres_ext import PostgresqlExtDatabase

from core.db import APP_ROLE, scan_scope, tenant, transaction
from core.errors import NotFoundError
from models.store import Candidate, SessionStore, Turn, select_turns

UUIDLike = uuid.UUID | str


def _u(value: UUIDLike) -> str:
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))


@dataclass(frozen=True)
class TurnRef:
    """The identity of one turn: what every turn-level message carries."""

    org_id: uuid.UUID
    session_id: uuid.UUID
    turn_index: int

    @classmethod
    def of(cls, org_id: UUIDLike, session_id: UUIDLike, turn_index: int) -> TurnRef:
        return cls(uuid.UUID(_u(org_id)), uuid.UUID(_u(session_id)), int(turn_index))

    def as_message(self) -> dict[str, Any]:
        return {
            "org_id": str(self.org_id),
            "session_id": str(self.session_id),
            "turn_index": self.turn_index,
        }


@dataclass(frozen=True)
class StoredMemory:
    content: str
    kind: str


@dataclass(frozen=True)
class PersistedResult:
    """The first validated result of a turn, exactly as stored: ordinals index ``memories``."""

    memories: tuple[StoredMemory, ...]
    provider: str | None
    model: str | None
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def from_row(
        cls,
        result: Any,
        provider: str | None,
        model: str | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> PersistedResult:
        data = result if isinstance(result, dict) else json.loads(result)
        memories = tuple(StoredMemory(str(m["content"]), str(m["kind"])) for m in data["memories"])
        return cls(memories, provider, model, int(prompt_tokens), int(completion_tokens))


# -- what begin_extract found ----------------------------------------------------------------


@dataclass(frozen=True)
class AlreadyDone:
    """The turn is done (or below the pointer): nothing left to do for it."""


@dataclass(frozen=True)
class Busy:
    """Another delivery holds a live LLM claim; wait ``retry_after`` seconds."""

    retry_after: float


@dataclass(frozen=True)
class Persisted:
    """A result is stored: no LLM call; write the slots not yet written."""

    result: PersistedResult
    written: frozenset[int]


@dataclass(frozen=True)
class Claimed:
    """This delivery holds the LLM claim and may call the LLM (attempt number ``attempt``)."""

    token: uuid.UUID
    attempt: int
    #: The turn and up to ``context_turns`` turns before it, read in the claim's transaction.
    turns: tuple[Turn, ...] = ()


@dataclass(frozen=True)
class GaveUp:
    """The turn used up its attempts; ``last_error`` says why the last one failed."""

    attempts: int
    last_error: str | None


BeginOutcome = AlreadyDone | Busy | Persisted | Claimed | GaveUp


@dataclass(frozen=True)
class SlotView:
    """What ``write_memory`` needs about its slot, read in one transaction."""

    state: str
    agent_id: uuid.UUID
    result: PersistedResult | None
    recorded: bool


@dataclass(frozen=True)
class PointerOutcome:
    """The effect of :meth:`ExtractionState.complete_turn`."""

    completed: bool  # every slot was recorded and the turn is now done
    newly_done: bool  # this call moved the turn to done
    pointer_before: int
    pointer_after: int


@dataclass(frozen=True)
class TurnStatus:
    """A turn row, for inspection (CLI, tests)."""

    state: str
    attempts: int
    llm_calls: int
    memory_count: int | None
    slots: int
    last_error: str | None
    lease_live: bool
    claim_live: bool


@dataclass(frozen=True)
class DeadLetterRecord:
    """One failed message as the dead-letter mirror stores it."""

    redis_message_id: str
    message_id: str
    queue_name: str
    actor_name: str
    payload: dict[str, Any]
    exception_type: str | None
    exception_message: str | None
    traceback: str | None
    attempts: int
    org_id: uuid.UUID | None = None
    session_id: uuid.UUID | None = None
    turn_index: int | None = None
    ordinal: int | None = None


# One statement per org and batch: record every unextracted turn of the org's candidate
# sessions and lease, per agent, up to that agent's budget of the turns that are not done, not
# failed and not leased, lowest turn first across the agent's sessions. New rows are inserted
# carrying their lease (no UPDATE, no row triggers); rows recorded earlier whose lease is free
# or expired are taken with SKIP LOCKED, so two scans never lease the same turn.
_RECORD_AND_LEASE = """
WITH budget AS (
    SELECT b.agent_id, b.budget
      FROM unnest(%(agents)s::uuid[], %(budgets)s::int[]) AS b(agent_id, budget)
),
sess AS (
    SELECT s.id, s.org_id, s.agent_id, s.last_extracted_turn, s.turn_count,
           (s.status = 'completed' AND s.deleted_at IS NULL) AS recordable
      FROM ibex_core.sessions s
     WHERE s.id = ANY(%(ids)s::uuid[])
),
free AS (
    SELECT e.org_id, e.session_id, e.turn_index, s.agent_id
      FROM ibex_core.extraction_turns e
      JOIN sess s ON s.id = e.session_id
     WHERE e.session_id = ANY(%(ids)s::uuid[])
       AND e.state IN ('pending', 'extracted')
       AND e.turn_index > s.last_extracted_turn
       AND e.turn_index <= s.turn_count
       -- A lease runs at most EXTRACTION_LEASE_SECONDS from now as currently set: lowering
       -- the setting shortens the leases granted under the old one.
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= now()
            OR e.lease_expires_at > now() + make_interval(secs => %(lease)s))
       FOR UPDATE OF e SKIP LOCKED
),
missing AS (
    SELECT s.org_id, s.id AS session_id, g AS turn_index, s.agent_id
      FROM sess s
     CROSS JOIN LATERAL generate_series(s.last_extracted_turn + 1, s.turn_count) AS g
     WHERE s.recordable
       AND NOT EXISTS (SELECT 1 FROM ibex_core.extraction_turns x
                        WHERE x.session_id = s.id AND x.turn_index = g)
),
ranked AS (
    SELECT c.org_id, c.session_id, c.turn_index, c.is_new,
           row_number() OVER (PARTITION BY c.agent_id ORDER BY c.turn_index, c.session_id)
               <= b.budget AS lease
      FROM (SELECT org_id, session_id, turn_index, agent_id, false AS is_new FROM free
            UNION ALL
            SELECT org_id, session_id, turn_index, agent_id, true FROM missing) c
      JOIN budget b ON b.agent_id = c.agent_id
),
inserted AS (
    INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index, lease_expires_at)
    SELECT org_id, session_id, turn_index,
           CASE WHEN lease THEN now() + make_interval(secs => %(lease)s) END
      FROM ranked
     WHERE is_new
    ON CONFLICT DO NOTHING
    RETURNING session_id, turn_index, lease_expires_at IS NOT NULL AS leased
),
updated AS (
    UPDATE ibex_core.extraction_turns t
       SET lease_expires_at = now() + make_interval(secs => %(lease)s)
      FROM ranked r
     WHERE NOT r.is_new AND r.lease
       AND t.session_id = r.session_id AND t.turn_index = r.turn_index
    RETURNING t.session_id, t.turn_index
)
SELECT session_id, turn_index FROM inserted WHERE leased
UNION ALL
SELECT session_id, turn_index FROM updated
"""

# w = the highest t such that every turn pointer+1..t is done (a missing row is not done).
_WALK_POINTER = """
SELECT COALESCE(MIN(g), %(n)s + 1) - 1
  FROM generate_series(%(p)s + 1, %(n)s) AS g
  LEFT JOIN ibex_core.extraction_turns e ON e.session_id = %(s)s AND e.turn_index = g
 WHERE e.state IS DISTINCT FROM 'done'
"""

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


class SlotCache:
    """What ``write_memory`` needs for the first delivery of each slot, kept in-process after
    this process persisted the turn's result: the stored result and the session's agent (both
    immutable once persisted). Each ordinal is handed out once (:meth:`take`); every later
    delivery of a slot (a retry, a redelivery, a replay) misses and reads the database as
    before. Bounded (least recently filled turns dropped first) and thread-safe."""

    def __init__(self, max_turns: int = 4096) -> None:
        self.max_turns = max_turns
        self._lock = threading.Lock()
        self._turns: OrderedDict[
            tuple[uuid.UUID, uuid.UUID, int], tuple[uuid.UUID, PersistedResult, set[int]]
        ] = OrderedDict()

    def put(self, ref: TurnRef, agent_id: uuid.UUID, result: PersistedResult) -> None:
        key = (ref.org_id, ref.session_id, ref.turn_index)
        with self._lock:
            self._turns[key] = (agent_id, result, set(range(len(result.memories))))
            self._turns.move_to_end(key)
            while len(self._turns) > self.max_turns:
                self._turns.popitem(last=False)

    def take(self, ref: TurnRef, ordinal: int) -> tuple[uuid.UUID, PersistedResult] | None:
        key = (ref.org_id, ref.session_id, ref.turn_index)
        with self._lock:
            entry = self._turns.get(key)
            if entry is None or ordinal not in entry[2]:
                return None
            entry[2].discard(ordinal)
            if not entry[2]:
                del self._turns[key]
            return entry[0], entry[1]

    def __len__(self) -> int:
        with self._lock:
            return len(self._turns)


@dataclass(frozen=True)
class Answer:
    """A validated LLM answer for a turn, in its persisted form, not yet stored."""

    result: dict[str, Any]
    provider: str | None
    model: str | None
    prompt_tokens: int
    completion_tokens: int


class AnswerCache:
    """LLM answers this process holds but could not persist (the database was unavailable
    through the stage's bounded retries). The retry of the message that paid for an answer
    persists it from here instead of calling the LLM again. Bounded (oldest dropped first),
    thread-safe; an entry goes once its turn has a stored result."""

    def __init__(self, max_turns: int = 1024) -> None:
        self.max_turns = max_turns
        self._lock = threading.Lock()
        self._answers: OrderedDict[TurnRef, Answer] = OrderedDict()

    def put(self, ref: TurnRef, answer: Answer) -> None:
        with self._lock:
            self._answers[ref] = answer
            self._answers.move_to_end(ref)
            while len(self._answers) > self.max_turns:
                self._answers.popitem(last=False)

    def get(self, ref: TurnRef) -> Answer | None:
        with self._lock:
            return self._answers.get(ref)

    def discard(self, ref: TurnRef) -> None:
        with self._lock:
            self._answers.pop(ref, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)


class ExtractionState:
    """Per-turn extraction state. Shares the database (and its per-thread connections) of the
    :class:`~models.store.SessionStore` it is built on."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.db: PostgresqlExtDatabase = store.db
        self.slot_cache = SlotCache()
        self.answers = AnswerCache()

    def _sql(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        return self.db.execute_sql(sql, params)

    # -- scan ------------------------------------------------------------------------------

    def find_candidate(self, session_id: UUIDLike) -> Candidate | None:
        """One session's identities, across orgs (scan role), if it has unextracted turns."""
        with scan_scope(self.db):
            row = self._sql(
                "SELECT org_id, agent_id, id, last_extracted_turn, turn_count"
                "  FROM ibex_core.sessions"
                " WHERE id = %s AND status = 'completed' AND deleted_at IS NULL"
                "   AND last_extracted_turn < turn_count",
                (_u(session_id),),
            ).fetchone()
        if row is None:
            return None
        org, agent, sid, pointer, count = row
        return Candidate(
            uuid.UUID(str(org)), uuid.UUID(str(agent)), uuid.UUID(str(sid)), pointer, count
        )

    def lease_turns(
        self,
        candidates: Sequence[Candidate],
        budgets: Mapping[uuid.UUID, int],
        lease_seconds: int,
    ) -> list[TurnRef]:
        """Record every unextracted turn of ``candidates`` (one scan batch, any orgs) and lease,
        per agent, up to ``budgets[agent]`` of those that are not done, not failed and not
        leased: the turns to send. Agents without a positive budget are left out altogether.

        One transaction for the batch and one statement per org in it (row-level security
        applies per statement, under that org's ``ibex.org_id``). The turns come back ordered
        by the agent's first appearance in ``candidates``, then by turn and session."""
        by_org: dict[uuid.UUID, list[Candidate]] = {}
        agent_order: dict[uuid.UUID, int] = {}
        for c in candidates:
            if budgets.get(c.agent_id, 0) <= 0:
                continue
            by_org.setdefault(c.org_id, []).append(c)
            agent_order.setdefault(c.agent_id, len(agent_order))
        if not by_org:
            return []
        agent_of: dict[uuid.UUID, uuid.UUID] = {}
        refs: list[TurnRef] = []
        with transaction(self.db):
            switch_role = f"SET LOCAL ROLE {APP_ROLE}; "
            for org, group in by_org.items():
                agents = sorted({c.agent_id for c in group}, key=agent_order.__getitem__)
                for c in group:
                    agent_of[c.session_id] = c.agent_id
                rows = self._sql(
                    switch_role
                    + "SELECT set_config('ibex.org_id', %(org)s, true); "
                    + _RECORD_AND_LEASE,
                    {
                        "org": str(org),
                        "agents": [str(a) for a in agents],
                        "budgets": [int(budgets[a]) for a in agents],
                        "ids": [str(c.session_id) for c in group],
                        "lease": lease_seconds,
                    },
                ).fetchall()
                switch_role = ""
                refs.extend(TurnRef(org, uuid.UUID(str(sid)), int(ti)) for sid, ti in rows)
        return sorted(
            refs,
            key=lambda r: (agent_order[agent_of[r.session_id]], r.turn_index, str(r.session_id)),
        )

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
            if state == "done":
                return AlreadyDone()
            if state == "failed":
                # A failed turn is only delivered again by an operator's replay (the scan skips
                # it): start a fresh series of attempts.
                attempts = 0
                self._sql(
                    "UPDATE ibex_core.extraction_turns"
                    "   SET state = CASE WHEN result IS NULL THEN 'pending'::ibex_core.turn_state"
                    "                    ELSE 'extracted'::ibex_core.turn_state END,"
                    "       attempts = 0"
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

    def gave_up(self, ref: TurnRef, error: str) -> None:
        with tenant(self.db, ref.org_id):
            self._sql(
                "UPDATE ibex_core.extraction_turns SET last_error = %s"
                " WHERE session_id = %s AND turn_index = %s",
                (error[:2000], str(ref.session_id), ref.turn_index),
            )

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
            after = pointer
            if int(walked) > pointer:
                after = self.store.advance_pointer_in_txn(ref.session_id, int(walked))
            return PointerOutcome(True, newly_done, pointer, after)

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

    def mirror_dead_letter(self, record: DeadLetterRecord) -> None:
        """Insert one dead letter into ``ibex_core.dead_letters`` (owner role: operator data)."""
        with transaction(self.db):
            self._sql(
                "INSERT INTO ibex_core.dead_letters"
                " (redis_message_id, message_id, queue_name, actor_name, org_id, session_id,"
                "  turn_index, ordinal, payload, exception_type, exception_message, traceback,"
                "  attempts)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s)"
                " ON CONFLICT (redis_message_id) DO NOTHING",
                (
                    record.redis_message_id,
                    record.message_id,
                    record.queue_name,
                    record.actor_name,
                    str(record.org_id) if record.org_id else None,
                    str(record.session_id) if record.session_id else None,
                    record.turn_index,
                    record.ordinal,
                    json.dumps(record.payload, default=str),
                    record.exception_type,
                    record.exception_message,
                    record.traceback,
                    record.attempts,
                ),
            )

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

    def llm_calls(self, refs: Iterable[TurnRef]) -> int:
        return sum(s.llm_calls for r in refs if (s := self.turn_status(r)) is not None)


__all__ = [
    "AlreadyDone",
    "Answer",
    "AnswerCache",
    "BeginOutcome",
    "Busy",
    "Claimed",
    "DeadLetterRecord",
    "ExtractionState",
    "GaveUp",
    "Persisted",
    "PersistedResult",
    "PointerOutcome",
    "SlotCache",
    "SlotView",
    "StoredMemory",
    "TurnRef",
    "TurnStatus",
]
