"""The pipeline benchmark (the performance targets): the real stack against ``ibex extract``.

``python -m bench.pipeline [--scenario NAME ...] [--json | --markdown | --summary]``

For each scenario, on one freshly generated data set, in one run:

1. the sessions are imported through :func:`sessions.importer.import_lines` (the ``ibex import``
   code path) into a freshly created and migrated benchmark database;
2. **pipeline**: real ``dramatiq actors`` worker processes (``--processes P --threads T``), the
   memory service under gunicorn, the fake OpenAI-compatible LLM (``bench.fake_llm``) as
   subprocesses, Redis and Postgres; ``ibex scan`` sends the work and the benchmark waits until
   every session's pointer reaches its turn count;
3. the extraction state, memories and Redis keys are reset (sessions kept), and
   **baseline**: ``ibex extract`` runs the same stage functions inline, one thread, against the
   same memory service and LLM (capped in time; its rate is measured over the turns it did);
   in the ``seeds`` scenarios the baseline is instead the seeds' design: one
   ``ibex extract --session ID`` process per session, all started at once, and the figure is
   the ratio of the two wall times, each from its start to every session's pointer complete.

What is measured (see docs/benchmarks.md for the exact definitions):

- window: from the first ``extraction_turns.created_at`` (the scan's transaction that
  recorded and leased the turns, just before their messages are sent) to the last ``done_at``
  (the transaction that marked a turn done and moved the pointer); both are Postgres ``now()``;
- turns/s and memories/s over that window;
- turn latency: ``done_at - created_at`` per turn, and "to pointer": the time the session's
  pointer passed the turn (the latest ``done_at`` of turns 1..t of its session) minus
  ``created_at``;
- LLM calls per turn from ``extraction_turns.llm_calls`` and from the fake LLM's own counter;
- SQL statements per turn: ``LOG:  statement:`` lines of the Postgres server log with
  ``log_statement = 'all'`` set on the benchmark database only (every BEGIN, SET LOCAL ROLE,
  set_config, query and COMMIT a client sends), split into the memory service and the rest;
- Redis commands per turn: the delta of the server-wide ``INFO commandstats`` call counts;
- HTTP requests per memory: gunicorn access log lines (``POST /v1/memories``) per memory;
- CPU seconds per turn: user + system time of the worker and gunicorn process trees, the
  Postgres backends of the benchmark database and the ``ibex scan`` / ``ibex extract``
  process(es), plus the Redis server's CPU delta; the fake LLM's CPU is reported apart;
- wall time: from just before the ``ibex scan`` (or the ``ibex extract`` processes) starts to
  the moment the benchmark's 0.1 s poll sees every session's pointer at its turn count.

The document ends with ``summary``: the performance targets as measure / value / target,
each from the scenario that measures it (``--summary`` prints that table alone).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import psycopg2.extensions
import redis

from bench import BenchError
from bench.dbadmin import (
    DEFAULT_DATABASE_URL,
    PIPELINE_TABLES,
    SESSION_TABLES,
    StatementLog,
    admin_connection,
    backend_applications,
    create_service_token,
    database_name,
    recreate_database,
    rows,
    scalar,
    truncate,
)
from bench.report import (
    cell,
    dumps,
    load_average,
    machine,
    markdown_table,
    percentile,
    table,
)
from bench.sampling import (
    CpuSampler,
    count_access_log,
    file_size,
    finish_py_spy,
    redis_counters,
    start_py_spy,
)
from bench.stack import (
    DEFAULT_REDIS_URL,
    check,
    child_env,
    ibex,
    llm_control,
    start_fake_embeddings,
    start_fake_llm,
    start_memory_service,
    start_private_redis,
    start_trace_sink,
    start_workers,
    terminate_on_sigterm,
    wait_log,
)
from cli.stack.processes import ROOT, Launcher, Process

READY = "Worker process is ready for action."


@dataclass(frozen=True)
class Scenario:
    name: str
    sessions: int
    turns: int  # per session
    latency_ms: float = 0
    memories: int = 3
    processes: int = 2
    threads: int = 8
    baseline_sessions: int | None = None  # ibex extract runs on the first N sessions (None: all)
    baseline_cap_s: float = 40.0  # ibex extract is stopped after this long
    timeout_s: float = 90.0  # the pipeline must drain within this long
    orgs: int = 4
    agents_per_org: int = 2
    #: What the pipeline is compared with: "extract" (one ``ibex extract`` over the sessions,
    #: sequential) or "seeds" (one ``ibex extract --session ID`` per session, all at once).
    compare: str = "extract"

    @property
    def total_turns(self) -> int:
        return self.sessions * self.turns

    @property
    def concurrency(self) -> int:
        return self.processes * self.threads


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("overhead", sessions=150, turns=8, latency_ms=0, baseline_sessions=50),
        Scenario("llm-bound", sessions=150, turns=8, latency_ms=200, baseline_sessions=10),
        # C/L = 16 turns/s: what the pipeline reaches when the CPU is not the limit.
        Scenario("llm-slow", sessions=40, turns=8, latency_ms=1000, baseline_sessions=3),
        Scenario("long", sessions=4, turns=50, latency_ms=0),
        Scenario("short", sessions=200, turns=4, latency_ms=0, baseline_sessions=100),
        # The seeds' design: a worker per session taking its turns in order, 4 at once. The
        # sequential ibex extract would only repeat one of them four times over: left out.
        Scenario(
            "seeds", sessions=4, turns=50, latency_ms=200, compare="seeds", baseline_cap_s=120
        ),
        # For the smoke test: seconds, not minutes.
        Scenario(
            "tiny",
            sessions=5,
            turns=2,
            latency_ms=0,
            processes=1,
            threads=4,
            baseline_cap_s=20,
            timeout_s=30,
            orgs=2,
            agents_per_org=1,
        ),
        Scenario(
            "seeds-tiny",
            sessions=2,
            turns=3,
            latency_ms=0,
            processes=1,
            threads=4,
            baseline_cap_s=30,
            timeout_s=30,
            orgs=2,
            agents_per_org=1,
            compare="seeds",
        ),
    )
}
DEFAULT_SCENARIOS = ("overhead", "llm-bound", "llm-slow", "long", "short", "seeds")


# -- data ------------------------------------------------------------------------------------


def session_lines(scenario: Scenario) -> Iterator[str]:
    """The scenario's sessions as ``ibex import`` JSON Lines. Every turn's user text is unique
    (it leads with the session and turn number), so no two memories of an agent collide."""
    for n in range(scenario.sessions):
        org = n % scenario.orgs
        agent = (n // scenario.orgs) % scenario.agents_per_org
        turns = [
            {
                "messages": [
                    {
                        "role": "user",
                        "content": f"S{n}T{t}: I'm user {n}, I live in city {t} and I like tea.",
                    }
                ],
                "completion": {"role": "assistant", "content": f"Noted, user {n} (turn {t})."},
                "prompt_tokens": 20,
                "completion_tokens": 8,
                "latency_ms": 500,
            }
            for t in range(1, scenario.turns + 1)
        ]
        yield json.dumps(
            {
                "org": f"bench-org-{org}",
                "agent": f"agent-{agent}",
                "session": f"{scenario.name}-{n}",
                "status": "completed",
                "model": "gpt-4o-mini",
                "provider": "openai",
                "turns": turns,
            }
        )


def import_sessions(url: str, scenario: Scenario) -> float:
    """Import the scenario's sessions with the ``ibex import`` code path; returns seconds."""
    from core.db import make_database
    from models import bind
    from sessions.importer import import_lines
    from sessions.store import SessionStore

    db = bind(make_database(url))
    started = time.monotonic()
    try:
        report = import_lines(SessionStore(db), session_lines(scenario))
    finally:
        db.close()
    if report.errors or report.turns_added != scenario.total_turns:
        raise BenchError(f"import failed: {report.summary()}: {report.errors[:3]}")
    return time.monotonic() - started


