"""The chaos suite: the whole pipeline on real processes under injected faults, then every
invariant of docs/reliability.md checked from the database (docs/reliability.md).

Run with ``CHAOS_SEED=<n>`` to replay a run's fault plan; every test prints its seed and a
short report (``-s`` shows it on success too).
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cli.stack.processes import ROOT
from schema.messages import Queue
from sessions.importer import import_lines
from sessions.store import SessionStore
from tests.chaos.checks import PointerSampler, end_state, longest_wait, wait_until
from tests.chaos.stack import ChaosConfig, ChaosStack, PrivatePostgres
from tests.integration.pipeline.test_e2e_workers import BIN

#: The faults of the main run, each fired once when the run's progress passes a seeded point.
MAIN_FAULTS = (
    "SIGKILL workers",
    "SIGKILL workers",
    "terminate worker backends",
    "terminate worker and memory-service backends",
    "Redis crash (no persistence)",
    "LLM 500 burst",
    "LLM garbage burst",
)
FAULT_WINDOW = (0.08, 0.80)  # fraction of the run's progress in which faults land
#: Faults that can only land on LLM calls in flight (a claim held, a call answered): they are
#: placed on the LLM phase's own progress (turns with a stored result), which the mixed
#: fraction above can pass long after the last call, when the run is only writing.
LLM_FAULTS = frozenset({"SIGKILL workers", "LLM 500 burst", "LLM garbage burst"})
LLM_FAULT_WINDOW = (0.08, 0.60)
DRAIN_TIMEOUT_S = 120.0


@dataclass
class Dataset:
    sessions: int
    turns: int
    #: Give three sessions in four a user (two people per org, the fourth session agent-wide),
    #: so the end state can check that every memory carries its session's user.
    users: bool = False

    @property
    def total(self) -> int:
        return self.sessions * self.turns

    def lines(self, tag: str) -> list[str]:
        out = []
        for s in range(self.sessions):
            turns = [
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": f"Remember that {tag} user {s} has lucky number"
                            f" {s * 1000 + t} and likes colour {t}.",
                        }
                    ],
                    "completion": {"role": "assistant", "content": "Noted."},
                }
                for t in range(self.turns)
            ]
            record: dict[str, Any] = {
                "org": "acme" if s % 2 else "globex",
                "agent": f"bot{s % 3}",
                "session": f"{tag}-{s}",
                "turns": turns,
            }
            if self.users and s % 4 != 3:
                record["user"] = f"person-{s % 4 % 2}"
            out.append(json.dumps(record))
        return out


def _import(store: SessionStore, data: Dataset, tag: str) -> None:
    _import_lines(store, data.lines(tag), data.total)


def _import_lines(store: SessionStore, lines: list[str], turns: int) -> None:
    report = import_lines(store, lines)
    assert not report.errors, report.errors
    assert report.turns_added == turns


def _progress_fraction(stack: ChaosStack, total: int) -> float:
    _recorded, persisted, done, _pointers = stack.progress()
    return (persisted + done) / (2 * total)


def _llm_fraction(stack: ChaosStack, total: int) -> float:
    _recorded, persisted, _done, _pointers = stack.progress()
    return persisted / total


def _drained(stack: ChaosStack, total: int) -> bool:
    _recorded, _persisted, done, pointer_sum = stack.progress()
    return done == total and pointer_sum == total


def _ibex(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ibex"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _second_run_does_nothing(stack: ChaosStack, db: Any) -> str:
    """Invariant 5: after the drain, a scan sends nothing and nothing calls or writes."""
    calls = stack.llm_stats()["calls"]
    memories = db.execute_sql("SELECT count(*) FROM ibex_memory.memories").fetchone()[0]
    scan = _ibex(stack.env, "scan", "--json")
    assert scan.returncode == 0, scan.stderr
    sent = json.loads(scan.stdout)["turns"]
    time.sleep(1.5)  # let the scheduler's scans run on the workers too
    after_calls = stack.llm_stats()["calls"]
    after_memories = db.execute_sql("SELECT count(*) FROM ibex_memory.memories").fetchone()[0]
    assert (sent, after_calls, after_memories) == (0, calls, memories), (
        f"second run: {sent} turns sent, LLM calls {calls} -> {after_calls},"
        f" memories {memories} -> {after_memories}"
    )
    return "a scan after the drain sent 0 turns; no LLM call, no memory"


def _report(
    title: str, seed: int, data: Dataset, stack: ChaosStack, figures: dict[str, Any], extra: str
) -> str:
    lines = [f"chaos: {title}  seed={seed}  ({data.sessions} sessions x {data.turns} turns)"]
    lines += [f"  fault at {f.at:5.1f}s  {f.kind}: {f.detail}" for f in stack.faults]
    if stack.proxy is not None:
        lines.append(f"  proxy: {dict(sorted(stack.proxy.snapshot().items()))}")
    lines += [f"  {k}: {v}" for k, v in figures.items()]
    lines += [f"  unexpected exit: {e}" for e in stack.unexpected_exits]
    lines.append(f"  {extra}")
    return "\n".join(lines)


def _fire(stack: ChaosStack, kind: str, rng: random.Random) -> None:
    if kind == "SIGKILL workers":
        stack.kill_workers(pause=rng.uniform(0.0, 1.0))
    elif kind == "terminate worker backends":
        stack.terminate_backends()
    elif kind == "terminate worker and memory-service backends":
        stack.terminate_backends(memory_service=True)
    elif kind == "Redis crash (no persistence)":
        stack.restart_redis(kill=True, pause=rng.uniform(0.5, 1.5))
    elif kind == "LLM 500 burst":
        stack.llm_burst(failures=6, status=500)
    elif kind == "LLM garbage burst":
        stack.llm_burst(garbage=4)
    elif kind == "count_varies on":
        stack.llm_control(count_varies=True)
    elif kind == "count_varies off":
        stack.llm_control(count_varies=False)
    else:  # pragma: no cover - a typo in a plan
        raise AssertionError(f"unknown fault {kind}")


def _plan(rng: random.Random) -> list[tuple[float, str]]:
    plan = [
        (rng.uniform(*(LLM_FAULT_WINDOW if kind in LLM_FAULTS else FAULT_WINDOW)), kind)
        for kind in MAIN_FAULTS
    ]
    # The LLM changes its count of memories from call to call for a stretch of the run.
    on = rng.uniform(0.0, 0.5)
    off = on + rng.uniform(0.25, 0.4)
    plan += [(on, "count_varies on"), (off, "count_varies off")]
    return sorted(plan)


@pytest.mark.timeout(300)
def test_faults_during_a_run_end_with_every_invariant(
    make_stack: Callable[[ChaosConfig], ChaosStack],
    db: Any,
    store: SessionStore,
    chaos_seed: int,
) -> None:
    """Faults at seeded moments of one run, and the state they must leave.

    Crash points simulated:
    - SIGKILL of the whole worker process group, twice, then a restart: a kill after the LLM
      answered but before the result was persisted, after persisting, after a POST committed,
      after recording a slot, before the ack — wherever the threads happen to be;
    - ``pg_terminate_backend`` of the workers' backends (and once also the memory service's):
      transactions cut mid-way, pooled connections dead on their next use;
    - a Redis crash with no persistence (SIGKILL, restart on the same port): every queued,
      delayed and in-flight message lost, and the memory service's idempotency records;
      only the scan's leases bring the work back;
    - the proxy: 503 before forwarding, and the response lost after the memory was committed;
    - the LLM: rewording on every call, seeded 429s and garbage, a 500 burst, a garbage burst,
      and a stretch where the number of memories changes from call to call.

    End state: every pointer at turn_count, every turn done, exactly one memory and one slot
    row per ordinal of each persisted result, each memory equal to its stored result (no turn
    mixes two answers), no duplicate content, pointers never decreased, LLM answers per turn
    ≤ 1 + the faults that held its answer, no dead letter, and a second run does nothing.
    """
    rng = random.Random(chaos_seed)
    print(f"\nCHAOS_SEED={chaos_seed}")
    data = Dataset(sessions=16, turns=6, users=True)
    _import(store, data, "main")
    started = time.monotonic()
    stack = make_stack(ChaosConfig(seed=chaos_seed))
    sampler = PointerSampler(db)
    sampler.start()
    try:
        plan = _plan(rng)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while plan:
            fraction = _progress_fraction(stack, data.total)
            llm_fraction = _llm_fraction(stack, data.total)
            due = [
                (point, kind)
                for point, kind in plan
                if point <= (llm_fraction if kind in LLM_FAULTS else fraction)
            ]
            if due:
                # One fault per look at the progress, the LLM's first: a fault can take
                # seconds (a restart, a drained burst), and an LLM fault fired after the
                # others due with it could find no LLM call left to hit.
                item = min(due, key=lambda d: (d[1] not in LLM_FAULTS, d[0]))
                plan.remove(item)
                _fire(stack, item[1], rng)
            stack.check_alive()
            assert time.monotonic() < deadline, (
                f"seed {chaos_seed}: progress stuck at {fraction:.2f} with faults {plan} left\n"
                + stack.diagnostics()
            )
            time.sleep(0.05)
        wait_until(
            lambda: _drained(stack, data.total),
            timeout=max(10.0, deadline - time.monotonic()),
            interval=0.25,
            tick=stack.check_alive,
            message=lambda: f"seed {chaos_seed}: the backlog did not drain\n{stack.diagnostics()}",
        )
        run_seconds = time.monotonic() - started
        second = _second_run_does_nothing(stack, db)
        state = end_state(
            db,
            store,
            stack.llm_stats(),
            stack.faults,
            redis_dead_letters=stack.dead_letters_in_redis(),
        )
    finally:
        sampler.stop()
    state.violations += sampler.violations
    state.figures["pointer samples"] = f"{sampler.samples} ({sampler.errors} failed)"
    state.figures["duration"] = f"{run_seconds:.1f}s to drain"
    report = _report("faults during a run", chaos_seed, data, stack, state.figures, second)
    print(report)
    assert sampler.samples > 10, "the pointer sampler barely ran"
    assert not state.violations, "\n".join([report, *state.violations])
    assert not stack.proved_nothing(), "\n".join([report, *stack.proved_nothing()])
    assert not stack.unexpected_exits, report


@pytest.mark.timeout(240)
def test_a_redis_crash_with_appendonly_keeps_every_queued_message(
    make_stack: Callable[[ChaosConfig], ChaosStack],
    db: Any,
    store: SessionStore,
    chaos_seed: int,
) -> None:
    """Redis with ``appendonly yes`` (fsync always) crashes (SIGKILL) while the workers are
    down, and comes back on the same port with every message.

    Crash points simulated: SIGKILL of the worker group mid-run (messages in flight stay
    unacked in Redis), then SIGKILL of Redis itself, then a worker restart; the proxy's 503s and
    lost-after-commit responses and the LLM's 429s and garbage run throughout.

    End state: the extract, write and pointer queues hold exactly the messages they held
    before the crash; then every invariant, as in the main run.
    """
    rng = random.Random(chaos_seed + 1)
    print(f"\nCHAOS_SEED={chaos_seed}")
    data = Dataset(sessions=8, turns=5)
    _import(store, data, "aof")
    started = time.monotonic()
    stack = make_stack(ChaosConfig(seed=chaos_seed, appendonly=True))
    sampler = PointerSampler(db)
    sampler.start()
    try:
        point = rng.uniform(0.15, 0.5)
        work = (Queue.EXTRACT.value, Queue.WRITE.value, Queue.POINTER.value)
        for attempt in range(3):
            # Wait for work in Redis, not only for progress: between two scans every queue
            # can be empty, and a crash then would prove nothing.
            wait_until(
                lambda point=point: (
                    _progress_fraction(stack, data.total) >= point
                    and sum(stack.queue_sizes(work).values()) > 0
                ),
                timeout=60,
                interval=0.05,
                tick=stack.check_alive,
                message=lambda: f"seed {chaos_seed}: no progress\n{stack.diagnostics()}",
            )
            stack.stop_workers()
            before = stack.queue_sizes(work)
            if sum(before.values()) > 0 or attempt == 2:
                break
            # The workers drained the queues between the check and the kill: a later moment.
            stack.start_workers()
            point = min(0.9, _progress_fraction(stack, data.total) + 0.1)
        stack.restart_redis(kill=True, pause=rng.uniform(0.3, 1.0))
        after = stack.queue_sizes(work)
        assert after == before, f"seed {chaos_seed}: queues {before} became {after}"
        stack.start_workers()
        wait_until(
            lambda: _drained(stack, data.total),
            timeout=DRAIN_TIMEOUT_S,
            interval=0.25,
            tick=stack.check_alive,
            message=lambda: f"seed {chaos_seed}: the backlog did not drain\n{stack.diagnostics()}",
        )
        run_seconds = time.monotonic() - started
        second = _second_run_does_nothing(stack, db)
        state = end_state(
            db,
            store,
            stack.llm_stats(),
            stack.faults,
            redis_dead_letters=stack.dead_letters_in_redis(),
        )
    finally:
        sampler.stop()
    state.violations += sampler.violations
    state.figures["queued messages across the Redis crash"] = f"{sum(before.values())} kept"
    state.figures["duration"] = f"{run_seconds:.1f}s to drain"
    report = _report("Redis crash with appendonly", chaos_seed, data, stack, state.figures, second)
    print(report)
    assert sum(before.values()) > 0, "nothing was queued at the crash: the test proved nothing"
    assert not state.violations, "\n".join([report, *state.violations])
    assert not stack.proved_nothing(), "\n".join([report, *stack.proved_nothing()])
    assert not stack.unexpected_exits, report


@pytest.mark.timeout(240)
def test_a_redis_crash_while_the_workers_boot_leaves_every_queue_consumed(
    make_stack: Callable[[ChaosConfig], ChaosStack],
    db: Any,
    store: SessionStore,
    chaos_seed: int,
) -> None:
    """Redis crashes (SIGKILL, no persistence) a moment after the worker group was killed and
    restarted: the new worker processes meet the refused connection in their first polls,
    before they have asked Redis anything.

    Crash points simulated: SIGKILL of the worker group mid-run, a restart, then SIGKILL of
    Redis 0.2-0.6 s later (down 1 s): every consumer thread of both processes recovers from
    the connection error before its first successful command. A consumer thread that dies
    there leaves its queue unconsumed in that process for good (the scheduler's scans pile up
    and the backlog never drains).

    End state: the backlog drains; then every invariant, as in the main run.
    """
    rng = random.Random(chaos_seed + 3)
    print(f"\nCHAOS_SEED={chaos_seed}")
    data = Dataset(sessions=8, turns=5)
    _import(store, data, "boot")
    started = time.monotonic()
    stack = make_stack(ChaosConfig(seed=chaos_seed))
    sampler = PointerSampler(db)
    sampler.start()
    try:
        point = rng.uniform(0.15, 0.4)
        wait_until(
            lambda: _progress_fraction(stack, data.total) >= point,
            timeout=60,
            interval=0.05,
            tick=stack.check_alive,
            message=lambda: f"seed {chaos_seed}: no progress\n{stack.diagnostics()}",
        )
        stack.kill_workers(pause=0.0)
        time.sleep(rng.uniform(0.2, 0.6))
        stack.restart_redis(kill=True, pause=1.0)
        wait_until(
            lambda: _drained(stack, data.total),
            timeout=DRAIN_TIMEOUT_S,
            interval=0.25,
            tick=stack.check_alive,
            message=lambda: f"seed {chaos_seed}: the backlog did not drain\n{stack.diagnostics()}",
        )
        run_seconds = time.monotonic() - started
        second = _second_run_does_nothing(stack, db)
        state = end_state(
            db,
            store,
            stack.llm_stats(),
            stack.faults,
            redis_dead_letters=stack.dead_letters_in_redis(),
        )
    finally:
        sampler.stop()
    state.violations += sampler.violations
    state.figures["duration"] = f"{run_seconds:.1f}s to drain"
    report = _report(
        "Redis crash while the workers boot", chaos_seed, data, stack, state.figures, second
    )
    print(report)
    assert not state.violations, "\n".join([report, *state.violations])
    assert not stack.unexpected_exits, report


@pytest.mark.timeout(240)
def test_a_rejected_turn_blocks_only_its_session_until_replayed(
    make_stack: Callable[[ChaosConfig], ChaosStack],
    db: Any,
    store: SessionStore,
    chaos_seed: int,
) -> None:
    """A turn whose LLM request is rejected (400) dead-letters at once, while workers are
    killed and backends terminated around it; its session's pointer waits below it, every
    other session completes; ``ibex dlq replay --all`` then lets it reach the end.

    Crash points simulated: a permanent LLM error (no retry loop), SIGKILL of the worker group
    and ``pg_terminate_backend`` after the dead letter was mirrored, plus the proxy's and the
    LLM's transient faults throughout.

    End state: exactly one dead letter before the replay (in Postgres and in Redis), the
    failed turn's session pointer at that turn - 1 while every other session is complete
    (invariants 6 and 7); after the replay, none open and every invariant as in the main run.
    """
    rng = random.Random(chaos_seed + 2)
    print(f"\nCHAOS_SEED={chaos_seed}")
    data = Dataset(sessions=8, turns=5)
    _import(store, data, "dlq")
    started = time.monotonic()
    stack = make_stack(ChaosConfig(seed=chaos_seed, llm_fail_rate=0.0))
    stack.llm_control(fail_next=1, fail_status=400)
    sampler = PointerSampler(db)
    sampler.start()
    try:
        wait_until(
            lambda: stack.sql("SELECT count(*) FROM ibex_core.dead_letters")[0][0] >= 1,
            timeout=60,
            interval=0.05,
            tick=stack.check_alive,
            message=lambda: f"seed {chaos_seed}: no dead letter\n{stack.diagnostics()}",
        )
        ((session_id, turn_index, exc_type),) = stack.sql(
            "SELECT session_id::text, turn_index, exception_type FROM ibex_core.dead_letters"
        )
        assert exc_type == "LLMRejectedError"
        if rng.random() < 0.5:
            stack.kill_workers(pause=rng.uniform(0.0, 0.5))
            stack.terminate_backends()
        else:
            stack.terminate_backends()
            stack.kill_workers(pause=rng.uniform(0.0, 0.5))

        def rest_done() -> bool:
            rows = stack.sql(
                "SELECT count(*) FILTER (WHERE state = 'done'),"
                "       count(*) FILTER (WHERE state = 'failed') FROM ibex_core.extraction_turns"
            )
            return (int(rows[0][0]), int(rows[0][1])) == (data.total - 1, 1)

        wait_until(
            rest_done,
            timeout=DRAIN_TIMEOUT_S,
            interval=0.25,
            tick=stack.check_alive,
            message=lambda: (
                f"seed {chaos_seed}: the other turns did not drain\n" + stack.diagnostics()
            ),
        )
        time.sleep(1.5)  # scans keep running: the failed turn must not be sent again
        pointers_now = dict(
            stack.sql("SELECT id::text, last_extracted_turn FROM ibex_core.sessions")
        )
        blocked = pointers_now.pop(session_id)
        assert blocked == turn_index - 1, (
            f"seed {chaos_seed}: session pointer {blocked} with turn {turn_index} failed"
        )
        assert set(pointers_now.values()) == {data.turns}, pointers_now
        assert stack.dead_letters_in_redis() == 1
        state_before = stack.sql(
            "SELECT state::text FROM ibex_core.extraction_turns"
            " WHERE session_id = %s AND turn_index = %s",
            (session_id, turn_index),
        )[0][0]
        assert state_before == "failed"

        replay = _ibex(stack.env, "dlq", "replay", "--all")
        assert replay.returncode == 0, replay.stderr
        wait_until(
            lambda: _drained(stack, data.total),
            timeout=60,
            interval=0.25,
            tick=stack.check_alive,
            message=lambda: f"seed {chaos_seed}: the replay did not finish\n{stack.diagnostics()}",
        )
        run_seconds = time.monotonic() - started
        second = _second_run_does_nothing(stack, db)
        state = end_state(
            db,
            store,
            stack.llm_stats(),
            stack.faults,
            redis_dead_letters=stack.dead_letters_in_redis(),
        )
    finally:
        sampler.stop()
    state.violations += sampler.violations
    state.figures["dead letter"] = (
        f"turn {turn_index} of {session_id[:8]} (LLMRejectedError); its session waited at"
        f" {turn_index - 1} while the other {data.sessions - 1} completed; replayed"
    )
    state.figures["duration"] = f"{run_seconds:.1f}s to drain, replay included"
    report = _report("dead letter and replay", chaos_seed, data, stack, state.figures, second)
    print(report)
    assert not state.violations, "\n".join([report, *state.violations])
    assert not stack.proved_nothing(), "\n".join([report, *stack.proved_nothing()])
    assert not stack.unexpected_exits, report


# -- routine outages: a Postgres restart, a stalled worker, dying web workers ------------------


#: Nothing to wait for but the outage itself: no injected LLM failure, so every turn must cost
#: exactly one LLM request; the claim (60 s) is far longer than any wait the test allows, so a
#: delivery stuck on a claim it cannot take over shows as a long wait, not as a quiet retry.
def _outage_config(seed: int, **overrides: Any) -> ChaosConfig:
    return ChaosConfig(
        seed=seed,
        llm_fail_rate=0.0,
        llm_garbage_rate=0.0,
        claim_seconds=60,
        lease_seconds=20,
        **overrides,
    )


#: The Postgres test's MAX_RETRIES: at 50-500 ms, about 11 s of retrying (7 s at the least),
#: more than two restarts (down 2-3 s each) with the proxy's injected failures on top.
OUTAGE_MAX_RETRIES = 30

#: The longest any session may wait for its pointer's next step once Postgres is back.
MAX_WAIT_AFTER_OUTAGE_S = 15.0


def _drain(stack: ChaosStack, data: Dataset, seed: int, timeout: float = DRAIN_TIMEOUT_S) -> None:
    wait_until(
        lambda: _drained(stack, data.total),
        timeout=timeout,
        interval=0.25,
        tick=stack.check_alive,
        message=lambda: f"seed {seed}: the backlog did not drain\n{stack.diagnostics()}",
    )


def _wait_progress(stack: ChaosStack, data: Dataset, seed: int, point: float) -> None:
    wait_until(
        lambda: _progress_fraction(stack, data.total) >= point,
        timeout=60,
        interval=0.02,
        tick=stack.check_alive,
        message=lambda: f"seed {seed}: no progress to {point:.2f}\n{stack.diagnostics()}",
    )


def _wait_posts(stack: ChaosStack, expected: int, seed: int, point: float) -> None:
    """Until the memory POSTs sent through the fault proxy reach ``point`` of ``expected``
    (retries count: they are POSTs a kill can cut too)."""
    assert stack.proxy is not None
    proxy = stack.proxy
    wait_until(
        lambda: proxy.snapshot().get("requests POST", 0) >= point * expected,
        timeout=60,
        interval=0.005,
        tick=stack.check_alive,
        message=lambda: f"seed {seed}: no POSTs to {point:.2f}\n{stack.diagnostics()}",
    )


def _one_request_per_turn(stats: dict[str, Any], turns: int) -> list[str]:
    """Every turn asked the LLM exactly once (no failure was injected)."""
    per_turn = stats.get("calls_per_turn", {})
    extra = {k: n for k, n in per_turn.items() if n != 1}
    out = []
    if len(per_turn) != turns or extra:
        out.append(
            f"LLM requests: {stats['calls']} for {turns} turns ({len(per_turn)} turns asked);"
            f" turns asked more than once: {len(extra)}"
        )
    return out


@pytest.mark.timeout(240)
def test_postgres_restarted_twice_mid_run_costs_no_llm_call_and_no_long_wait(
    make_stack: Callable[..., ChaosStack],
    private_postgres: PrivatePostgres,
    chaos_seed: int,
) -> None:
    """Postgres (a server of this test alone) restarted twice mid-run with a fast shutdown,
    down 1.5-2.5 s each time: every backend ends, the transactions in flight roll back, every
    pooled connection of the workers, the memory service and the scheduler is dead.

    The second restart is fired once a third of the sessions, imported after the first
    restart, are under way: the work left after the first outage may drain within a second.

    Crash points simulated: the server going away at a moment when worker or memory-service
    backends are inside a transaction (checked; the restart is fired again when it caught
    none): an LLM answer in hand whose persist fails, a slot or pointer transaction cut, a
    memory-service write cut (503), connections left dead in every pool.

    End state: every invariant as in the main run; exactly one LLM request per turn (1.00);
    no session waited more than 15 s for its pointer's next step after Postgres was back
    (from the pointer timeline); no process exited.

    The workers' retry budget is raised for this test (``OUTAGE_MAX_RETRIES``): what the
    system promises is to ride out an outage shorter than its retry budget (a message that
    exhausts ``MAX_RETRIES`` during a longer one dead-letters, docs/reliability.md). The
    suite's ``MAX_RETRIES`` 12 at 50-500 ms is about 4 s of retrying (2.6 s at the least):
    barely above one restart (down 2-3 s), below two a second apart, and the proxy's 16 % of
    failed writes use up retries too. With the production defaults (20 retries from 1 s up to
    300 s, or 1.25 s each on the memory service's ``Retry-After: 1``) the budget is 25 s or
    more.
    """
    rng = random.Random(chaos_seed + 3)
    print(f"\nCHAOS_SEED={chaos_seed}")
    pg = private_postgres
    db, store = pg.db, pg.store
    assert store is not None
    # Two thirds of the sessions are there from the start; the last third arrives once
    # Postgres is back from the first restart (settled), so the second restart has work in
    # flight to cut however fast the first part drained after the first one.
    data = Dataset(sessions=24, turns=6)
    lines = data.lines("pgrestart")
    early = Dataset(sessions=16, turns=data.turns)
    _import_lines(store, lines[: early.sessions], early.total)
    started = time.monotonic()
    stack = make_stack(_outage_config(chaos_seed, max_retries=OUTAGE_MAX_RETRIES), pg)
    sampler = PointerSampler(db)
    sampler.start()
    try:
        _wait_progress(stack, early, chaos_seed, rng.uniform(0.15, 0.35))
        stack.restart_postgres(pause=rng.uniform(1.5, 2.5))
        pg.settle()
        _import_lines(store, lines[early.sessions :], data.total - early.total)
        _wait_progress(stack, data, chaos_seed, rng.uniform(0.5, 0.6))
        stack.restart_postgres(pause=rng.uniform(1.5, 2.5))
        _drain(stack, data, chaos_seed)
        drained = time.monotonic()
        run_seconds = drained - started
        second = _second_run_does_nothing(stack, db)
        stats = stack.llm_stats()
        state = end_state(
            db, store, stats, stack.faults, redis_dead_letters=stack.dead_letters_in_redis()
        )
    finally:
        sampler.stop()
    state.violations += sampler.violations + _one_request_per_turn(stats, data.total)
    waits = [
        longest_wait(sampler.timeline, sampler.turn_counts, back, drained)[0]
        for _stopped, back in pg.restarts
    ]
    state.figures["longest wait after Postgres was back"] = ", ".join(f"{w:.1f}s" for w in waits)
    if pg.start_failures:
        state.figures["pg_ctl start failed and was tried again"] = pg.start_failures
    state.figures["pointer samples"] = f"{sampler.samples} ({sampler.errors} failed)"
    state.figures["duration"] = f"{run_seconds:.1f}s to drain"
    report = _report("Postgres restarted twice", chaos_seed, data, stack, state.figures, second)
    print(report)
    assert len(pg.restarts) >= 2
    assert not state.violations, "\n".join([report, *state.violations])
    assert max(waits) <= MAX_WAIT_AFTER_OUTAGE_S, report
    assert not stack.proved_nothing(), "\n".join([report, *stack.proved_nothing()])
    assert not stack.unexpected_exits, report


#: How long the worker process stays stopped: well past the broker's heartbeat timeout.
STALL_SECONDS = 45.0


@pytest.mark.timeout(300)
def test_a_worker_stalled_past_the_heartbeat_timeout_costs_no_llm_call(
    make_stack: Callable[..., ChaosStack],
    db: Any,
    store: SessionStore,
    chaos_seed: int,
) -> None:
    """One worker process (not its group) SIGSTOPped for 45 s, past the broker's heartbeat
    timeout (``HEARTBEAT_TIMEOUT_MS``, 30 s), while it holds messages (checked; the other
    process is stopped instead when it held none), then SIGCONT.

    Crash points simulated: a process frozen wherever its threads are (an LLM call in flight
    with the claim held, a transaction open, a POST half sent), its messages redelivered
    elsewhere (by the scan's lease, then by the broker once the heartbeat is stale) while it is
    frozen, and the frozen process finishing its work when it resumes.

    End state: every invariant as in the main run (no duplicate, no mixed turn: the resumed
    process and the redeliveries write the same slots once); exactly one LLM request per turn
    (the live claim, 60 s, outlasts the stall); the report gives the recovery time.
    """
    rng = random.Random(chaos_seed + 4)
    print(f"\nCHAOS_SEED={chaos_seed}")
    data = Dataset(sessions=16, turns=6)
    _import(store, data, "stall")
    started = time.monotonic()
    stack = make_stack(_outage_config(chaos_seed))
    sampler = PointerSampler(db)
    sampler.start()
    try:
        _wait_progress(stack, data, chaos_seed, rng.uniform(0.1, 0.25))
        stall = stack.stall_worker(STALL_SECONDS)
        _drain(stack, data, chaos_seed)
        drained = time.monotonic()
        run_seconds = drained - started
        second = _second_run_does_nothing(stack, db)
        stats = stack.llm_stats()
        state = end_state(
            db, store, stats, stack.faults, redis_dead_letters=stack.dead_letters_in_redis()
        )
    finally:
        sampler.stop()
    state.violations += sampler.violations + _one_request_per_turn(stats, data.total)
    during, _ = longest_wait(sampler.timeline, sampler.turn_counts, stall.stopped, drained)
    after, _ = longest_wait(sampler.timeline, sampler.turn_counts, stall.resumed, drained)
    state.figures["recovery"] = (
        f"longest wait of a session from the SIGSTOP {during:.1f}s"
        f" (stopped {stall.resumed - stall.stopped:.1f}s); after the SIGCONT {after:.1f}s;"
        f" drained {drained - stall.resumed:.1f}s after the SIGCONT"
    )
    state.figures["pointer samples"] = f"{sampler.samples} ({sampler.errors} failed)"
    state.figures["duration"] = f"{run_seconds:.1f}s to drain"
    report = _report("a worker stalled", chaos_seed, data, stack, state.figures, second)
    print(report)
    assert not state.violations, "\n".join([report, *state.violations])
    assert after <= MAX_WAIT_AFTER_OUTAGE_S, report
    assert not stack.proved_nothing(), "\n".join([report, *stack.proved_nothing()])
    assert not stack.unexpected_exits, report


@pytest.mark.timeout(240)
def test_web_workers_killed_mid_request_lose_and_duplicate_nothing(
    make_stack: Callable[..., ChaosStack],
    db: Any,
    store: SessionStore,
    chaos_seed: int,
) -> None:
    """Gunicorn's worker processes (not the master) SIGKILLed three times while POSTs are in
    flight through the proxy (checked: the kill is fired again when it cut none); the master
    starts new ones.

    Crash points simulated: a memory-service worker dying with requests in flight: before the
    write, mid-transaction, after the commit but before the answer (the client sees a lost
    connection, a 502 from the proxy, and retries with the same key); requests waiting in the
    listen backlog while the new workers start. The proxy injects nothing else, so every
    upstream failure it counts is a kill's.

    End state: every invariant as in the main run: 0 duplicates, 0 lost (every slot of every
    stored result has exactly one memory), no idempotency conflict, one LLM request per turn.
    """
    rng = random.Random(chaos_seed + 5)
    print(f"\nCHAOS_SEED={chaos_seed}")
    data = Dataset(sessions=16, turns=6)
    _import(store, data, "webkill")
    started = time.monotonic()
    stack = make_stack(_outage_config(chaos_seed, reject_rate=0.0, drop_rate=0.0))
    sampler = PointerSampler(db)
    sampler.start()
    try:
        # The kills land at shares of the POSTs the run makes, not of its turns' progress: a
        # turn's last steps (its slot records, the pointer) can trail its POSTs by seconds on a
        # busy machine, and a kill timed by them found no POST left to cut.
        points = (rng.uniform(0.1, 0.3), rng.uniform(0.35, 0.55), rng.uniform(0.6, 0.8))
        for point in points:
            _wait_posts(stack, data.total * stack.config.memories, chaos_seed, point)
            stack.kill_web_workers()
        _drain(stack, data, chaos_seed)
        run_seconds = time.monotonic() - started
        second = _second_run_does_nothing(stack, db)
        stats = stack.llm_stats()
        state = end_state(
            db, store, stats, stack.faults, redis_dead_letters=stack.dead_letters_in_redis()
        )
    finally:
        sampler.stop()
    state.violations += sampler.violations + _one_request_per_turn(stats, data.total)
    state.figures["pointer samples"] = f"{sampler.samples} ({sampler.errors} failed)"
    state.figures["duration"] = f"{run_seconds:.1f}s to drain"
    report = _report("web workers killed", chaos_seed, data, stack, state.figures, second)
    print(report)
    assert not state.violations, "\n".join([report, *state.violations])
    assert not stack.proved_nothing(), "\n".join([report, *stack.proved_nothing()])
    assert not stack.unexpected_exits, report
