"""How long a message sent to a quiet queue waits for a worker, and what a quiet worker costs.

``python -m bench.pickup [--idle S ...] [--rounds N] [--quiet-seconds S] [--json]``

A real ``dramatiq`` worker process (``--processes``, ``--threads``) runs this module's actor on
the pipeline's broker (:class:`~actors.guard.GuardedRedisBroker`, its own namespace on
``--redis-url``, database flushed first). For each ``--idle`` pause, ``--rounds`` times: the
benchmark waits that long with nothing queued, sends one message stamped with the time, and the
actor pushes the time it ran; the pickup is the difference (one clock, one machine). A consumer
backs off between empty polls, up to its timeout (1 s), so the pickup after a pause is what
the first turn after a quiet spell, or a stage's first message after one, waits before any work.

Then ``--quiet-seconds`` with nothing sent: the Redis commands per second the quiet worker sends
(``INFO stats``, server-wide: use a Redis nothing else uses; the benchmark's own read is taken
off).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dramatiq
import redis

from actors.guard import GuardedRedisBroker
from bench import BenchError
from bench.report import load_average, run_and_print, table
from cli.stack.processes import ROOT, Launcher, Process

#: The Redis the worker process reads its broker from (set by the benchmark for its child).
REDIS_ENV = "IBEX_BENCH_PICKUP_REDIS_URL"
NAMESPACE = "ibex-bench-pickup"
QUEUE = "pickup"
SEEN = f"{NAMESPACE}:seen"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"

broker = GuardedRedisBroker(
    url=os.environ.get(REDIS_ENV, DEFAULT_REDIS_URL),
    namespace=NAMESPACE,
    middleware=[],
)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, broker=broker)
def picked(sent_at: float) -> None:
    """Record when the message was sent and when a worker thread ran it."""
    broker.client.rpush(SEEN, json.dumps([sent_at, time.time()]))


def _commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def _wait_ready(client: redis.Redis, worker: Process, processes: int) -> None:
    """Until every worker process has a heartbeat (its consumers run)."""
    deadline = time.monotonic() + 60
    while client.zcard(f"{NAMESPACE}:__heartbeats__") < processes:
        if not worker.alive():
            raise BenchError(f"the worker exited ({worker.returncode}): {worker.log_tail()}")
        if time.monotonic() > deadline:
            raise BenchError("the worker did not start within 60 s")
        time.sleep(0.05)


def _pickup(sender: GuardedRedisBroker, idle: float, rounds: int, worker: Process) -> list[float]:
    client = sender.client
    out = []
    for _ in range(rounds):
        time.sleep(idle)
        message = picked.message(time.time())
        sender.push({QUEUE: [(str(uuid.uuid4()), message.encode())]})
        deadline = time.monotonic() + 20
        answer = None
        while answer is None and time.monotonic() < deadline:
            answer = client.blpop([SEEN], timeout=1)  # under the client's socket timeout
        if answer is None:
            raise BenchError(
                f"a message sent after {idle} s idle was not run within 20 s; the worker's"
                f" log ends: {worker.log_tail()}"
            )
        sent_at, ran_at = json.loads(answer[1])
        out.append((ran_at - sent_at) * 1000)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    sender = GuardedRedisBroker(url=args.redis_url, namespace=NAMESPACE, middleware=[])
    client = sender.client
    client.flushdb()
    started = time.monotonic()
    load_before = load_average()
    argv = [
        sys.executable, "-m", "dramatiq", "bench.pickup",
        "--processes", str(args.processes), "--threads", str(args.threads),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as folder, Launcher(Path(folder), cwd=ROOT) as launcher:
        worker = launcher.start("worker", argv, {**os.environ, REDIS_ENV: args.redis_url})
        _wait_ready(client, worker, args.processes)
        pickup: dict[str, Any] = {}
        for idle in args.idle:
            ms = _pickup(sender, idle, args.rounds, worker)
            pickup[f"{idle:g}"] = {
                "n": len(ms),
                "p50_ms": round(statistics.median(ms), 1),
                "max_ms": round(max(ms), 1),
            }
        time.sleep(2.0)  # a quiet spell before counting
        before = _commands(client)
        time.sleep(args.quiet_seconds)
        after = _commands(client)
    return {
        "benchmark": "pickup",
        "machine": {
            "cpus": os.cpu_count(),
            "redis": str(client.info("server").get("redis_version")),
            "load_average_before": load_before,
        },
        "settings": {
            "processes": args.processes,
            "threads": args.threads,
            "rounds": args.rounds,
            "idle_s": args.idle,
            "quiet_seconds": args.quiet_seconds,
        },
        "pickup": pickup,
        "quiet_commands_per_s": round((after - before - 1) / args.quiet_seconds, 1),
        "seconds": round(time.monotonic() - started, 1),
    }


def render(doc: dict[str, Any]) -> str:
    rows = [
        [f"after {idle} s idle", r["n"], r["p50_ms"], r["max_ms"]]
        for idle, r in doc["pickup"].items()
    ]
    return "\n".join(
        [
            table(["a message sent", "n", "pickup p50 ms", "max ms"], rows),
            f"quiet worker: {doc['quiet_commands_per_s']} Redis commands/s"
            f" ({doc['settings']['processes']} processes)",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.pickup", description=__doc__.split("\n")[0])
    p.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help="a Redis database of the benchmark's own (flushed; default %(default)s)",
    )
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument(
        "--idle",
        type=float,
        action="append",
        help="a pause before each message, seconds (repeat; default 0.05 0.2 0.5 1 3)",
    )
    p.add_argument("--rounds", type=int, default=10, help="messages per pause (default 10)")
    p.add_argument(
        "--quiet-seconds",
        type=float,
        default=20.0,
        help="how long to count the quiet worker's commands (default 20)",
    )
    p.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.idle = args.idle or [0.05, 0.2, 0.5, 1.0, 3.0]
    if args.rounds < 1 or args.quiet_seconds <= 0 or min(args.idle) < 0:
        print("bench.pickup: --rounds >= 1, --quiet-seconds > 0, --idle >= 0", file=sys.stderr)
        return 2
    return run_and_print("bench.pickup", args, run, render)


if __name__ == "__main__":
    raise SystemExit(main())