# -- one measured run ------------------------------------------------------------------------


@dataclass
class Stack:
    """What stays up across scenarios: the memory service and the fake LLM."""

    url: str
    database: str
    redis_url: str
    redis: redis.Redis
    admin: psycopg2.extensions.connection
    children: Launcher
    memory_url: str
    memory_child: Process
    #: None with ``--no-access-log``: the web runs without one (no HTTP request counts).
    access_log: Path | None
    llm_url: str
    llm_child: Process
    token: str
    statements: StatementLog
    profile_seconds: float = 0.0
    #: ``fake``: the fake OpenAI-compatible endpoint (requests counted), ``local``, ``none``.
    embeddings: str = "fake"
    embeddings_url: str | None = None
    embeddings_child: Process | None = None
    #: ``--tracing``: the web and the workers export their spans to this local sink.
    trace_sink_url: str | None = None
    trace_sink_child: Process | None = None

    def fakes(self) -> dict[str, Sequence[int]]:
        """The fake servers' process trees: their CPU is reported apart."""
        out: dict[str, Sequence[int]] = {"fake_llm": [self.llm_child.pid]}
        if self.embeddings_child is not None:
            out["fake_embeddings"] = [self.embeddings_child.pid]
        if self.trace_sink_child is not None:
            out["fake_trace_sink"] = [self.trace_sink_child.pid]
        return out

    def trace_spans(self) -> dict[str, Any] | None:
        """The spans the sink has received so far, their mean duration per span name, and each
        request's time outside the server's handler (None: tracing off)."""
        if self.trace_sink_url is None:
            return None
        stats = httpx.get(f"{self.trace_sink_url}/stats", timeout=10).json()
        return {"spans": int(stats["spans"]), "by_name": stats["by_name"], "gaps": stats["gaps"]}

    def embeddings_stats(self, reset: bool = False) -> dict[str, Any] | None:
        """The fake endpoint's request and text counts (cleared with ``reset``); None: not
        the fake endpoint."""
        if self.embeddings_url is None:
            return None
        if reset:
            return dict(httpx.post(f"{self.embeddings_url}/reset", timeout=10).json())
        return dict(httpx.get(f"{self.embeddings_url}/stats", timeout=10).json())

    def worker_env(self, scenario: Scenario) -> dict[str, str]:
        return child_env(
            {
                **embeddings_env(self.embeddings, self.embeddings_url),
                **tracing_env(self.trace_sink_url),
                "DATABASE_URL": self.url,
                "REDIS_URL": self.redis_url,
                "MEMORY_SERVICE_URL": self.memory_url,
                "MEMORY_SERVICE_TOKEN": self.token,
                "LLM_PROVIDER": "openai",
                "LLM_BASE_URL": self.llm_url,
                "LLM_TIMEOUT_SECONDS": "30",
                "HTTP_TIMEOUT_SECONDS": "30",
                "RETRY_MIN_BACKOFF_MS": "100",
                "RETRY_MAX_BACKOFF_MS": "2000",
                "SCAN_MAX_TURNS_PER_AGENT": "1000000",
                "WORKER_PROCESSES": str(scenario.processes),
                "WORKER_THREADS": str(scenario.threads),
            }
        )


#: The fake endpoint's model and dimension (the local model's dimension, so the HNSW index
#: that migration 000016 makes serves where pgvector is installed).
FAKE_EMBEDDINGS_MODEL = "fake-256"
FAKE_EMBEDDINGS_DIMENSION = 256


def tracing_env(sink_url: str | None) -> dict[str, str]:
    """Traces on, exported over OTLP/HTTP to the local sink, in batches of the SDK's default
    size at least every second (its default: 5 s), so that a run's spans are exported, and
    their CPU counted, within the run; nothing without a sink."""
    if not sink_url:
        return {}
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink_url, "OTEL_BSP_SCHEDULE_DELAY": "1000"}


def embeddings_env(mode: str, url: str | None) -> dict[str, str]:
    """The EMBEDDINGS_* settings of the workers, ``ibex extract`` and the memory service."""
    if mode == "fake" and url is not None:
        return {
            "EMBEDDINGS_PROVIDER": "openai",
            "EMBEDDINGS_BASE_URL": url,
            "EMBEDDINGS_MODEL": FAKE_EMBEDDINGS_MODEL,
            "EMBEDDINGS_DIMENSION": str(FAKE_EMBEDDINGS_DIMENSION),
        }
    return {"EMBEDDINGS_PROVIDER": mode}


