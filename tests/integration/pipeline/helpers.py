"""Builders, fakes, an in-process delivery harness and end-state probes for pipeline tests.

The fakes stand in for the two network dependencies of the stages:

- :class:`FakeProvider`: counts calls per turn, can reword every answer, vary the count, or
  fail a planned number of times;
- :class:`FakeMemoryService`: the memory service's write contract (same key + same body →
  replay; same key + other body → 409 conflict; same content under another key → 409
  duplicate), with a unique row per key, and faults (fail before commit, lose the response
  after commit, reject).

:class:`Harness` delivers messages the way an at-least-once queue does: a crashed stage's
message is delivered again, a lost ack redelivers a message whose follow-ups were already sent.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.canonical import canonical_json
from core.config import Settings
from core.errors import (
    LLMRejectedError,
    LLMUnavailableError,
    MemoryRejectedError,
    MemoryUnavailableError,
    TransientError,
    TurnBusyError,
)
from extraction.dispatch import run_message
from extraction.keys import idempotency_key
from extraction.memory_client import WriteResult
from extraction.result import ExtractedMemory, ExtractionResult
from extraction.retry import RedeliveryPolicy
from extraction.stages import Send, StageDeps
from sessions.store import SessionStore
from sessions.turns import TurnInput, TurnRecord

PIPELINE_ENV = {
    "MAX_RETRIES": "3",
    "RETRY_MIN_BACKOFF_MS": "10",
    "RETRY_MAX_BACKOFF_MS": "40",
    "EXTRACTION_LEASE_SECONDS": "60",
    "EXTRACTION_CLAIM_SECONDS": "1",
    "EXTRACTION_CONTEXT_TURNS": "2",
    "SCAN_BATCH_SIZE": "3",
    "SCAN_MAX_TURNS_PER_AGENT": "1000",
    "MEMORY_SERVICE_TOKEN": "test-token",
}


def pipeline_settings(database_url: str, redis_url: str, **overrides: str) -> Settings:
    env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url, **PIPELINE_ENV, **overrides}
    return Settings.from_env(env)


class Crash(BaseException):
    """A simulated kill -9: BaseException, so no ``except Exception`` in a stage catches it."""


# -- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionRef:
    org_id: uuid.UUID
    agent_id: uuid.UUID
    session_id: uuid.UUID
    turns: int


def make_session(
    store: SessionStore,
    turns: int,
    *,
    org: str = "acme",
    agent: str = "bot",
    external_id: str | None = None,
    status: str = "completed",
) -> SessionRef:
    org_id = store.ensure_org(org)
    agent_id = store.ensure_agent(org_id, agent)
    external_id = external_id or f"conv-{uuid.uuid4().hex[:10]}"
    session = store.create_session(org_id, agent_id, external_id, status=status)
    if turns:
        # Each session's own words: identical turns of one scope would share one extraction
        # (a repeated input reuses the persisted result), which test_change_pipeline.py tests.
        store.append_turns(
            org_id,
            session.id,
            [
                TurnInput(
                    messages=[
                        {"role": "user", "content": f"I like colour number {i} ({external_id})."}
                    ],
                    completion={"role": "assistant", "content": f"Noted: {i}."},
                )
                for i in range(1, turns + 1)
            ],
        )
    return SessionRef(org_id, agent_id, session.id, turns)


# -- fakes -----------------------------------------------------------------------------------


class FakeProvider:
    """A provider whose answers are derived from the turn identity (unique per slot)."""

    name = "fake"
    model = "fake-1"

    def __init__(
        self,
        memories: int | Callable[[TurnRecord], int] = 2,
        *,
        reword: bool = False,
        count_varies: bool = False,
        latency: float = 0.0,
    ) -> None:
        self.memories = memories
        self.reword = reword
        self.count_varies = count_varies
        self.latency = latency
        self.calls: Counter[tuple[uuid.UUID, int]] = Counter()
        self.failures: dict[tuple[uuid.UUID, int], list[BaseException]] = {}
        self.always_fail: dict[tuple[uuid.UUID, int], BaseException] = {}
        self._lock = threading.Lock()

    def fail(self, session_id: uuid.UUID, turn_index: int, *errors: BaseException) -> None:
        self.failures.setdefault((session_id, turn_index), []).extend(errors)

    def reject_always(self, session_id: uuid.UUID, turn_index: int) -> None:
        self.always_fail[(session_id, turn_index)] = LLMRejectedError("400 bad request", status=400)

    def extract(
        self, turn: TurnRecord, context: Sequence[TurnRecord], related: Sequence[Any] = ()
    ) -> ExtractionResult:
        key = (turn.session_id, turn.turn_index)
        with self._lock:
            self.calls[key] += 1
            n = self.calls[key]
            planned = self.failures.get(key)
            error = planned.pop(0) if planned else self.always_fail.get(key)
        if self.latency:
            time.sleep(self.latency)
        if error is not None:
            raise error
        count = self.memories(turn) if callable(self.memories) else self.memories
        if self.count_varies:
            count = max(0, count + (n % 3) - 1)
        tag = f" (wording {n})" if self.reword else ""
        memories = tuple(
            ExtractedMemory(
                f"Session {str(turn.session_id)[:8]} turn {turn.turn_index} fact {o}{tag}.",
                "fact",
            )
            for o in range(count)
        )
        return ExtractionResult(
            memories, prompt_tokens=11, completion_tokens=7, provider=self.name, model=self.model
        )

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())


@dataclass
class StoredRow:
    memory_id: uuid.UUID
    fingerprint: str
    body: dict[str, Any]


class FakeMemoryService:
    """The memory service's write contract, in memory and thread-safe."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], StoredRow] = {}
        self.by_content: dict[tuple[str, str, str], uuid.UUID] = {}
        self.posts = 0
        self.replays = 0
        self.conflicts = 0
        self.duplicates = 0
        self.bodies: dict[str, list[bytes]] = {}
        self.fail_next: list[BaseException] = []
        self.lose_response_for: set[str] = set()
        self.reject_keys: set[str] = set()
        self._lock = threading.Lock()

    def create_memory(
        self, org_id: uuid.UUID | str, body: Mapping[str, Any], idempotency_key: str
    ) -> WriteResult:
        raw = canonical_json(body).encode()
        fingerprint = hashlib.sha256(raw).hexdigest()
        org = str(org_id)
        with self._lock:
            self.posts += 1
            self.bodies.setdefault(idempotency_key, []).append(raw)
            if self.fail_next:
                raise self.fail_next.pop(0)
            if idempotency_key in self.reject_keys:
                raise MemoryRejectedError("422 validation", status=422, code="VALIDATION")
            existing = self.rows.get((org, idempotency_key))
            if existing is not None:
                if existing.fingerprint == fingerprint:
                    self.replays += 1
                    return WriteResult(201, existing.memory_id, None, True)
                self.conflicts += 1
                return WriteResult(409, existing.memory_id, "IDEMPOTENCY_CONFLICT", False)
            content_key = (org, str(body["agent_id"]), str(body["content"]).strip().lower())
            if content_key in self.by_content:
                self.duplicates += 1
                return WriteResult(409, self.by_content[content_key], "DUPLICATE_CONTENT", False)
            memory_id = uuid.uuid4()
            self.rows[(org, idempotency_key)] = StoredRow(memory_id, fingerprint, dict(body))
            self.by_content[content_key] = memory_id
            if idempotency_key in self.lose_response_for:
                self.lose_response_for.discard(idempotency_key)
                raise MemoryUnavailableError("connection reset after the commit")
            return WriteResult(201, memory_id, None, False)

    def slots(self) -> Counter[tuple[str, int, int]]:
        """Rows per (session, turn, ordinal): at most one each is invariant 1."""
        with self._lock:
            return Counter(
                (
                    r.body["source"]["session_id"],
                    r.body["source"]["turn_index"],
                    r.body["source"]["ordinal"],
                )
                for r in self.rows.values()
            )

    def contents(self) -> dict[tuple[str, int, int], str]:
        with self._lock:
            return {
                (
                    r.body["source"]["session_id"],
                    r.body["source"]["turn_index"],
                    r.body["source"]["ordinal"],
                ): r.body["content"]
                for r in self.rows.values()
            }


