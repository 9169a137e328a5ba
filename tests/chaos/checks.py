"""The invariants of docs/reliability.md, checked from the database after (and during) a chaos run.

:class:`PointerSampler` watches every session pointer during the run (invariant 3: never above
the first not-done turn - 1, never decreasing). :func:`end_state` reads the final state and
returns every violation found, plus the figures of the run's report; the test asserts the
violation list is empty so one failure shows them all.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.fake_llm import turn_key
from extraction.prompt import build_messages
from sessions.store import SessionStore
from tests.chaos.stack import FaultRecord, TurnId
from tests.integration.pipeline.helpers import pointers

WORDING = re.compile(r" \(wording (\d+)\)$")


class PointerSampler(threading.Thread):
    """Samples every pointer (one snapshot per sample, via ``helpers.pointers``) until stopped;
    records decreases and pointers past a turn that is not done, and the progress timeline
    (:attr:`timeline`: per session, each (monotonic time, pointer) at which it was first seen,
    with the session's turn count in :attr:`turn_counts`) for :func:`longest_wait`."""

    def __init__(self, db: Any, interval: float = 0.1) -> None:
        super().__init__(name="pointer-sampler", daemon=True)
        self.db = db
        self.interval = interval
        self.samples = 0
        self.errors = 0
        self.violations: list[str] = []
        self.last: dict[Any, int] = {}
        self.timeline: dict[Any, list[tuple[float, int]]] = {}
        self.turn_counts: dict[Any, int] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    snapshot = pointers(self.db)
                except Exception:
                    self.errors += 1  # a dropped connection: the next sample reconnects
                    self.db.close()
                else:
                    self._check(snapshot)
                self._stop_event.wait(self.interval)
        finally:
            self.db.close()  # this thread's connection

    def _check(self, snapshot: Mapping[Any, tuple[int, int, int]], at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        self.samples += 1
        for session, (pointer, count, first_not_done) in snapshot.items():
            self.turn_counts[session] = count
            line = self.timeline.setdefault(session, [])
            if not line or line[-1][1] != pointer:
                line.append((at, pointer))
            before = self.last.get(session, 0)
            if pointer < before:
                self.violations.append(f"pointer of {session} went down: {before} -> {pointer}")
            if pointer > first_not_done - 1:
                self.violations.append(
                    f"pointer of {session} is {pointer} but turn {first_not_done} is not done"
                )
            self.last[session] = max(before, pointer)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def longest_wait(
    timeline: Mapping[Any, list[tuple[float, int]]],
    turn_counts: Mapping[Any, int],
    since: float,
    until: float,
) -> tuple[float, Any]:
    """The longest time, after ``since``, that a session not yet complete went without a
    pointer step.

    For every session, the waits are the gaps between ``since`` (if it was not complete then),
    each sampled step of its pointer, and ``until`` (if it never completed); the longest of
    all sessions is returned with that session, or (0.0, None) when none was waiting. Sampling
    adds up to one sampling interval."""
    worst: tuple[float, Any] = (0.0, None)
    for session, line in timeline.items():
        count = turn_counts.get(session, 0)
        before = [p for t, p in line if t <= since]
        pointer = before[-1] if before else 0
        waiting_since = since
        for t, p in line:
            if pointer >= count:
                break
            if t <= since or p <= pointer:
                continue
            if t - waiting_since > worst[0]:
                worst = (t - waiting_since, session)
            pointer, waiting_since = p, t
        if pointer < count and until - waiting_since > worst[0]:
            worst = (until - waiting_since, session)
    return worst


@dataclass
class EndState:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def _rows(db: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    return list(db.execute_sql(sql, params).fetchall())


def end_state(
    db: Any,
    store: SessionStore,
    llm_stats: Mapping[str, Any],
    faults: list[FaultRecord],
    *,
    expected_dead_letters: int = 0,
    redis_dead_letters: int = 0,
) -> EndState:
    """Every invariant that can be read from the final state; violations and figures."""
    out = EndState()
    bad = out.violations

    sessions = _rows(
        db,
        "SELECT id::text, org_id, last_extracted_turn, turn_count FROM ibex_core.sessions",
    )
    turns = _rows(
        db,
        "SELECT session_id::text, turn_index, state::text, result, memory_count, llm_calls,"
        "       attempts FROM ibex_core.extraction_turns",
    )
    slots = _rows(
        db,
        "SELECT session_id::text, turn_index, ordinal, outcome FROM ibex_core.extraction_slots",
    )
    memories = _rows(
        db,
        "SELECT org_id::text, agent_id::text, session_id::text, turn_index, ordinal, content,"
        "       content_hash FROM ibex_memory.memories WHERE deleted_at IS NULL",
    )
    total_turns = sum(int(s[3]) for s in sessions)

    # Invariants 2 and 3 at the end: every turn recorded and done, every pointer at the end.
    for sid, _org, pointer, count in sessions:
        if pointer != count:
            bad.append(f"session {sid}: pointer {pointer}, turn_count {count}")
    if len(turns) != total_turns:
        bad.append(f"{len(turns)} turn rows for {total_turns} turns")
    not_done = [(s, t, st) for s, t, st, *_ in turns if st != "done"]
    if not_done:
        bad.append(f"{len(not_done)} turns not done, e.g. {not_done[:3]}")

    # Invariant 1: at most one memory per slot, and one content per org/agent.
    per_slot = Counter((m[2], m[3], m[4]) for m in memories)
    duplicate_slots = {k: n for k, n in per_slot.items() if n > 1}
    if duplicate_slots:
        bad.append(f"slots with more than one memory: {list(duplicate_slots.items())[:5]}")
    per_content = Counter((m[0], m[1], m[6]) for m in memories)
    duplicate_contents = sum(1 for n in per_content.values() if n > 1)
    if duplicate_contents:
        bad.append(f"{duplicate_contents} contents stored twice for one org/agent")

    # Invariant 2: every ordinal of every persisted result has one memory and one slot row;
    # and no turn mixes two LLM answers (each memory is the stored result at its ordinal).
    content_of = {(m[2], m[3], m[4]): m[5] for m in memories}
    slot_rows = Counter((s[0], s[1], s[2]) for s in slots)
    wordings: Counter[int] = Counter()
    expected_slots = 0
    for sid, ti, _state, result, count, _calls, _attempts in turns:
        if result is None:
            continue
        data = result if isinstance(result, dict) else json.loads(result)
        stored = [m["content"] for m in data["memories"]]
        if count != len(stored):
            bad.append(f"turn {sid}/{ti}: memory_count {count} for {len(stored)} memories")
        expected_slots += len(stored)
        tags = {m.group(1) for c in stored if (m := WORDING.search(c))}
        wordings.update(int(t) for t in tags)
        for ordinal, text in enumerate(stored):
            slot = (sid, ti, ordinal)
            if slot_rows.get(slot, 0) != 1:
                bad.append(f"slot {slot}: {slot_rows.get(slot, 0)} extraction_slots rows")
            if slot not in content_of:
                bad.append(f"slot {slot}: no memory (missing)")
            elif content_of[slot] != text:
                bad.append(f"slot {slot}: memory {content_of[slot]!r} but result says {text!r}")
    stray = [k for k in per_slot if k[1] is not None and k not in _slot_set(turns)]
    if stray:
        bad.append(f"memories outside every persisted result: {stray[:5]}")
    if len(memories) != expected_slots or len(slots) != expected_slots:
        bad.append(
            f"{len(memories)} memories and {len(slots)} slot rows for {expected_slots} slots"
        )
    outcomes = Counter(s[3] for s in slots)
    if outcomes.get("idempotency_conflict"):
        bad.append(f"{outcomes['idempotency_conflict']} writes met a different body under a key")

    # Invariant 4: the LLM answers a turn once, except after a fault that held its answer.
    risk: Counter[TurnId] = Counter()
    for fault in faults:
        risk.update(fault.at_risk)
    calls_by_key = llm_stats.get("calls_per_turn", {})
    answered_by_key = llm_stats.get("answered_per_turn", {})
    keys = _turn_keys(store, sessions)
    db_calls: list[int] = []
    http_calls: list[int] = []
    answers: list[int] = []
    extra_answers = 0
    for sid, ti, _state, result, _count, llm_calls, _attempts in turns:
        key = keys.get((sid, int(ti)))
        calls = int(calls_by_key.get(key, 0))
        answered = int(answered_by_key.get(key, 0))
        db_calls.append(int(llm_calls))
        http_calls.append(calls)
        answers.append(answered)
        allowed = 1 + risk[(sid, int(ti))]
        extra_answers += max(0, answered - 1)
        if answered > allowed:
            bad.append(
                f"turn {sid}/{ti}: {answered} LLM answers, allowed {allowed}"
                f" ({risk[(sid, int(ti))]} faults held its answer)"
            )
        if calls > int(llm_calls):
            bad.append(f"turn {sid}/{ti}: {calls} LLM requests but {llm_calls} claims")
        if result is not None:
            data = result if isinstance(result, dict) else json.loads(result)
            tag = next((WORDING.search(m["content"]) for m in data["memories"]), None)
            if tag and int(tag.group(1)) > calls:
                bad.append(f"turn {sid}/{ti}: stored wording {tag.group(1)} of {calls} calls")

    # Usage counted once: every turn with a stored result has exactly one ledger row (its
    # primary key forbids a second), written with the result, whose LLM calls are the turn's
    # own counter, whatever crashed, was retried or replayed.
    usage = {
        (sid, int(ti)): int(calls)
        for sid, ti, calls in _rows(
            db, "SELECT session_id::text, turn_index, llm_calls FROM ibex_core.turn_usage"
        )
    }
    for sid, ti, _state, result, _count, llm_calls, _attempts in turns:
        counted = usage.pop((sid, int(ti)), None)
        if result is not None and counted != int(llm_calls):
            bad.append(f"turn {sid}/{ti}: usage ledger says {counted} calls, claims {llm_calls}")
        if result is None and counted is not None:
            bad.append(f"turn {sid}/{ti}: usage counted without a stored result")
    if usage:
        bad.append(f"usage rows for unknown turns: {list(usage)[:3]}")

    # Whose memory: every memory of a session carries that session's user (none for an
    # agent-wide session), however the run was cut.
    wrong_user = _rows(
        db,
        "SELECT m.id::text, m.user_id::text, s.user_id::text FROM ibex_memory.memories m"
        "  JOIN ibex_core.sessions s ON s.id = m.session_id"
        " WHERE m.user_id IS DISTINCT FROM s.user_id",
    )
    if wrong_user:
        bad.append(f"{len(wrong_user)} memories with the wrong user, e.g. {wrong_user[:3]}")

    # Invariant 6: nothing dead-lettered but what the test expects.
    dead = _rows(db, "SELECT count(*) FROM ibex_core.dead_letters WHERE replayed_at IS NULL")
    if int(dead[0][0]) != expected_dead_letters:
        bad.append(f"{dead[0][0]} open dead letters, expected {expected_dead_letters}")
    if redis_dead_letters != expected_dead_letters:
        bad.append(f"{redis_dead_letters} dead letters in Redis, expected {expected_dead_letters}")

    n = max(1, len(turns))
    out.figures = {
        "sessions": len(sessions),
        "turns": len(turns),
        "memories": len(memories),
        "memories with a user": int(
            _rows(db, "SELECT count(*) FROM ibex_memory.memories WHERE user_id IS NOT NULL")[0][0]
        ),
        "slot outcomes": dict(sorted(outcomes.items())),
        "LLM claims (extraction_turns.llm_calls)": _spread(db_calls, n),
        "LLM requests (fake LLM counters)": _spread(http_calls, n),
        "LLM valid answers": _spread(answers, n),
        "turns answered more than once": sum(1 for a in answers if a > 1),
        "extra answers / turns at risk": f"{extra_answers} / {len(risk)}",
        "stored result from call #": dict(sorted(wordings.items())),
        "LLM failures injected": f"{llm_stats.get('failures', 0)} errors,"
        f" {llm_stats.get('garbage', 0)} garbage",
    }
    return out


def _slot_set(turns: list[tuple[Any, ...]]) -> set[tuple[str, int, int]]:
    out: set[tuple[str, int, int]] = set()
    for sid, ti, _s, _r, count, *_ in turns:
        out.update((sid, ti, o) for o in range(int(count or 0)))
    return out


def _spread(values: list[int], n: int) -> str:
    if not values:
        return "none"
    return f"{sum(values)} in all, {sum(values) / n:.2f} per turn, max {max(values)}"


def _turn_keys(store: SessionStore, sessions: list[tuple[Any, ...]]) -> dict[TurnId, str]:
    """The fake LLM's counter key of every turn: a hash of the request's last message."""
    keys: dict[TurnId, str] = {}
    for sid, org, _pointer, count in sessions:
        for turn in store.read_turns(org, sid, 1, int(count)):
            keys[(sid, turn.turn_index)] = turn_key(build_messages(turn, []))
    return keys


def wait_until(
    predicate: Any, *, timeout: float, interval: float, message: Any, tick: Any = None
) -> None:
    """Poll ``predicate`` until true; on timeout, fail with ``message()`` (a diagnostics dump).
    ``tick`` runs every round (process checks)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(message())
        if tick is not None:
            tick()
        time.sleep(interval)


__all__ = ["EndState", "PointerSampler", "end_state", "longest_wait", "wait_until"]