def _reset_extraction(stack: Stack) -> None:
    """Forget every extraction: the sessions stay, their pointers go back to 0."""
    truncate(stack.admin, PIPELINE_TABLES)
    with stack.admin.cursor() as cur:
        # The pointer never moves backwards (a trigger enforces it); replica mode skips
        # triggers for this one administrative rewind.
        cur.execute("SET session_replication_role = replica")
        cur.execute("UPDATE ibex_core.sessions SET last_extracted_turn = 0")
        cur.execute("RESET session_replication_role")
    _analyze_loaded(stack)
    stack.redis.flushdb()


def _analyze_loaded(stack: Stack) -> None:
    """``VACUUM ANALYZE`` the tables the scenario loaded (sessions, turns, agents, orgs), not
    the pipeline's, which are empty here. Statistics taken of an empty table say it holds no
    rows, and every plan made with them is a scan of the whole table (costed at nothing),
    kept for the whole run as the table fills: on a server without autovacuum (the
    benchmark machines' servers run with it off) nothing analyzes the table again. Left without
    statistics, as after a ``TRUNCATE`` or on a new deployment, the planner assumes a table of
    some pages and reads the indexes."""
    with stack.admin.cursor() as cur:
        cur.execute("VACUUM ANALYZE " + ", ".join(SESSION_TABLES))


def _progress(admin: psycopg2.extensions.connection) -> tuple[int, int, int]:
    """(sessions complete, sessions, failed turns)."""
    done, total = rows(
        admin,
        "SELECT count(*) FILTER (WHERE last_extracted_turn >= turn_count), count(*)"
        " FROM ibex_core.sessions",
    )[0]
    failed = scalar(admin, "SELECT count(*) FROM ibex_core.extraction_turns WHERE state='failed'")
    return int(done), int(total), int(failed)