# -- delivery harness ------------------------------------------------------------------------


@dataclass
class Harness:
    """Deliver messages at least once, in this thread, like a queue with crashes."""

    deps: StageDeps
    delivered: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    dead: list[tuple[Send, BaseException]] = field(default_factory=list)
    max_steps: int = 5000

    def drain(
        self,
        first: Iterable[Send],
        *,
        lose_ack: Callable[[Send], bool] | None = None,
        dead_letter: Callable[[Send, BaseException], bool] | None = None,
        limit: int | None = None,
        max_retries: int = 5,
    ) -> list[Send]:
        """Deliver until the queue is empty (or ``limit`` deliveries: then return what is
        still queued, as a killed broker would lose it). A transient error is retried up to
        ``max_retries`` times; a permanent one (or an exhausted transient) raises unless
        ``dead_letter`` accepts it."""
        queue: deque[Send] = deque(first)
        retries: Counter[str] = Counter()
        policy = RedeliveryPolicy.from_settings(self.deps.settings)
        waits: Counter[str] = Counter()
        steps = 0
        while queue:
            if limit is not None and steps >= limit:
                return list(queue)
            steps += 1
            assert steps < self.max_steps, "the pipeline did not drain"
            message = queue.popleft()
            self.delivered[message.actor_name] += 1
            try:
                follow = run_message(self.deps, message.actor_name, message.kwargs)
            except Crash as exc:
                self.crashes.append(f"{message}: {exc}")
                queue.append(message)  # the broker redelivers an unacked message
                continue
            except TurnBusyError as exc:
                # A wait on another delivery's claim, not counted against max_retries.
                time.sleep(policy.delay_for(exc, waits[str(message)]) / 1000)
                waits[str(message)] += 1
                queue.append(message)
                continue
            except Exception as exc:
                transient = isinstance(exc, TransientError)
                if transient and retries[str(message)] < max_retries:
                    time.sleep(policy.delay_for(exc, retries[str(message)]) / 1000)
                    retries[str(message)] += 1
                    queue.append(message)
                    continue
                if dead_letter is not None and dead_letter(message, exc):
                    self.dead.append((message, exc))
                    continue
                raise
            queue.extend(follow)
            if lose_ack is not None and lose_ack(message):
                queue.append(message)  # processed, follow-ups sent, ack lost: runs again
        return []


