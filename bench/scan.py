"""The scan benchmark (a performance target): a scan over 1,000,000 sessions sends 10,000 turns.

``python -m bench.scan [--sessions N] [--pending-sessions N] [--turns N] [--json]``

1. Generates, straight in SQL (``INSERT ... SELECT generate_series``), ``--orgs`` orgs with
   ``--agents-per-org`` agents each and ``--sessions`` completed sessions of ``--turns`` turns,
   all fully extracted except the first ``--pending-sessions``, which have every turn pending
   and are spread round-robin over every agent (so over every org). The scan reads sessions
   only, so no checkpoints are generated. ``--reuse`` keeps an existing data set of the same
   shape instead of generating it again (applying the migrations added since).
2. Times the scan stage as the scheduler's ``scan_sessions`` actor runs it:
   :func:`extraction.stages.scan` (candidate query, recording and leasing every pending turn)
   with real Postgres, then sending the ``extract_turn`` messages through a real
   :class:`~dramatiq.brokers.redis.RedisBroker` on the benchmark Redis database. Each repeat
   starts from the same state (the per-turn rows deleted, the Redis database flushed).
3. Prints the ``EXPLAIN (ANALYZE, BUFFERS)`` plan of the candidate query, run as the scan role,
   and whether it uses ``idx_sessions_agent_extraction``.

``--profile`` adds a pyinstrument profile of one scan (text, the slowest frames).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg2.extensions
import redis

from bench import BenchError
from bench.dbadmin import (
    StatementLog,
    admin_connection,
    database_name,
    recreate_database,
    rows,
    scalar,
)
from bench.report import load_average, machine, run_and_print, table
from bench.sampling import redis_counters
from bench.stack import DEFAULT_REDIS_URL, start_private_redis
from cli.stack.processes import ROOT, Launcher

DEFAULT_SCAN_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench_scan"

#: The target: the median scan sends 10,000 turns over 1,000,000 sessions in under this (s).
TARGET_S = 1.0

GENERATE_SQL = """
SET synchronous_commit = off;
INSERT INTO ibex_core.orgs (slug)
SELECT 'scan-org-' || g FROM generate_series(1, %(orgs)s) g;
INSERT INTO ibex_core.agents (org_id, slug)
SELECT o.id, 'agent-' || a FROM ibex_core.orgs o CROSS JOIN generate_series(1, %(agents)s) a;
CREATE TEMP TABLE bench_agents AS
SELECT (row_number() OVER (ORDER BY id) - 1)::int AS n, id, org_id FROM ibex_core.agents;
CREATE UNIQUE INDEX ON bench_agents (n);
INSERT INTO ibex_core.sessions
    (org_id, agent_id, external_id, status, model, provider, turn_count, last_extracted_turn,
     completed_at)
SELECT a.org_id, a.id, 's-' || g, 'completed', 'gpt-4o-mini', 'openai', %(turns)s,
       CASE WHEN g < %(pending)s THEN 0 ELSE %(turns)s END, now()
  FROM generate_series(0, %(sessions)s - 1) g
  JOIN bench_agents a ON a.n = g %% %(agent_count)s;
DROP TABLE bench_agents;
"""


def _shape(args: argparse.Namespace) -> dict[str, int]:
    return {
        "orgs": args.orgs,
        "agents": args.agents_per_org,
        "agent_count": args.orgs * args.agents_per_org,
        "sessions": args.sessions,
        "pending": args.pending_sessions,
        "turns": args.turns,
    }


def _data_matches(conn: psycopg2.extensions.connection, shape: dict[str, int]) -> bool:
    try:
        found = rows(
            conn,
            "SELECT count(*), count(*) FILTER (WHERE last_extracted_turn = 0),"
            " coalesce(max(turn_count), 0) FROM ibex_core.sessions",
        )[0]
    except psycopg2.Error:
        return False
    return tuple(int(x) for x in found) == (shape["sessions"], shape["pending"], shape["turns"])


def generate(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Create the data set unless ``--reuse`` finds it; returns what was done and how long."""
    shape = _shape(args)
    if args.reuse:
        try:
            conn = admin_connection(url)
        except psycopg2.Error:
            conn = None
        if conn is not None:
            try:
                matches = _data_matches(conn, shape)
            finally:
                conn.close()
            if matches:
                from core.migrate import migrate

                # Functions and indexes added since the data set was generated.
                return {"generated": False, "seconds": 0.0, "migrated": migrate(url)}
    started = time.monotonic()
    recreate_database(url)
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(GENERATE_SQL, shape)
            cur.execute("VACUUM ANALYZE")
        if not _data_matches(conn, shape):
            raise BenchError("the generated data set does not have the expected shape")
    finally:
        conn.close()
    return {"generated": True, "seconds": round(time.monotonic() - started, 1)}


