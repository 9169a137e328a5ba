"""The storage benchmark: Redis bytes per POST and Postgres bytes per turn, measured.

``python -m bench.storage [--posts N] [--turns N] [--memories M] [--json]``

One run, on a freshly created and migrated database, a private ``redis-server`` (so its memory
counts this benchmark alone), the memory service under gunicorn (the Procfile ``web`` line) and
the fake OpenAI-compatible LLM answering ``--memories`` memories per turn:

1. **Postgres**: ``--turns`` turns (sessions of 10) are imported with the ``ibex import`` code
   path, then extracted with ``ibex extract`` (the stage functions inline, POSTing every memory
   to the service). ``pg_total_relation_size`` of every table (heap, TOAST and indexes) is read
   when empty, after the import and after the extraction; bytes per turn are the growth over
   the turns. Unless ``--no-prune``, ``ibex prune`` then deletes the extraction state of every
   turn, and its rows and time are reported.
2. **Redis**: the private Redis is emptied and ``--posts`` POSTs go through the service
   (8 client threads), each with the pipeline's key (``uuid5`` of the slot identity) and
   body shape. Reported per POST: the sum of ``MEMORY USAGE`` over the idempotency records,
   the largest record, and the growth of ``used_memory`` (which also counts the key space's
   own tables and the expiry entries).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg2.extensions
import redis

from bench import BenchError
from bench.dbadmin import (
    admin_connection,
    create_service_token,
    database_name,
    recreate_database,
    rows,
    scalar,
)
from bench.pipeline import Scenario, import_sessions
from bench.report import dumps, machine, markdown_table, table
from bench.stack import (
    child_env,
    ibex,
    start_fake_llm,
    start_memory_service,
    start_private_redis,
    terminate_on_sigterm,
)
from cli.stack.processes import ROOT, Launcher
from extraction.keys import idempotency_key

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench_storage"
TURNS_PER_SESSION = 10
RECORD_PREFIX = "ibex:idem:"

#: Every table of the schema, with the bytes of its heap (and TOAST) and of its indexes.
SIZES_SQL = """
SELECT n.nspname || '.' || c.relname,
       pg_total_relation_size(c.oid) - pg_indexes_size(c.oid),
       pg_indexes_size(c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r' AND n.nspname IN ('ibex_core', 'ibex_memory')
"""


def table_sizes(admin: psycopg2.extensions.connection) -> dict[str, tuple[int, int]]:
    return {name: (int(heap), int(index)) for name, heap, index in rows(admin, SIZES_SQL)}


def growth(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], turns: int
) -> dict[str, dict[str, float]]:
    """Bytes per turn by table (heap, indexes, total); tables that did not grow are left out."""
    out: dict[str, dict[str, float]] = {}
    for name, (heap, index) in sorted(after.items()):
        heap0, index0 = before.get(name, (0, 0))
        if heap == heap0 and index == index0:
            continue
        out[name] = {
            "heap": round((heap - heap0) / turns, 1),
            "indexes": round((index - index0) / turns, 1),
            "total": round((heap + index - heap0 - index0) / turns, 1),
        }
    return out


def count_rows(admin: psycopg2.extensions.connection) -> dict[str, int]:
    return {
        table: int(scalar(admin, f"SELECT count(*) FROM {table}"))
        for table in (
            "ibex_core.extraction_turns",
            "ibex_core.extraction_slots",
            "ibex_memory.memories",
        )
    }


def run_ibex(env: dict[str, str], *args: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        ibex(*args, "--json"),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise BenchError(f"ibex {' '.join(args)} failed: {done.stderr[-2000:]}")
    try:
        document: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        document = {}
    return document


def measure_postgres(
    admin: psycopg2.extensions.connection, url: str, env: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    sessions = max(1, args.turns // TURNS_PER_SESSION)
    scenario = Scenario(
        "storage", sessions=sessions, turns=min(args.turns, TURNS_PER_SESSION), memories=3
    )
    turns = scenario.total_turns
    empty = table_sizes(admin)
    import_sessions(url, scenario)
    imported = table_sizes(admin)
    started = time.monotonic()
    run_ibex(env, "extract", timeout=args.timeout)
    extract_s = time.monotonic() - started
    extracted = table_sizes(admin)
    counted = count_rows(admin)
    done = int(
        scalar(admin, "SELECT count(*) FROM ibex_core.extraction_turns WHERE state = 'done'")
    )
    if done != turns:
        raise BenchError(f"ibex extract finished {done} of {turns} turns")
    result: dict[str, Any] = {
        "turns": turns,
        "sessions": sessions,
        "memories": counted["ibex_memory.memories"],
        "memories_per_turn": round(counted["ibex_memory.memories"] / turns, 2),
        "extract_s": round(extract_s, 2),
        "bytes_per_turn": growth(empty, extracted, turns),
        "import_bytes_per_turn": growth(empty, imported, turns),
        "rows": counted,
    }
    by_table = result["bytes_per_turn"]
    result["total_bytes_per_turn"] = round(sum(t["total"] for t in by_table.values()), 1)
    state = ("ibex_core.extraction_turns", "ibex_core.extraction_slots")
    result["prunable_bytes_per_turn"] = round(
        sum(by_table[t]["total"] for t in state if t in by_table), 1
    )
    if not args.no_prune:
        time.sleep(1.1)  # every turn is now done more than a second ago
        started = time.monotonic()
        pruned = run_ibex(env, "prune", "--done-older-than", "1s", "--yes", timeout=args.timeout)
        result["prune"] = {
            "turns": pruned.get("turns"),
            "slots": pruned.get("slots"),
            "seconds": round(time.monotonic() - started, 2),
            "rows_left": count_rows(admin),
        }
    return result


def post_memories(
    memory_url: str, token: str, session: tuple[str, str, str], posts: int
) -> dict[str, int]:
    """``posts`` pipeline-shaped POSTs (8 threads); the count of each status code."""
    session_id, org_id, agent_id = session
    headers = {"Authorization": f"Bearer {token}", "X-IBEX-Org-ID": org_id}

    def one(client: httpx.Client, n: int) -> int:
        turn_index, ordinal = 1 + n // 3, n % 3
        body = {
            "agent_id": agent_id,
            "content": f"Session {session_id[:8]} turn {turn_index}: user fact number {n}.",
            "kind": "fact",
            "source": {"session_id": session_id, "turn_index": turn_index, "ordinal": ordinal},
            "metadata": {"provider": "openai", "model": "gpt-4o-mini"},
        }
        key = idempotency_key(org_id, session_id, turn_index, 1000 + ordinal)
        response = client.post(
            "/v1/memories", json=body, headers={**headers, "X-Idempotency-Key": key}
        )
        return response.status_code

    statuses: dict[int, int] = {}
    with (
        httpx.Client(base_url=memory_url, timeout=30) as client,
        ThreadPoolExecutor(8) as pool,
    ):
        for status in pool.map(lambda n: one(client, n), range(posts)):
            statuses[status] = statuses.get(status, 0) + 1
    return statuses


def record_usage(client: redis.Redis) -> list[int]:
    sizes = []
    for key in client.scan_iter(match=f"{RECORD_PREFIX}*", count=1000):
        sizes.append(int(client.memory_usage(key, samples=0) or 0))
    return sizes


def measure_redis(
    client: redis.Redis,
    admin: psycopg2.extensions.connection,
    memory_url: str,
    token: str,
    posts: int,
) -> dict[str, Any]:
    from_extract = record_usage(client)
    session = rows(
        admin,
        "SELECT id::text, org_id::text, agent_id::text FROM ibex_core.sessions ORDER BY id LIMIT 1",
    )[0]
    client.flushdb()
    used_before = int(client.info("memory")["used_memory"])
    started = time.monotonic()
    statuses = post_memories(memory_url, token, session, posts)
    seconds = time.monotonic() - started
    if statuses.get(201) != posts:
        raise BenchError(f"POSTs answered {statuses}, not {posts} x 201")
    used_after = int(client.info("memory")["used_memory"])
    sizes = record_usage(client)
    if len(sizes) != posts:
        raise BenchError(f"{len(sizes)} idempotency records after {posts} POSTs")
    ttl = int(client.ttl(next(client.scan_iter(match=f"{RECORD_PREFIX}*"))))
    return {
        "posts": posts,
        "posts_s": round(seconds, 2),
        "records": len(sizes),
        "memory_usage_per_post": round(sum(sizes) / posts, 1),
        "memory_usage_max": max(sizes),
        "used_memory_per_post": round((used_after - used_before) / posts, 1),
        "record_ttl_s": ttl,
        "extract_records": len(from_extract),
        "extract_memory_usage_per_post": (
            round(sum(from_extract) / len(from_extract), 1) if from_extract else None
        ),
    }


@contextlib.contextmanager
def stack_up(args: argparse.Namespace, folder: Path) -> Iterator[dict[str, Any]]:
    url = args.database_url
    recreate_database(url)
    token = create_service_token(url)
    admin = admin_connection(url)
    children = Launcher(folder, cwd=ROOT)
    client: redis.Redis | None = None
    try:
        redis_url = start_private_redis(children)
        client = redis.Redis.from_url(redis_url)
        web_env = child_env({"DATABASE_URL": url, "REDIS_URL": redis_url, "LLM_PROVIDER": "rules"})
        _, memory_url = start_memory_service(children, web_env, workers=2, threads=4)
        _, llm_url = start_fake_llm(children, latency_ms=0, memories=args.memories)
        env = child_env(
            {
                "DATABASE_URL": url,
                "REDIS_URL": redis_url,
                "MEMORY_SERVICE_URL": memory_url,
                "MEMORY_SERVICE_TOKEN": token,
                "LLM_PROVIDER": "openai",
                "LLM_BASE_URL": llm_url,
            }
        )
        yield {
            "url": url,
            "admin": admin,
            "redis": client,
            "memory_url": memory_url,
            "token": token,
            "env": env,
        }
    finally:
        children.stop()
        admin.close()
        if client is not None:
            client.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="ibex-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with terminate_on_sigterm(), stack_up(args, folder) as stack:
        info = machine(stack["admin"], stack["redis"])
        postgres = measure_postgres(stack["admin"], stack["url"], stack["env"], args)
        redis_result = measure_redis(
            stack["redis"], stack["admin"], stack["memory_url"], stack["token"], args.posts
        )
    return {
        "benchmark": "storage",
        "machine": info,
        "settings": {
            "database": database_name(args.database_url),
            "memories_per_turn": args.memories,
            "logs": str(folder),
        },
        "redis": redis_result,
        "postgres": postgres,
        "seconds": round(time.monotonic() - started, 1),
    }


def render(document: dict[str, Any], *, markdown: bool = False) -> str:
    r, p = document["redis"], document["postgres"]
    fmt = markdown_table if markdown else table
    out = [
        fmt(
            ["Redis, per POST", "bytes"],
            [
                ["MEMORY USAGE of the records (mean)", r["memory_usage_per_post"]],
                ["MEMORY USAGE of the largest record", r["memory_usage_max"]],
                ["used_memory growth", r["used_memory_per_post"]],
            ],
        ),
        "",
        fmt(
            ["Postgres, per turn", "heap", "indexes", "total"],
            [[name, t["heap"], t["indexes"], t["total"]] for name, t in p["bytes_per_turn"].items()]
            + [["all tables", "", "", p["total_bytes_per_turn"]]],
        ),
        "",
        f"{r['posts']} POSTs in {r['posts_s']} s; {p['turns']} turns, {p['memories']} memories"
        f" ({p['memories_per_turn']} per turn), ibex extract {p['extract_s']} s; prunable"
        f" {p['prunable_bytes_per_turn']} B/turn",
    ]
    if "prune" in p:
        pr = p["prune"]
        out.append(f"ibex prune: {pr['turns']} turns, {pr['slots']} slots in {pr['seconds']} s")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.storage",
        description="Redis bytes per POST and Postgres bytes per turn, measured",
    )
    p.add_argument("--posts", type=int, default=2000, help="POSTs for the Redis figure")
    p.add_argument("--turns", type=int, default=1000, help="turns for the Postgres figure")
    p.add_argument("--memories", type=int, default=3, help="memories per turn (fake LLM)")
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    p.add_argument("--no-prune", action="store_true", help="do not run ibex prune afterwards")
    p.add_argument("--timeout", type=float, default=600, help="seconds for ibex extract")
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                   help="dropped and created afresh (default: %(default)s)")  # fmt: skip
    p.add_argument("--log-dir", help="where the children's logs go (default: a temp folder)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.posts < 1 or args.turns < 1:
        print("bench.storage: --posts and --turns must be at least 1", file=sys.stderr)
        return 2
    try:
        document = run(args)
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench.storage: {exc}", file=sys.stderr)
        return 1
    print(dumps(document) if args.json else render(document, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