def crash_at(point: str, *, times: int = 1) -> Callable[[str], None]:
    """A fault hook that kills the stage at ``point`` the first ``times`` times it is reached."""
    hits = Counter[str]()
    lock = threading.Lock()

    def fault(name: str) -> None:
        if name != point:
            return
        with lock:
            hits[name] += 1
            if hits[name] > times:
                return
        raise Crash(point)

    return fault


# -- end-state probes (owner connection: no RLS) ---------------------------------------------


def pointers(db: Any) -> dict[uuid.UUID, tuple[int, int, int]]:
    """session -> (pointer, turn_count, first not-done turn) in one snapshot."""
    rows = db.execute_sql(
        "SELECT s.id, s.last_extracted_turn, s.turn_count,"
        "       (SELECT COALESCE(MIN(g), s.turn_count + 1)"
        "          FROM generate_series(1, s.turn_count) g"
        "          LEFT JOIN ibex_core.extraction_turns e"
        "            ON e.session_id = s.id AND e.turn_index = g"
        "         WHERE e.state IS DISTINCT FROM 'done')"
        "  FROM ibex_core.sessions s"
    ).fetchall()
    return {uuid.UUID(str(r[0])): (int(r[1]), int(r[2]), int(r[3])) for r in rows}


def assert_pointer_invariant(db: Any) -> None:
    for session_id, (pointer, _count, first_not_done) in pointers(db).items():
        assert pointer <= first_not_done - 1, (session_id, pointer, first_not_done)


def turn_rows(db: Any, session_id: uuid.UUID) -> dict[int, dict[str, Any]]:
    rows = db.execute_sql(
        "SELECT turn_index, state::text, attempts, llm_calls, memory_count, result, last_error,"
        "       (SELECT count(*) FROM ibex_core.extraction_slots x"
        "         WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index)"
        "  FROM ibex_core.extraction_turns e WHERE session_id = %s ORDER BY turn_index",
        (str(session_id),),
    ).fetchall()
    return {
        int(r[0]): {
            "state": r[1],
            "attempts": r[2],
            "llm_calls": r[3],
            "memory_count": r[4],
            "result": r[5],
            "last_error": r[6],
            "slots": int(r[7]),
        }
        for r in rows
    }


def usage_rows(db: Any, session_id: uuid.UUID) -> dict[int, dict[str, Any]]:
    """The usage ledger's rows of a session, by turn (at most one each: its primary key)."""
    rows = db.execute_sql(
        "SELECT turn_index, llm_calls, input_tokens, output_tokens, embedding_tokens,"
        "       latency_ms, reused, model"
        "  FROM ibex_core.turn_usage WHERE session_id = %s ORDER BY turn_index",
        (str(session_id),),
    ).fetchall()
    keys = ("llm_calls", "input_tokens", "output_tokens", "embedding_tokens", "latency_ms")
    return {
        int(r[0]): {**dict(zip(keys, r[1:6], strict=True)), "reused": r[6], "model": r[7]}
        for r in rows
    }