class Counters:
    """Everything read before and after a measured run."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.driver_pid = int(scalar(stack.admin, "SELECT pg_backend_pid()"))
        self.sampler = CpuSampler()

    def begin(self, groups: dict[str, Sequence[int]]) -> None:
        s = self.stack
        for name, pids in groups.items():
            self.sampler.add_tree(name, pids)
        self.sampler.add_postgres("postgres", s.database, exclude=[self.driver_pid])
        self.redis0 = redis_counters(s.redis)
        self.access0 = file_size(s.access_log) if s.access_log else 0
        s.statements.mark()
        self.rusage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.sampler.begin()
        self.started = time.monotonic()

    def end(self) -> dict[str, Any]:
        s = self.stack
        elapsed = time.monotonic() - self.started
        cpu = self.sampler.end()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu["command"] = (usage.ru_utime - self.rusage0.ru_utime) + (
            usage.ru_stime - self.rusage0.ru_stime
        )
        redis1 = redis_counters(s.redis)
        cpu["redis"] = redis1["cpu"] - self.redis0["cpu"]
        apps = backend_applications(s.admin, s.database)
        counted = s.statements.count(exclude=[self.driver_pid])
        split: dict[str, int] | None = None
        shapes: dict[str, int] = {}
        if counted is not None:
            by_pid, shape_counts = counted
            split = defaultdict(int)
            for pid, n in by_pid.items():
                split["memory_service" if apps.get(pid) == "ibex-memory" else "extraction"] += n
            shapes = dict(shape_counts.most_common(25))
        before = self.redis0["per_command"]
        per_command = {
            k: v - before.get(k, 0)
            for k, v in redis1["per_command"].items()
            if v > before.get(k, 0)
        }
        return {
            "elapsed": elapsed,
            "cpu": cpu,
            "redis_commands": int(redis1["commands"] - self.redis0["commands"]),
            "redis_per_command": per_command,
            "statements": dict(split) if split is not None else None,
            "statement_shapes": shapes,
            "access": count_access_log(s.access_log, self.access0) if s.access_log else None,
        }


def _collect(
    admin: psycopg2.extensions.connection,
    counters: dict[str, Any],
    llm: dict[str, Any],
    embeddings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    turn_rows = rows(
        admin,
        "SELECT session_id, turn_index, state::text, llm_calls,"
        "       EXTRACT(EPOCH FROM created_at)::float8, EXTRACT(EPOCH FROM done_at)::float8"
        "  FROM ibex_core.extraction_turns ORDER BY session_id, turn_index",
    )
    done = [r for r in turn_rows if r[2] == "done"]
    memories = int(
        scalar(
            admin,
            "SELECT count(*) FROM ibex_memory.memories m JOIN ibex_core.extraction_turns e"
            " ON e.session_id = m.session_id AND e.turn_index = m.turn_index"
            " WHERE e.state = 'done'",
        )
    )
    pointer_turns = int(
        scalar(admin, "SELECT coalesce(sum(last_extracted_turn), 0) FROM ibex_core.sessions")
    )
    to_done = [(r[5] - r[4]) * 1000 for r in done]
    # The pointer passes turn t when every turn 1..t of the session is done.
    to_pointer: list[float] = []
    reached: dict[Any, float] = {}
    for sid, _ti, state, _calls, created, done_at in turn_rows:
        if state != "done":
            reached[sid] = float("inf")
            continue
        reached[sid] = max(reached.get(sid, 0.0), done_at)
        if reached[sid] != float("inf"):
            to_pointer.append((reached[sid] - created) * 1000)
    n = len(done)
    window = (max(r[5] for r in done) - min(r[4] for r in turn_rows)) if done else 0.0
    statements = counters["statements"]
    access = counters["access"]
    posts = (
        None
        if access is None
        else sum(v for k, v in access.items() if k.startswith("POST /v1/memories "))
    )
    requests = None if access is None else sum(access.values())
    cpu = counters["cpu"]
    system_cpu = sum(v for k, v in cpu.items() if not k.startswith("fake_"))

    def per_turn(x: float | None) -> float | None:
        return None if x is None or not n else x / n

    return {
        "turns": len(turn_rows),
        "turns_done": n,
        "turns_failed": sum(1 for r in turn_rows if r[2] == "failed"),
        "pointer_turns": pointer_turns,
        "memories": memories,
        "window_s": round(window, 3),
        "turns_per_s": round(n / window, 2) if window else None,
        "memories_per_s": round(memories / window, 2) if window else None,
        "latency_ms": {
            "done_p50": _r(percentile(to_done, 50)),
            "done_p95": _r(percentile(to_done, 95)),
            "pointer_p50": _r(percentile(to_pointer, 50)),
            "pointer_p95": _r(percentile(to_pointer, 95)),
        },
        "llm_calls_per_turn": round(sum(r[3] for r in done) / n, 3) if n else None,
        "llm_requests": int(llm.get("calls", 0)),
        "llm_requests_per_turn": round(llm.get("calls", 0) / n, 3) if n else None,
        "llm_max_calls_per_turn": int(llm.get("max_calls_per_turn", 0)),
        # The embeddings endpoint's own count (None: not the fake endpoint).
        "embedding_requests": None if embeddings is None else int(embeddings["requests"]),
        "embedding_requests_per_turn": (
            round(embeddings["requests"] / n, 3) if embeddings is not None and n else None
        ),
        "embedding_texts_per_turn": (
            round(embeddings["texts"] / n, 3) if embeddings is not None and n else None
        ),
        "sql_statements_per_turn": (
            None
            if statements is None
            else {
                k: _r(per_turn(v))
                for k, v in {**statements, "total": sum(statements.values())}.items()
            }
        ),
        "sql_top_statements_per_turn": {
            k: _r(per_turn(v)) for k, v in counters["statement_shapes"].items()
        },
        "redis_commands_per_turn": _r(per_turn(counters["redis_commands"])),
        "redis_commands_per_turn_by_command": {
            k: _r(per_turn(v))
            for k, v in sorted(counters["redis_per_command"].items(), key=lambda kv: -kv[1])
        },
        "http_requests_per_memory": (
            round(posts / memories, 3) if memories and posts is not None else None
        ),
        "http_requests": None if access is None else dict(sorted(access.items())),
        "http_requests_total": requests,
        "cpu_s_per_turn": {k: _r(per_turn(v), 5) for k, v in {**cpu, "total": system_cpu}.items()},
        "cpu_s": {k: round(v, 3) for k, v in {**cpu, "total": system_cpu}.items()},
    }


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def run_pipeline(stack: Stack, scenario: Scenario) -> dict[str, Any]:
    env = stack.worker_env(scenario)
    llm_control(stack.llm_url, "/reset")
    stack.embeddings_stats(reset=True)
    workers = start_workers(
        stack.children,
        f"workers-{scenario.name}",
        env,
        processes=scenario.processes,
        threads=scenario.threads,
    )
    try:
        wait_log(workers, stack.children, READY, scenario.processes, timeout=60)
        counters = Counters(stack)
        counters.begin({"workers": [workers.pid], "web": [stack.memory_child.pid], **stack.fakes()})
        scan_started = time.monotonic()
        scan = subprocess.run(
            ibex("scan", "--json"),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        scan_seconds = time.monotonic() - scan_started
        if scan.returncode != 0:
            raise BenchError(f"ibex scan failed: {scan.stderr.strip() or scan.stdout.strip()}")
        sent = int(json.loads(scan.stdout)["turns"])
        spies = {}
        if stack.profile_seconds:
            spies = {
                "workers": start_py_spy(stack.children, "workers", workers.pid,
                                        stack.profile_seconds),
                "memory_service": start_py_spy(stack.children, "web", stack.memory_child.pid,
                                               stack.profile_seconds),
            }  # fmt: skip
        deadline = time.monotonic() + scenario.timeout_s
        complete = False
        while time.monotonic() < deadline:
            check(stack.children)
            done, total, failed = _progress(stack.admin)
            if done == total:
                complete = True
                break
            if failed:
                break
            time.sleep(0.1)
        measured = counters.end()
        profiles = {k: finish_py_spy(stack.children, v) for k, v in spies.items()}
    finally:
        stack.children.stop_one(workers)
    result = _collect(
        stack.admin, measured, llm_control(stack.llm_url, "/stats"), stack.embeddings_stats()
    )
    if profiles:
        result["profile"] = profiles
    result.update(
        complete=complete,
        scan_sent=sent,
        scan_command_s=round(scan_seconds, 3),
        wall_s=round(measured["elapsed"], 3),
    )
    return result


def _hold_back(stack: Stack, scenario: Scenario, hold: bool) -> int:
    """Take every session but the baseline's first ``baseline_sessions`` out of (or back into)
    the extraction candidates by flipping their status; returns the baseline's turn count.
    ``ibex extract`` works breadth-first (every extract_turn, then every write_memory, ...), so
    a run stopped part-way has finished no turn at all: it gets a slice it can finish."""
    keep = scenario.baseline_sessions
    if keep is None or keep >= scenario.sessions:
        return scenario.total_turns
    names = [f"{scenario.name}-{n}" for n in range(keep)]
    with stack.admin.cursor() as cur:
        cur.execute(
            "UPDATE ibex_core.sessions SET status = %s WHERE NOT (external_id = ANY(%s))",
            ("active" if hold else "completed", names),
        )
    return keep * scenario.turns


def run_baseline(stack: Stack, scenario: Scenario) -> dict[str, Any]:
    env = stack.worker_env(scenario)
    llm_control(stack.llm_url, "/reset")
    stack.embeddings_stats(reset=True)
    expected = _hold_back(stack, scenario, True)
    counters = Counters(stack)
    counters.begin({"web": [stack.memory_child.pid], **stack.fakes()})
    capped = False
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(
            ibex("extract", "--json"),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=scenario.baseline_cap_s)
        except subprocess.TimeoutExpired:
            capped = True
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        measured = counters.end()
        out.seek(0)
        output = out.read().decode("utf-8", "replace")
    _hold_back(stack, scenario, False)
    if not capped and process.returncode != 0:
        raise BenchError(f"ibex extract failed ({process.returncode}): {output[-2000:]}")
    result = _collect(
        stack.admin, measured, llm_control(stack.llm_url, "/stats"), stack.embeddings_stats()
    )
    result.update(
        complete=not capped and result["turns_done"] == expected,
        sessions=scenario.baseline_sessions or scenario.sessions,
        capped_after_s=scenario.baseline_cap_s if capped else None,
        wall_s=round(measured["elapsed"], 3),
    )
    return result


def _summary_line(output: str) -> dict[str, Any] | None:
    """The JSON summary ``ibex extract --json`` prints last, or None."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                found = json.loads(line)
                return found if isinstance(found, dict) else None
    return None


