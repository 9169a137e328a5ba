"""Proxy overhead: what the chat path adds to a non-streaming chat completion.

``python -m bench.proxy_overhead [--calls N] [--latency-ms MS] [--json]``

1. Starts a private ``redis-server``, the fake LLM (:mod:`bench.fake_llm`, ``--latency-ms``
   per answer, TCP_NODELAY) and the Procfile's ``proxy`` line (uvicorn, one process) on a
   database recreated from the migrations (``--database-url``), with a token of scopes
   ``sessions:write`` and ``memory:read``.
2. Makes ``--calls`` rounds of three sequential calls over keep-alive connections, one of each
   kind, interleaved so that drift in the machine's load hits all three alike:
   ``direct`` (the fake LLM itself), ``proxy`` (through the proxy, no IBEX headers: pass-through)
   and ``recorded`` (through the proxy with ``X-IBEX-Agent`` and a new ``X-IBEX-Session-ID``
   per call: the token check, served from the 2 s cache, and the spool write after the
   answer). The worker does not run: the spool only fills, as it does while the database is
   away.
3. Prints p50 / p99 / mean in milliseconds per kind, the overhead against ``direct`` at p50
   and p99, and how many turns the spool holds (it must equal the recorded calls).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

from bench import BenchError
from bench.dbadmin import recreate_database
from bench.report import load_average, markdown_table, percentile, run_and_print
from bench.stack import child_env, start_fake_llm, start_private_redis, wait_http
from cli.stack.processes import Launcher, free_port

DEFAULT_PROXY_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench_proxy"
KINDS = ("direct", "proxy", "recorded")
BODY = {
    "model": "fake",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "I'm Dana. Remember that I prefer email over phone calls."},
    ],
}


def _token(url: str) -> str:
    from core.db import make_database
    from memories.tokens import TokenStore
    from models import bind
    from sessions.store import SessionStore

    db = bind(make_database(url))
    try:
        sessions = SessionStore(db)
        org_id = sessions.ensure_org("bench")
        # The chat path records only for an agent the org has.
        sessions.ensure_agent(org_id, "bench-bot")
        _, token = TokenStore(db).issue(
            org_id=org_id, name="proxy-bench", scopes=["sessions:write", "memory:read"]
        )
        return token
    finally:
        db.close()


def _timed(client: httpx.Client, url: str, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    answer = client.post(url, json=BODY, headers=headers)
    elapsed = (time.perf_counter() - started) * 1000
    if answer.status_code != 200:
        raise BenchError(f"{url} answered {answer.status_code}: {answer.text[:200]}")
    return elapsed


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) or 0.0, 3),
        "p99_ms": round(percentile(values, 99) or 0.0, 3),
        "mean_ms": round(statistics.fmean(values), 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    recreate_database(args.database_url)
    token = _token(args.database_url)
    with (
        tempfile.TemporaryDirectory(prefix="ibex-proxy-bench-") as folder,
        Launcher(Path(folder)) as launcher,
    ):
        redis_url = start_private_redis(launcher)
        _, llm_url = start_fake_llm(launcher, latency_ms=args.latency_ms, memories=1)
        port = free_port()
        env = child_env(
            {
                "PORT": str(port),
                "DATABASE_URL": args.database_url,
                "REDIS_URL": redis_url,
                "UPSTREAM_LLM_BASE_URL": llm_url,
                "WEB_CONCURRENCY": "1",
            }
        )
        launcher.start_procfile("proxy", env, extra_args=["--host", "127.0.0.1"])
        proxy_url = f"http://127.0.0.1:{port}"
        wait_http(f"{proxy_url}/healthz", launcher)
        urls = {
            "direct": f"{llm_url}/chat/completions",
            "proxy": f"{proxy_url}/v1/chat/completions",
            "recorded": f"{proxy_url}/v1/chat/completions",
        }
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        with httpx.Client(timeout=30) as client:
            for i in range(args.warmup + args.calls):
                for kind in KINDS:
                    headers = {"Authorization": "Bearer sk-bench"}
                    if kind == "recorded":
                        headers |= {
                            "X-IBEX-Token": token,
                            "X-IBEX-Agent": "bench-bot",
                            "X-IBEX-Session-ID": f"bench-{uuid.uuid4()}",
                        }
                    elapsed = _timed(client, urls[kind], headers)
                    if i >= args.warmup:
                        times[kind].append(elapsed)
        # The spool writes run after each answer: give the last ones a moment.
        spool = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 10
        expected = args.warmup + args.calls
        while spool.llen("dramatiq:chat_turns") < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        spooled = int(spool.llen("dramatiq:chat_turns"))
        spool.close()
    summary = {kind: _summary(values) for kind, values in times.items()}
    direct = summary["direct"]
    return {
        "calls": args.calls,
        "latency_ms": args.latency_ms,
        "load_average": load_average(),
        "kinds": summary,
        "overhead": {
            kind: {
                "p50_ms": round(summary[kind]["p50_ms"] - direct["p50_ms"], 3),
                "p99_ms": round(summary[kind]["p99_ms"] - direct["p99_ms"], 3),
            }
            for kind in ("proxy", "recorded")
        },
        "spooled": spooled,
        "spooled_expected": args.warmup + args.calls,
    }


def render(document: dict[str, Any]) -> str:
    rows = []
    for kind in KINDS:
        s = document["kinds"][kind]
        over = document["overhead"].get(kind, {"p50_ms": 0.0, "p99_ms": 0.0})
        rows.append([kind, s["p50_ms"], s["p99_ms"], s["mean_ms"], over["p50_ms"], over["p99_ms"]])
    table = markdown_table(["kind", "p50 ms", "p99 ms", "mean ms", "+p50 ms", "+p99 ms"], rows)
    return (
        f"{document['calls']} calls of each kind, upstream latency {document['latency_ms']} ms,"
        f" load {document['load_average']}\n{table}\n"
        f"spooled turns: {document['spooled']} of {document['spooled_expected']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_overhead", description=__doc__)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--database-url", default=DEFAULT_PROXY_DATABASE_URL)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    return run_and_print("proxy_overhead", args, run, render)


if __name__ == "__main__":
    raise SystemExit(main())