def assert_usage_counted_once(db: Any, session_id: uuid.UUID) -> None:
    """Every turn with a persisted result has exactly one ledger row, whose LLM calls are the
    turn's own counter: a retry, a redelivery or a replay added nothing."""
    turns = turn_rows(db, session_id)
    usage = usage_rows(db, session_id)
    assert set(usage) == {t for t, r in turns.items() if r["result"] is not None}
    for turn_index, row in usage.items():
        assert row["llm_calls"] == turns[turn_index]["llm_calls"], (turn_index, row)


def pointer_of(db: Any, session_id: uuid.UUID) -> int:
    row = db.execute_sql(
        "SELECT last_extracted_turn FROM ibex_core.sessions WHERE id = %s", (str(session_id),)
    ).fetchone()
    return int(row[0])


def dead_letter_rows(db: Any) -> list[dict[str, Any]]:
    rows = db.execute_sql(
        "SELECT actor_name, queue_name, exception_type, exception_message, turn_index, ordinal,"
        "       attempts, payload, traceback, session_id FROM ibex_core.dead_letters ORDER BY id"
    ).fetchall()
    keys = (
        "actor",
        "queue",
        "exception_type",
        "exception_message",
        "turn_index",
        "ordinal",
        "attempts",
        "payload",
        "traceback",
        "session_id",
    )
    return [dict(zip(keys, r, strict=True)) for r in rows]


def assert_complete(
    db: Any, memory: FakeMemoryService, sessions: Sequence[SessionRef]
) -> dict[tuple[str, int, int], str]:
    """Invariants 1-3 at the end: every turn done, every slot written once, pointers at the end.
    Returns slot -> content, to compare runs."""
    slots = memory.slots()
    assert all(n == 1 for n in slots.values()), "a slot holds more than one memory"
    expected: set[tuple[str, int, int]] = set()
    for ref in sessions:
        assert pointer_of(db, ref.session_id) == ref.turns
        for turn_index, row in turn_rows(db, ref.session_id).items():
            assert row["state"] == "done", (ref.session_id, turn_index, row)
            assert row["slots"] == row["memory_count"]
            for ordinal in range(row["memory_count"]):
                expected.add((str(ref.session_id), turn_index, ordinal))
    assert expected <= set(slots), "a slot of a persisted result was never written"
    contents = memory.contents()
    return {k: contents[k] for k in expected}


def expire_leases(db: Any) -> None:
    """Let time pass: every lease and claim is expired (as after a worker died)."""
    db.execute_sql(
        "UPDATE ibex_core.extraction_turns SET lease_expires_at = now() - interval '1 second',"
        " claim_expires_at = CASE WHEN claim_token IS NULL THEN NULL"
        "                         ELSE now() - interval '1 second' END"
    )


def once_each(predicate: Callable[[Send], bool]) -> Callable[[Send], bool]:
    """True the first time for each distinct message matching ``predicate``."""
    seen: set[str] = set()

    def check(message: Send) -> bool:
        if not predicate(message) or str(message) in seen:
            return False
        seen.add(str(message))
        return True

    return check


def terminate_backends(db: Any, application_name: str, timeout: float = 5.0) -> list[int]:
    """``pg_terminate_backend`` every backend of this database with ``application_name`` (as a
    server restart or failover ends them) and wait until they are gone. Returns their pids."""
    pids = [
        int(r[0])
        for r in db.execute_sql(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s"
            "   AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchall()
    ]
    for pid in pids:
        db.execute_sql("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        alive = db.execute_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
        ).fetchone()[0]
        if not alive:
            break
        time.sleep(0.02)
    else:
        assert not pids or time.monotonic() < deadline, f"backends {pids} did not end"
    return pids


def wait_for(
    predicate: Callable[[], bool], what: str, timeout: float = 10.0, interval: float = 0.01
) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(interval)


def key_of(ref: SessionRef, turn_index: int, ordinal: int) -> str:
    return idempotency_key(ref.org_id, ref.session_id, turn_index, ordinal)


__all__ = [
    "PIPELINE_ENV",
    "Crash",
    "FakeMemoryService",
    "FakeProvider",
    "Harness",
    "LLMUnavailableError",
    "SessionRef",
    "assert_complete",
    "assert_pointer_invariant",
    "crash_at",
    "dead_letter_rows",
    "expire_leases",
    "key_of",
    "make_session",
    "once_each",
    "pipeline_settings",
    "pointer_of",
    "pointers",
    "terminate_backends",
    "turn_rows",
    "wait_for",
]