def run_seeds(stack: Stack, scenario: Scenario) -> dict[str, Any]:
    """The seeds' design on the same data: one ``ibex extract --session ID`` process per
    session, all started at once, each the only worker of its session (it takes that
    session's turns alone, one message at a time: every ``extract_turn``, then every
    ``write_memory``, then every ``advance_pointer``; one LLM call at a time either way, so its
    time to the complete pointer is that of the turns taken in order). Timed like the
    pipeline: from just before the processes start to the poll that sees every session's
    pointer at its turn count; the processes' CPU is counted up to their exit."""
    env = stack.worker_env(scenario)
    llm_control(stack.llm_url, "/reset")
    stack.embeddings_stats(reset=True)
    names = [f"{scenario.name}-{n}" for n in range(scenario.sessions)]
    counters = Counters(stack)
    counters.begin({"web": [stack.memory_child.pid], **stack.fakes()})
    processes: list[subprocess.Popen[bytes]] = []
    complete = capped = False
    with contextlib.ExitStack() as files:
        outs = [files.enter_context(tempfile.TemporaryFile()) for _ in names]
        try:
            for name, out in zip(names, outs, strict=True):
                processes.append(
                    subprocess.Popen(
                        ibex("extract", "--json", "--session", name),
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            deadline = counters.started + scenario.baseline_cap_s
            while True:
                exited = all(p.poll() is not None for p in processes)
                done, total, failed = _progress(stack.admin)
                if done == total:
                    complete = True
                    break
                if failed or exited:
                    break
                if time.monotonic() >= deadline:
                    capped = True
                    break
                time.sleep(0.1)
            wall = time.monotonic() - counters.started
            for process in processes:
                if capped:
                    process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    capped = True
                    process.kill()
                    process.wait()
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        measured = counters.end()
        outputs = []
        for out in outs:
            out.seek(0)
            outputs.append(out.read().decode("utf-8", "replace"))
    if not capped:
        for process, output in zip(processes, outputs, strict=True):
            if process.returncode != 0:
                raise BenchError(
                    f"ibex extract --session failed ({process.returncode}): {output[-2000:]}"
                )
    result = _collect(
        stack.admin, measured, llm_control(stack.llm_url, "/stats"), stack.embeddings_stats()
    )
    summaries = [_summary_line(output) or {} for output in outputs]
    result.update(
        complete=complete and not capped,
        sessions=scenario.sessions,
        command=f"{len(names)} x ibex extract --session ID, in parallel",
        capped_after_s=scenario.baseline_cap_s if capped else None,
        wall_s=round(wall, 3),
        process_seconds=[s.get("seconds") for s in summaries],
    )
    return result


def run_scenario(stack: Stack, scenario: Scenario) -> dict[str, Any]:
    # Truncating the orgs cascades to the API tokens: mint the service token again.
    truncate(stack.admin, PIPELINE_TABLES + SESSION_TABLES)
    stack.redis.flushdb()
    stack.token = create_service_token(stack.url)
    import_s = import_sessions(stack.url, scenario)
    _analyze_loaded(stack)
    load_before = load_average()
    pipeline = run_pipeline(stack, scenario)
    _reset_extraction(stack)
    if scenario.compare == "seeds":
        baseline = run_seeds(stack, scenario)
    else:
        baseline = run_baseline(stack, scenario)
    ratios: dict[str, float | None] = {"pipeline_over_baseline": None}
    if pipeline["turns_per_s"] and baseline["turns_per_s"]:
        ratios["pipeline_over_baseline"] = round(
            pipeline["turns_per_s"] / baseline["turns_per_s"], 2
        )
    cpu_per_turn = (pipeline.get("cpu_s_per_turn") or {}).get("total")
    baseline_cpu_per_turn = (baseline.get("cpu_s_per_turn") or {}).get("total")
    # CPU per turn of the pipeline over that of the inline path, every process counted.
    ratios["cpu_per_turn_pipeline_over_baseline"] = (
        round(cpu_per_turn / baseline_cpu_per_turn, 3)
        if cpu_per_turn and baseline_cpu_per_turn
        else None
    )
    if scenario.compare == "seeds":
        both = pipeline["complete"] and baseline["complete"]
        # Wall time to every pointer complete, seeds' design over pipeline (higher: faster).
        ratios["seeds_over_pipeline_wall"] = (
            round(baseline["wall_s"] / pipeline["wall_s"], 2) if both else None
        )
        ratios["seeds_over_pipeline_window"] = (
            round(baseline["window_s"] / pipeline["window_s"], 2)
            if both and pipeline["window_s"]
            else None
        )
    if cpu_per_turn:
        # What this CPU cost per turn allows if the machine's cores did nothing else.
        ratios["cpu_ceiling_turns_per_s"] = round((os.cpu_count() or 1) / cpu_per_turn, 1)
    if scenario.latency_ms > 0:
        c_over_l = scenario.concurrency / (scenario.latency_ms / 1000)
        ratios["c_over_l_turns_per_s"] = round(c_over_l, 1)
        ratios["pipeline_over_c_over_l"] = (
            round(pipeline["turns_per_s"] / c_over_l, 3) if pipeline["turns_per_s"] else None
        )
    return {
        "scenario": asdict(scenario),
        "import_s": round(import_s, 2),
        "import_method": "sessions.importer.import_lines (the ibex import code path)",
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "pipeline": pipeline,
        "baseline": baseline,
        "ratios": ratios,
        "targets": _targets(scenario, pipeline, ratios),
    }


def _targets(
    scenario: Scenario, pipeline: dict[str, Any], ratios: dict[str, Any]
) -> list[dict[str, Any]]:
    out = []
    if scenario.name == "overhead":
        out.append(
            {
                "target": "zero LLM latency: >= 100 turns/s (3 memories per turn, 2 cores)",
                "value": pipeline["turns_per_s"],
                "met": bool(pipeline["turns_per_s"] and pipeline["turns_per_s"] >= 100),
            }
        )
    # The seeds comparison's 200 turns are too few for a throughput: its figure is the ratio.
    if scenario.latency_ms > 0 and scenario.compare == "extract":
        out.append(
            {
                "target": "LLM-bound: >= 80% of C/L",
                "value": ratios.get("pipeline_over_c_over_l"),
                "met": bool((ratios.get("pipeline_over_c_over_l") or 0) >= 0.8),
            }
        )
    if scenario.compare == "seeds":
        out.append(
            {
                "target": "wall time to every pointer complete: seeds' design / pipeline >= 3",
                "value": ratios.get("seeds_over_pipeline_wall"),
                "met": bool((ratios.get("seeds_over_pipeline_wall") or 0) >= 3),
            }
        )
    return out


def summary(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The performance targets as measure / value / target, each from the scenario that
    measures it (a row is left out when its scenario did not run): throughput over C/L from
    ``llm-bound``; the seeds' design's wall time over the pipeline's from the first ``seeds``
    scenario; CPU per turn pipeline / ``ibex extract``, SQL statements and Redis commands per
    turn (the whole system) from ``overhead``."""
    by_name = {r["scenario"]["name"]: r for r in results}
    out: list[dict[str, Any]] = []

    def add(result: dict[str, Any], measure: str, value: Any, detail: str, target: str,
            met: bool | None) -> None:  # fmt: skip
        out.append(
            {
                "measure": measure,
                "value": value,
                "detail": detail,
                "target": target,
                "met": met if value is not None else None,
                "scenario": result["scenario"]["name"],
            }
        )

    llm = by_name.get("llm-bound")
    if llm is not None:
        s, ratio = llm["scenario"], llm["ratios"].get("pipeline_over_c_over_l")
        add(
            llm,
            f"LLM latency {s['latency_ms']:g} ms, C = {s['processes'] * s['threads']} threads:"
            " throughput / (C/L)",
            ratio,
            f"{llm['pipeline']['turns_per_s']} of {llm['ratios'].get('c_over_l_turns_per_s')}"
            " turns/s",
            ">= 0.80",
            ratio is not None and ratio >= 0.8,
        )
    seeds = next((r for r in results if r["scenario"].get("compare") == "seeds"), None)
    if seeds is not None:
        s, ratio = seeds["scenario"], seeds["ratios"].get("seeds_over_pipeline_wall")
        add(
            seeds,
            f"{s['sessions']} sessions x {s['turns']} turns, L = {s['latency_ms']:g} ms: wall"
            f" time to every pointer complete, seeds' design ({s['sessions']} x `ibex extract"
            " --session` in parallel) / pipeline",
            ratio,
            f"{cell(seeds['baseline']['wall_s'])} s vs {cell(seeds['pipeline']['wall_s'])} s",
            ">= 3x",
            ratio is not None and ratio >= 3,
        )
    overhead = by_name.get("overhead")
    if overhead is not None:
        pipeline, baseline = overhead["pipeline"], overhead["baseline"]
        ratio = overhead["ratios"].get("cpu_per_turn_pipeline_over_baseline")
        add(
            overhead,
            "CPU per turn, pipeline / inline path (`ibex extract`), zero LLM latency",
            ratio,
            f"{_ms(pipeline, 'total')} vs {_ms(baseline, 'total')} ms",
            "<= 1.30x",
            ratio is not None and ratio <= 1.30,
        )
        memories = overhead["scenario"]["memories"]
        sql = _get(pipeline, "sql_statements_per_turn", "total")
        add(
            overhead,
            f"SQL statements per turn, {memories} memories, whole system",
            sql,
            f"{_get(pipeline, 'sql_statements_per_turn', 'memory_service')} of them from the"
            " memory service",
            "<= 15",
            sql is not None and sql <= 15,
        )
        commands = pipeline["redis_commands_per_turn"]
        add(
            overhead,
            f"Redis commands per turn, {memories} memories, whole system",
            commands,
            "",
            "<= 45",
            commands is not None and commands <= 45,
        )
        calls = pipeline["llm_calls_per_turn"]
        add(
            overhead,
            "LLM calls per turn (the turns' own count)",
            calls,
            f"{pipeline['llm_requests_per_turn']} requests per turn at the fake LLM",
            "1.00",
            calls is not None and calls == 1,
        )
        requests = pipeline.get("embedding_requests_per_turn")
        add(
            overhead,
            "embedding requests per turn (the fake endpoint's count)",
            requests,
            f"{pipeline.get('embedding_texts_per_turn')} texts per turn",
            "<= 1.00",
            requests is not None and requests <= 1,
        )
    return out


# -- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def stack_up(args: argparse.Namespace, folder: Path) -> Iterator[Stack]:
    url = args.database_url
    database = database_name(url)
    recreate_database(url)
    token = create_service_token(url)
    admin = admin_connection(url)
    children = Launcher(folder, cwd=ROOT)
    statements = StatementLog(admin, database)
    client: redis.Redis | None = None
    try:
        if args.private_redis:
            args.redis_url = start_private_redis(children)
        client = redis.Redis.from_url(args.redis_url)
        client.flushdb()
        if statements.available and not args.no_sql_log:
            statements.enable()
        else:
            statements.available = False
        access_log = None if args.no_access_log else folder / "access.log"
        embeddings_child = embeddings_url = None
        if args.embeddings == "fake":
            embeddings_child, embeddings_url = start_fake_embeddings(
                children, dimension=FAKE_EMBEDDINGS_DIMENSION
            )
        trace_sink_child = trace_sink_url = None
        if args.tracing:
            trace_sink_child, trace_sink_url = start_trace_sink(children)
        web_env = child_env(
            {
                **tracing_env(trace_sink_url),
                "DATABASE_URL": url,
                "REDIS_URL": args.redis_url,
                "LLM_PROVIDER": "rules",
                **embeddings_env(args.embeddings, embeddings_url),
            }
        )
        memory_child, memory_url = start_memory_service(
            children,
            web_env,
            workers=args.web_workers,
            threads=args.web_threads,
            access_log=access_log,
        )
        llm_child, llm_url = start_fake_llm(children, latency_ms=0, memories=3)
        yield Stack(
            url=url,
            database=database,
            redis_url=args.redis_url,
            redis=client,
            admin=admin,
            children=children,
            memory_url=memory_url,
            memory_child=memory_child,
            access_log=access_log,
            llm_url=llm_url,
            llm_child=llm_child,
            token=token,
            statements=statements,
            profile_seconds=args.profile_seconds if args.profile else 0.0,
            embeddings=args.embeddings,
            embeddings_url=embeddings_url,
            embeddings_child=embeddings_child,
            trace_sink_url=trace_sink_url,
            trace_sink_child=trace_sink_child,
        )
    finally:
        children.stop()
        with contextlib.suppress(Exception):
            statements.disable()
        admin.close()
        if client is not None:
            client.close()


def warm_up(stack: Stack, args: argparse.Namespace) -> float:
    """One run of a small scenario before the measured ones, its figures dropped: the web's
    threads, their Postgres backends (catalog caches, compiled functions, prepared
    statements), the fakes' connections and the processes' first imports are then warm for
    the first scenario's pipeline as they already are for its baseline, which runs after it on
    the same services. Returns its wall time in seconds."""
    started = time.monotonic()
    # Enough sessions that every web thread serves writes at once (3 per session).
    sessions = max(args.web_workers * args.web_threads, 2)
    scenario = Scenario(
        "warm-up", sessions=sessions, turns=1, baseline_sessions=1, orgs=2, agents_per_org=1
    )
    llm_control(stack.llm_url, "/control", {"latency_ms": 0, "memories": scenario.memories})
    run_scenario(stack, scenario)
    return round(time.monotonic() - started, 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    scenarios = [_override(SCENARIOS[name], args) for name in args.scenario]
    folder = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="ibex-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = []
    with terminate_on_sigterm(), stack_up(args, folder) as stack:
        info = machine(stack.admin, stack.redis)
        warm_up_s = None if args.no_warm_up or args.tracing else warm_up(stack, args)
        for scenario in scenarios:
            llm_control(
                stack.llm_url,
                "/control",
                {"latency_ms": scenario.latency_ms, "memories": scenario.memories},
            )
            results.append(run_scenario(stack, scenario))
        sql_counting = stack.statements.available
        trace_spans = stack.trace_spans()
    return {
        "benchmark": "pipeline",
        "machine": info,
        "settings": {
            "database": database_name(args.database_url),
            "redis_url": args.redis_url,
            "redis_private": args.private_redis,
            "warm_up_s": warm_up_s,
            "web_workers": args.web_workers,
            "web_threads": args.web_threads,
            "embeddings": args.embeddings,
            "tracing": args.tracing,
            # Received by the sink by the end (the last batches of a run may still be queued).
            "trace_spans": trace_spans,
            "sql_statement_log": sql_counting,
            "logs": str(folder),
        },
        "scenarios": results,
        "summary": summary(results),
        "seconds": round(time.monotonic() - started, 1),
    }


def _override(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    changes = {
        name: getattr(args, name)
        for name in ("sessions", "turns", "latency_ms", "memories", "processes", "threads")
        if getattr(args, name) is not None
    }
    if args.baseline_cap is not None:
        changes["baseline_cap_s"] = args.baseline_cap
    return replace(scenario, **changes)


def _get(result: dict[str, Any], group: str, key: str) -> Any:
    return (result.get(group) or {}).get(key)


def _ms(result: dict[str, Any], *keys: str) -> float | None:
    """CPU milliseconds per turn of these process groups."""
    values = [_get(result, "cpu_s_per_turn", k) for k in keys]
    present = [v for v in values if v is not None]
    return round(1000 * sum(present), 2) if present else None


METRICS: list[tuple[str, Any]] = [
    ("turns done", lambda r: f"{r['turns_done']}/{r['turns']}"),
    ("turns/s", lambda r: r["turns_per_s"]),
    ("memories/s", lambda r: r["memories_per_s"]),
    ("latency to done p50 ms", lambda r: r["latency_ms"]["done_p50"]),
    ("latency to done p95 ms", lambda r: r["latency_ms"]["done_p95"]),
    ("latency to pointer p50 ms", lambda r: r["latency_ms"]["pointer_p50"]),
    ("latency to pointer p95 ms", lambda r: r["latency_ms"]["pointer_p95"]),
    ("LLM calls/turn (db)", lambda r: r["llm_calls_per_turn"]),
    ("LLM requests/turn (fake LLM)", lambda r: r["llm_requests_per_turn"]),
    ("SQL statements/turn", lambda r: _get(r, "sql_statements_per_turn", "total")),
    ("  of which memory service", lambda r: _get(r, "sql_statements_per_turn", "memory_service")),
    ("Redis commands/turn", lambda r: r["redis_commands_per_turn"]),
    ("HTTP requests/memory", lambda r: r["http_requests_per_memory"]),
    ("CPU ms/turn (total)", lambda r: _ms(r, "total")),
    # Every process group of the JSON's cpu_s_per_turn but the fake LLM's.
    ("  workers (dramatiq)", lambda r: _ms(r, "workers")),
    ("  ibex scan / ibex extract", lambda r: _ms(r, "command")),
    ("  memory service (gunicorn)", lambda r: _ms(r, "web")),
    ("  postgres", lambda r: _ms(r, "postgres")),
    ("  redis", lambda r: _ms(r, "redis")),
    ("window s", lambda r: r["window_s"]),
    ("wall s (start to every pointer complete)", lambda r: r.get("wall_s")),
]


def _baseline_label(result: dict[str, Any]) -> str:
    s = result["scenario"]
    if s.get("compare") == "seeds":
        return f"seeds' design ({s['sessions']} x ibex extract --session)"
    return "baseline (ibex extract)"


def render_markdown(document: dict[str, Any]) -> str:
    """Every scenario side by side, pipeline | baseline, as Markdown (docs/benchmarks.md)."""
    results = document["scenarios"]
    header = ["metric"]
    for r in results:
        seeds = r["scenario"].get("compare") == "seeds"
        header += [f"{r['scenario']['name']} pipeline", "seeds' design" if seeds else "baseline"]
    body = []
    for name, get in METRICS:
        row: list[Any] = [name.strip()]
        for r in results:
            row += [get(r["pipeline"]), get(r["baseline"])]
        body.append(row)

    def per_scenario(label: str, get: Any) -> list[Any]:
        row: list[Any] = [label]
        for r in results:
            row += [get(r), ""]
        return row

    ratio_rows = [
        per_scenario("pipeline / baseline", lambda r: r["ratios"].get("pipeline_over_baseline")),
        per_scenario("pipeline / (C/L)", lambda r: r["ratios"].get("pipeline_over_c_over_l")),
        per_scenario(
            "CPU per turn, pipeline / baseline",
            lambda r: r["ratios"].get("cpu_per_turn_pipeline_over_baseline"),
        ),
        per_scenario(
            "wall to every pointer complete, seeds' design / pipeline",
            lambda r: r["ratios"].get("seeds_over_pipeline_wall"),
        ),
        per_scenario(
            "CPU ceiling turns/s (cores / CPU per turn)",
            lambda r: r["ratios"].get("cpu_ceiling_turns_per_s"),
        ),
        per_scenario(
            "load average (1 min) before / after",
            lambda r: f"{r['load_average_before'][0]} / {r['load_average_after'][0]}",
        ),
    ]
    big = markdown_table(header, body + ratio_rows)
    if not document["summary"]:
        return big
    return f"{big}\n\n{render_summary(document)}"


def render_summary(document: dict[str, Any]) -> str:
    """The targets table (``summary``) as Markdown: measure, value, target, verdict."""
    body = []
    for row in document["summary"]:
        value = cell(row["value"])
        if row["detail"]:
            value = f"{value} ({row['detail']})"
        verdict = {True: "met", False: "missed", None: "-"}[row["met"]]
        body.append([row["measure"], value, row["target"], verdict, row["scenario"]])
    return markdown_table(["measure", "value", "target", "verdict", "scenario"], body)


def render(document: dict[str, Any]) -> str:
    m = document["machine"]
    out = [
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gb']} GB, Postgres"
        f" {m['postgres']}, Redis {m['redis']}, Python {m['python']}",
    ]
    for result in document["scenarios"]:
        s = result["scenario"]
        out.append("")
        out.append(
            f"== {s['name']}: {s['sessions']} sessions x {s['turns']} turns,"
            f" L = {s['latency_ms']:g} ms, {s['memories']} memories/turn,"
            f" {s['processes']} processes x {s['threads']} threads;"
            f" load {result['load_average_before'][0]} -> {result['load_average_after'][0]}"
        )
        body = [[name, get(result["pipeline"]), get(result["baseline"])] for name, get in METRICS]
        out.append(table(["metric", "pipeline", _baseline_label(result)], body))
        ratios = ", ".join(f"{k} = {v}" for k, v in result["ratios"].items())
        out.append(f"ratios: {ratios}")
        if result["baseline"]["sessions"] != s["sessions"]:
            out.append(
                f"(baseline on the first {result['baseline']['sessions']} of the"
                f" {s['sessions']} sessions: ibex extract is sequential)"
            )
        if result["baseline"].get("capped_after_s"):
            out.append(
                f"(baseline stopped after {result['baseline']['capped_after_s']:g} s;"
                " its rates are over the turns it finished)"
            )
        for target in result["targets"]:
            verdict = "MET" if target["met"] else "MISSED"
            out.append(f"target {target['target']}: {target['value']} -> {verdict}")
    if document["summary"]:
        out.append("")
        out.append(render_summary(document))
    out.append("")
    out.append(f"total {document['seconds']} s; logs in {document['settings']['logs']}")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.pipeline",
        description="Pipeline (worker processes) vs ibex extract (sequential) on the same data",
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help=f"repeatable; default: {' '.join(DEFAULT_SCENARIOS)}",
    )
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print one Markdown table, then the targets table (measure / value / target)",
    )
    p.add_argument(
        "--summary", action="store_true", help="print the targets table alone, as Markdown"
    )
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                   help="dropped and created afresh (default: %(default)s)")  # fmt: skip
    p.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                   help="a Redis database that is flushed (default: %(default)s)")  # fmt: skip
    p.add_argument(
        "--private-redis",
        action="store_true",
        help="start a private redis-server, so its command and CPU counters"
        " count this benchmark alone (INFO is server-wide)",
    )
    p.add_argument(
        "--embeddings",
        choices=("fake", "local", "none"),
        default="fake",
        help="fake: an OpenAI-compatible fake endpoint whose requests are counted (default);"
        " local: the packaged model in-process; none: no vectors",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="OpenTelemetry traces on in the web and worker processes, exported over OTLP/HTTP"
        " to a local sink (its CPU reported apart, as fake_trace_sink)",
    )
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="no throwaway run before the scenarios (with --tracing there is none, so that"
        " the sink's counts are the scenarios' own)",
    )
    p.add_argument("--web-workers", type=int, default=2, help="gunicorn workers (default 2)")
    p.add_argument("--web-threads", type=int, default=4, help="gunicorn threads (default 4)")
    p.add_argument("--no-sql-log", action="store_true",
                   help="do not turn on log_statement (no SQL statement counts)")  # fmt: skip
    p.add_argument("--no-access-log", action="store_true",
                   help="no gunicorn access log (no HTTP request counts): the web as the"
                        " Procfile runs it")  # fmt: skip
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the workers and gunicorn during each pipeline run",
    )
    p.add_argument("--profile-seconds", type=float, default=8.0)
    p.add_argument("--log-dir", help="where the children's logs go (default: a temp folder)")
    for name in ("sessions", "turns", "memories", "processes", "threads"):
        p.add_argument(f"--{name}", type=int, help=f"override the scenarios' {name}")
    p.add_argument("--latency-ms", type=float, help="override the scenarios' LLM latency")
    p.add_argument("--baseline-cap", type=float, help="stop ibex extract after this many s")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.scenario = args.scenario or list(DEFAULT_SCENARIOS)
    try:
        document = run(args)
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench.pipeline: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(dumps(document))
    elif args.markdown:
        print(render_markdown(document))
    elif args.summary:
        print(render_summary(document))
    else:
        print(render(document))
    failed = any(
        not r["pipeline"]["complete"]
        or r["pipeline"]["turns_failed"]
        # The seeds comparison has no figure unless the seeds' design finished too.
        or (r["scenario"]["compare"] == "seeds" and not r["baseline"]["complete"])
        for r in document["scenarios"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