def _reset(conn: psycopg2.extensions.connection, client: redis.Redis) -> None:
    with conn.cursor() as cur:
        cur.execute("TRUNCATE ibex_core.extraction_turns CASCADE")
    client.flushdb()


class Timed:
    """Wraps a method of one object and adds up the wall time of its calls."""

    def __init__(self, owner: Any, name: str) -> None:
        self.calls = 0
        self.seconds = 0.0
        inner: Callable[..., Any] = getattr(owner, name)

        def timed(*a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.calls += 1
                self.seconds += time.perf_counter() - started

        setattr(owner, name, timed)


def scan_once(url: str, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One timed scan: the stage (Postgres) and the sends (Redis), from a fresh state."""
    from actors.broker import make_broker, use_broker
    from core.config import Settings
    from core.db import make_database
    from extraction.stages import StageDeps, scan
    from models.store import SessionStore

    settings = Settings.from_env(
        {
            "DATABASE_URL": url,
            "REDIS_URL": redis_url,
            "SCAN_BATCH_SIZE": str(args.batch_size),
            "SCAN_MAX_TURNS_PER_AGENT": str(args.max_turns_per_agent),
        }
    )
    import actors  # noqa: F401  (declares every actor on the broker)
    from actors.broker import send_all

    broker = use_broker(make_broker(settings))
    db = make_database(url)
    store = SessionStore(db)
    deps = StageDeps(store=store, settings=settings)
    candidates = Timed(deps.scan_queries, "candidates")
    leases = Timed(deps.scan_queries, "lease_turns")
    try:
        db.connect()
        started = time.perf_counter()
        report = scan(deps)
        scanned = time.perf_counter()
        sent = send_all(report.sent)
        finished = time.perf_counter()
    finally:
        db.close()
        broker.close()
    return {
        "sessions": report.sessions,
        "turns_sent": sent,
        "total_s": round(finished - started, 3),
        "stage_s": round(scanned - started, 3),
        "send_s": round(finished - scanned, 3),
        "candidate_queries": candidates.calls,
        "candidate_s": round(candidates.seconds, 3),
        "lease_transactions": leases.calls,
        "lease_s": round(leases.seconds, 3),
    }


def explain(url: str, batch_size: int) -> str:
    from extraction.scan_queries import CANDIDATES_SQL

    conn = admin_connection(url)
    try:
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("SET LOCAL ROLE ibex_scan")
            zero = "00000000-0000-0000-0000-000000000000"
            cur.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + CANDIDATES_SQL.strip(), (zero, zero, batch_size)
            )
            plan = "\n".join(r[0] for r in cur.fetchall())
        conn.rollback()
    finally:
        conn.close()
    return plan


def profile_once(url: str, redis_url: str, args: argparse.Namespace) -> str:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001)
    profiler.start()
    try:
        scan_once(url, redis_url, args)
    finally:
        profiler.stop()
    return str(profiler.output_text(unicode=False, color=False, show_all=False))


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.private_redis:
        return _run(args)
    children = Launcher(Path(tempfile.mkdtemp(prefix="ibex-bench-scan-")), cwd=ROOT)
    try:
        args.redis_url = start_private_redis(children)
        return _run(args)
    finally:
        children.stop()


def _run(args: argparse.Namespace) -> dict[str, Any]:
    url = args.database_url
    data = generate(url, args)
    conn = admin_connection(url)
    client = redis.Redis.from_url(args.redis_url)
    statements = StatementLog(conn, database_name(url))
    try:
        info = machine(conn, client)
        pending = int(
            scalar(
                conn,
                "SELECT coalesce(sum(turn_count - last_extracted_turn), 0) FROM ibex_core.sessions"
                " WHERE status = 'completed' AND deleted_at IS NULL",
            )
        )
        runs = []
        for _ in range(args.repeat):
            _reset(conn, client)
            runs.append(scan_once(url, args.redis_url, args))
        queued = int(client.llen("dramatiq:extract"))
        statement_count = None
        redis_commands = None
        if args.count_sql and statements.available:
            _reset(conn, client)
            statements.enable()
            try:
                statements.mark()
                redis_before = redis_counters(client)
                scan_once(url, args.redis_url, args)
                redis_after = redis_counters(client)
                counted = statements.count()
                statement_count = sum(counted[0].values()) if counted else None
                # INFO commandstats is server-wide: exact with --private-redis. The two INFO
                # calls of the count itself are left out.
                redis_commands = {
                    name: calls - redis_before["per_command"].get(name, 0)
                    for name, calls in redis_after["per_command"].items()
                    if name != "info" and calls != redis_before["per_command"].get(name, 0)
                }
            finally:
                statements.disable()
        plan = explain(url, args.batch_size)
        profile = None
        if args.profile:
            _reset(conn, client)
            profile = profile_once(url, args.redis_url, args)
        _reset(conn, client)
    finally:
        conn.close()
        client.close()
    totals = [r["total_s"] for r in runs]
    median = statistics.median(totals)
    return {
        "benchmark": "scan",
        "machine": info,
        "load_average_after": load_average(),
        "data": {
            **_shape(args),
            "pending_turns": pending,
            "database": database_name(url),
            **data,
        },
        "settings": {
            "scan_batch_size": args.batch_size,
            "scan_max_turns_per_agent": args.max_turns_per_agent,
            "redis_url": args.redis_url,
            "redis_private": args.private_redis,
        },
        "runs": runs,
        "median_total_s": median,
        "queued_after_last_run": queued,
        "sql_statements_per_scan": statement_count,
        "redis_commands_per_scan": None if redis_commands is None else sum(redis_commands.values()),
        "redis_commands_by_name": redis_commands,
        "plan": plan,
        "uses_partial_index": "idx_sessions_agent_extraction" in plan,
        "target": {
            "target": f"scan over 1,000,000 sessions sends 10,000 turns in < {TARGET_S:g} s",
            "value_s": median,
            "met": bool(
                median < TARGET_S
                and args.sessions >= 1_000_000
                and all(r["turns_sent"] >= 10_000 for r in runs)
            ),
        },
        "profile": profile,
    }


def render(document: dict[str, Any]) -> str:
    d = document["data"]
    out = [
        f"data: {d['sessions']:,} sessions ({d['orgs']} orgs x {d['agents']} agents),"
        f" {d['pending']:,} with pending turns, {d['pending_turns']:,} pending turns;"
        f" {'generated in ' + str(d['seconds']) + ' s' if d['generated'] else 'reused'}",
        "",
        table(
            [
                "run",
                "turns sent",
                "total s",
                "stage s",
                "send s",
                "candidate s",
                "lease s",
                "lease txns",
            ],
            [
                [
                    str(n + 1),
                    r["turns_sent"],
                    r["total_s"],
                    r["stage_s"],
                    r["send_s"],
                    r["candidate_s"],
                    r["lease_s"],
                    r["lease_transactions"],
                ]
                for n, r in enumerate(document["runs"])
            ],
        ),
        "",
        f"median total: {document['median_total_s']} s"
        f" ({'MET' if document['target']['met'] else 'MISSED'}: < {TARGET_S:g} s for 10,000 turns"
        " over 1,000,000 sessions)",
    ]
    if document["sql_statements_per_scan"] is not None:
        out.append(f"SQL statements in one scan: {document['sql_statements_per_scan']}")
    if document.get("redis_commands_per_scan") is not None:
        by_name = ", ".join(
            f"{k} {v}" for k, v in sorted(document["redis_commands_by_name"].items())
        )
        out.append(f"Redis commands in one scan: {document['redis_commands_per_scan']} ({by_name})")
    out += [
        f"candidate query uses idx_sessions_agent_extraction: {document['uses_partial_index']}",
        "",
        "EXPLAIN (ANALYZE, BUFFERS) of the candidate query (first batch, as ibex_scan):",
        document["plan"],
    ]
    if document["profile"]:
        out += ["", "profile of one scan (pyinstrument):", document["profile"]]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.scan", description="Time a scan over many sessions"
    )
    p.add_argument(
        "--database-url",
        default=DEFAULT_SCAN_DATABASE_URL,
        help="dropped and created afresh unless --reuse (default: %(default)s)",
    )
    p.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                   help="flushed (default: %(default)s)")  # fmt: skip
    p.add_argument(
        "--private-redis",
        action="store_true",
        help="start a private redis-server instead of flushing a database of a shared one",
    )
    p.add_argument("--sessions", type=int, default=1_000_000)
    p.add_argument("--pending-sessions", type=int, default=2_500)
    p.add_argument("--turns", type=int, default=4, help="turns per session")
    p.add_argument("--orgs", type=int, default=100)
    p.add_argument("--agents-per-org", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=500, help="SCAN_BATCH_SIZE")
    p.add_argument("--max-turns-per-agent", type=int, default=1000,
                   help="SCAN_MAX_TURNS_PER_AGENT")  # fmt: skip
    p.add_argument("--repeat", type=int, default=3, help="timed scans (default 3)")
    p.add_argument("--reuse", action="store_true", help="keep a data set of the same shape")
    p.add_argument(
        "--count-sql",
        action="store_true",
        help="one more scan with log_statement on, to count its statements (and Redis commands)",
    )
    p.add_argument("--profile", action="store_true", help="pyinstrument profile of one scan")
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_print("bench.scan", build_parser().parse_args(argv), run, render)


if __name__ == "__main__":
    raise SystemExit(main())
