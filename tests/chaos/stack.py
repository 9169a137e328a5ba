"""The real system for a chaos run, and the faults a test can inject into it.

:class:`ChaosStack` starts, in process groups of their own:

- a private ``redis-server`` (:class:`~tests.servers.PrivateRedis`);
- the memory service under gunicorn (the Procfile ``web`` line, bound to loopback);
- the fake OpenAI-compatible LLM (``python -m bench.stack fake-llm``: rewording, seeded
  429/500 failures and garbage, runtime knobs at ``POST /control``, counters at ``GET /stats``);
- the ``ibex scheduler`` (the Procfile ``scheduler`` line): a ``scan_sessions`` every second,
  the loop that re-sends work whose lease expired;
- ``dramatiq actors`` workers (the Procfile ``worker`` line), which reach the memory service
  through a :class:`~tests.chaos.proxy.FaultProxy` in this process.

Every process is started and stopped by a :class:`core.processes.Launcher`.

Faults: :meth:`kill_workers` (SIGKILL of the whole worker process group, then a restart),
:meth:`terminate_backends` (``pg_terminate_backend`` of the workers' — and optionally the
memory service's — Postgres backends), :meth:`restart_redis`, and the LLM's knobs. Each fault
records which turns held an LLM claim without a persisted result at that moment: the only turns
whose answer may be lost and asked for again (invariant 4 of docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg2

from actors.queue_stats import dead_key, delayed_key, queue_key
from bench.dbadmin import database_name
from core.db import connect_params
from core.processes import ROOT, Launcher, Process, ProcessError, free_port
from schema.messages import Queue
from tests.chaos.proxy import FaultProxy
from tests.integration.pipeline.test_e2e_workers import BIN
from tests.servers import PrivateRedis

WORKER_APP = "ibex-worker"
MEMORY_APP = "ibex-memory"
QUEUES = tuple(queue.value for queue in Queue)
TurnId = tuple[str, int]  # (session id, turn index)


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    appendonly: bool = False
    worker_processes: int = 2
    worker_threads: int = 4
    memories: int = 2
    llm_latency_ms: int = 60
    llm_jitter_ms: int = 40
    llm_fail_rate: float = 0.06
    llm_fail_status: int = 429
    llm_garbage_rate: float = 0.03
    reject_rate: float = 0.08
    drop_rate: float = 0.08
    # The LLM timeout stays far above the fake's latency (a request that times out on the
    # client is still counted as answered by the fake) and below the claim, so a call never
    # outlives its claim; the lease bounds how long lost work waits to be re-sent.
    lease_seconds: int = 6
    claim_seconds: int = 6
    llm_timeout_seconds: int = 3
    http_timeout_seconds: int = 3
    max_retries: int = 12


@dataclass
class FaultRecord:
    at: float  # seconds since the run started
    kind: str
    detail: str
    at_risk: frozenset[TurnId] = frozenset()


@dataclass
class ChaosStack:
    database_url: str
    folder: Path
    config: ChaosConfig
    token: str  # a memory-service token with memory:write
    faults: list[FaultRecord] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    started_at: float = 0.0

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.redis = PrivateRedis(self.folder / "redis", appendonly=self.config.appendonly)
        self.proxy: FaultProxy | None = None
        self.launcher = Launcher(self.folder, cwd=ROOT)
        self.web: Process | None = None
        self.llm: Process | None = None
        self.scheduler: Process | None = None
        self.worker: Process | None = None
        self.env: dict[str, str] = {}
        self.llm_url = ""
        self._admin: Any = None

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> ChaosStack:
        cfg = self.config
        self.redis.start()
        web_port, llm_port = free_port(), free_port()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "IBEX_"))},
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis.url,
            "PORT": str(web_port),
            "WEB_CONCURRENCY": "2",
            "WEB_THREADS": "4",
            "MEMORY_SERVICE_TOKEN": self.token,
            "IDEMPOTENCY_LEASE_SECONDS": "5",
            "WORKER_PROCESSES": str(cfg.worker_processes),
            "WORKER_THREADS": str(cfg.worker_threads),
            "MAX_RETRIES": str(cfg.max_retries),
            "RETRY_MIN_BACKOFF_MS": "50",
            "RETRY_MAX_BACKOFF_MS": "500",
            "EXTRACTION_LEASE_SECONDS": str(cfg.lease_seconds),
            "EXTRACTION_CLAIM_SECONDS": str(cfg.claim_seconds),
            "LLM_TIMEOUT_SECONDS": str(cfg.llm_timeout_seconds),
            "HTTP_TIMEOUT_SECONDS": str(cfg.http_timeout_seconds),
            "SCAN_INTERVAL_SECONDS": "1",
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": f"http://127.0.0.1:{llm_port}/v1",
            "LLM_MODEL": "fake",
        }
        self._admin = psycopg2.connect(
            **connect_params(self.database_url), application_name="ibex-chaos"
        )
        self._admin.autocommit = True
        self.web = self.launcher.start_procfile("web", self.env, bind_host="127.0.0.1")
        self.llm_url = f"http://127.0.0.1:{llm_port}"
        self.llm = self.launcher.start(
            "llm",
            [sys.executable, "-m", "bench.stack", "fake-llm", "--port", str(llm_port),
             "--latency-ms", str(cfg.llm_latency_ms), "--jitter-ms", str(cfg.llm_jitter_ms),
             "--memories", str(cfg.memories), "--reword", "--fail-rate", str(cfg.llm_fail_rate),
             "--fail-status", str(cfg.llm_fail_status),
             "--garbage-rate", str(cfg.llm_garbage_rate), "--seed", str(cfg.seed)],
            self.env,
        )  # fmt: skip
        self._wait_http(f"http://127.0.0.1:{web_port}/healthz", "memory service")
        self._wait_http(f"{self.llm_url}/healthz", "fake LLM")
        self.proxy = FaultProxy(
            web_port, seed=cfg.seed, reject_rate=cfg.reject_rate, drop_rate=cfg.drop_rate
        ).start()
        self.env["MEMORY_SERVICE_URL"] = self.proxy.url
        self.started_at = time.monotonic()
        self.scheduler = self.launcher.start_procfile("scheduler", self.env)
        self.start_workers()
        return self

    def stop(self) -> None:
        """Stop everything this stack started; safe to call twice and after a failure."""
        with contextlib.suppress(Exception):
            self.launcher.stop()
        if self.proxy is not None:
            self.proxy.stop()
        self.redis.stop()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None

    def _wait_http(self, url: str, what: str) -> None:
        try:
            self.launcher.wait_http(url, timeout=30)
        except ProcessError as exc:
            raise AssertionError(f"the {what}: {exc}\n{self.diagnostics()}") from exc

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def start_workers(self) -> None:
        self.worker = self.launcher.start_procfile("worker", self.env)

    def check_alive(self) -> None:
        """Every long-running process is up. A worker group that exited on its own is recorded
        and restarted, as a process supervisor would (Dramatiq exits when a child dies)."""
        for name, process in (("memory service", self.web), ("fake LLM", self.llm)):
            assert process is not None and process.alive(), (
                f"the {name} exited:\n{self.diagnostics()}"
            )
        if self.worker is not None and not self.worker.alive():
            self.launcher.forget(self.worker)
            self.unexpected_exits.append(
                f"{self.elapsed():.1f}s: worker group exited with {self.worker.returncode}"
            )
            self.start_workers()
        if self.scheduler is not None and not self.scheduler.alive():
            self.launcher.forget(self.scheduler)
            self.unexpected_exits.append(
                f"{self.elapsed():.1f}s: scheduler exited with {self.scheduler.returncode}"
            )
            self.scheduler = self.launcher.start_procfile("scheduler", self.env)

    # -- database probes ---------------------------------------------------------------------

    def sql(self, query: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._admin.cursor() as cur:
            cur.execute(query, tuple(params))
            return list(cur.fetchall()) if cur.description else []

    def at_risk(self) -> frozenset[TurnId]:
        """Turns holding an LLM claim with no persisted result: an answer in flight."""
        rows = self.sql(
            "SELECT session_id::text, turn_index FROM ibex_core.extraction_turns"
            " WHERE claim_token IS NOT NULL AND result IS NULL"
        )
        return frozenset((str(s), int(t)) for s, t in rows)

    def progress(self) -> tuple[int, int, int, int]:
        """(turns recorded, turns with a persisted result, turns done, sum of pointers)."""
        row = self.sql(
            "SELECT count(*), count(result), count(*) FILTER (WHERE state = 'done'),"
            "       (SELECT COALESCE(sum(last_extracted_turn), 0) FROM ibex_core.sessions)"
            "  FROM ibex_core.extraction_turns"
        )[0]
        return int(row[0]), int(row[1]), int(row[2]), int(row[3])

    # -- faults ------------------------------------------------------------------------------

    def _record(self, kind: str, detail: str, at_risk: frozenset[TurnId] = frozenset()) -> None:
        self.faults.append(FaultRecord(round(self.elapsed(), 2), kind, detail, at_risk))

    def kill_workers(self, pause: float = 0.0, *, restart: bool = True) -> None:
        """SIGKILL of every worker process (master and children), then (after ``pause``) a
        restart: messages in flight are lost to their threads; the broker still holds them as
        unacked."""
        worker = self.worker
        assert worker is not None
        # The group leader is reaped and its forked children die with the same signal.
        worker.kill()
        self.launcher.forget(worker)
        risk = self.at_risk()
        self._record(
            "SIGKILL worker group", f"{len(risk)} turns held an LLM claim, no result yet", risk
        )
        if restart:
            time.sleep(pause)
            self.start_workers()
        else:
            self.worker = None

    def terminate_backends(self, *, memory_service: bool = False, rounds: int = 3) -> None:
        """``pg_terminate_backend`` of the workers' backends (and the memory service's), in a
        few rounds 150 ms apart so some land inside a transaction. The pools must recover."""
        apps = [WORKER_APP, MEMORY_APP] if memory_service else [WORKER_APP]
        name = database_name(self.database_url)
        # Freshly restarted workers may not have connected yet: wait (bounded) for one.
        deadline = time.monotonic() + 10
        while not self.sql(
            "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (name, WORKER_APP),
        ):
            assert time.monotonic() < deadline, "no worker connected to Postgres"
            time.sleep(0.05)
        states: Counter[str] = Counter()
        risk: set[TurnId] = set()
        for i in range(rounds):
            rows = self.sql(
                "SELECT application_name, state, xact_start IS NOT NULL,"
                "       pg_terminate_backend(pid)"
                "  FROM pg_stat_activity"
                " WHERE datname = %s AND application_name = ANY(%s) AND pid <> pg_backend_pid()",
                (name, apps),
            )
            for app, state, in_xact, _ok in rows:
                states[f"{app} {'in transaction' if in_xact else state}"] += 1
            risk |= self.at_risk()
            if i + 1 < rounds:
                time.sleep(0.15)
        detail = ", ".join(f"{n} {k}" for k, n in sorted(states.items())) or "no backend"
        self._record("pg_terminate_backend", detail, frozenset(risk))

    def restart_redis(self, *, kill: bool, pause: float) -> dict[str, int]:
        """Stop Redis (SIGKILL: a crash; SIGTERM: a clean shutdown), wait, start it on the same
        port. Returns the queued message counts before and after, per queue."""
        before = self.queue_sizes()
        self.redis.restart(kill=kill, pause=pause)
        after = self.queue_sizes()
        how = "SIGKILL" if kill else "SIGTERM"
        aof = "appendonly" if self.redis.appendonly else "no persistence"
        self._record(
            f"Redis restart ({how}, {aof})",
            f"down {pause:.1f}s; queued messages before {sum(before.values())},"
            f" after {sum(after.values())} (all queues)",
        )
        return {"before": sum(before.values()), "after": sum(after.values())}

    def queue_sizes(self, queues: Iterable[str] = QUEUES) -> dict[str, int]:
        """Messages held per queue (waiting, delayed and in flight: the ``.msgs`` hashes)."""
        client = self.redis.client()
        try:
            out = {}
            for q in queues:
                out[q] = int(client.hlen(queue_key(q) + ".msgs")) + int(
                    client.hlen(delayed_key(q) + ".msgs")
                )
            return out
        except Exception:
            return {}
        finally:
            client.close()

    def dead_letters_in_redis(self) -> int:
        client = self.redis.client()
        try:
            return sum(int(client.zcard(dead_key(q))) for q in QUEUES)
        finally:
            client.close()

    def llm_control(self, **knobs: Any) -> None:
        response = httpx.post(f"{self.llm_url}/control", json=knobs, timeout=5)
        response.raise_for_status()
        self._record("LLM knobs", json.dumps(knobs, sort_keys=True))

    def llm_stats(self) -> dict[str, Any]:
        response = httpx.get(f"{self.llm_url}/stats", timeout=10)
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats

    # -- diagnostics -------------------------------------------------------------------------

    def diagnostics(self) -> str:
        """What a failed run needs: states, claims, dead letters, queues, faults, log tails."""
        parts: list[str] = []
        with contextlib.suppress(Exception):
            rows = self.sql(
                "SELECT state::text, count(*), count(claim_token),"
                "       count(*) FILTER (WHERE lease_expires_at > now()), max(attempts),"
                "       max(llm_calls)"
                "  FROM ibex_core.extraction_turns GROUP BY 1 ORDER BY 1"
            )
            parts.append(
                "turns (state, count, claimed, leased, max attempts, max llm calls): "
                + "; ".join(str(r) for r in rows)
            )
            parts.append(f"progress (recorded, persisted, done, pointers): {self.progress()}")
            errors = self.sql(
                "SELECT session_id::text, turn_index, state::text, last_error"
                "  FROM ibex_core.extraction_turns"
                " WHERE state <> 'done' AND last_error IS NOT NULL LIMIT 5"
            )
            parts.extend(f"not done: {r}" for r in errors)
            dead = self.sql(
                "SELECT actor_name, turn_index, ordinal, exception_type, exception_message"
                "  FROM ibex_core.dead_letters ORDER BY id LIMIT 10"
            )
            parts.append(f"dead letters (Postgres): {len(dead)}")
            parts.extend(f"  {r}" for r in dead)
        with contextlib.suppress(Exception):
            parts.append(f"queues (Redis): {self.queue_sizes()}")
            parts.append(f"dead letters (Redis): {self.dead_letters_in_redis()}")
        if self.proxy is not None:
            parts.append(f"proxy: {self.proxy.snapshot()}")
        parts.extend(f"fault at {f.at}s: {f.kind}: {f.detail}" for f in self.faults)
        parts.extend(f"unexpected exit: {e}" for e in self.unexpected_exits)
        for log in ("worker.log", "web.log", "scheduler.log", "llm.log"):
            parts.append(f"--- {log} (tail)\n{_tail(self.folder / log)}")
        parts.append(f"--- redis.log (tail)\n{self.redis.log_tail(800)}")
        return "\n".join(parts)


def _tail(path: Path, chars: int = 2500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


__all__ = ["ChaosConfig", "ChaosStack", "FaultRecord", "TurnId"]
