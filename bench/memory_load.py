"""POST throughput and latency of a running memory service (loopback only, bounded in time).

Creates (or reuses) an org ``bench``, its agent ``bench-bot`` and a write token in the database
the service uses, then sends ``POST /v1/memories`` with a unique idempotency key and unique
content per request for ``--seconds``, and prints requests/s and latency percentiles.

Two load generators:
- ``--tool httpx`` (default): ``--concurrency`` threads, one keep-alive httpx client each;
- ``--tool wrk``: wrk with a Lua script that makes every request unique (far less client CPU,
  which matters when the client shares two cores with the server).

``--compare`` is one self-contained run: it recreates ``--database-url``, starts a private
``redis-server``, the service (the Procfile's ``web`` line) and the calibration app
(:mod:`bench.calibration_app`: SET NX + INSERT + SET, under the same gunicorn line, worker class,
workers and threads), then runs the same wrk load against each in turn (a warm-up of each,
then ``--rounds`` alternating runs: real, calibration, real, ...). It reports both servers'
POST/s with p50/p99, the ratio real/calibration (median POST/s over median POST/s), and the
Redis commands per POST of each (INFO commandstats of the private Redis, which only the
server under load uses); ``--profile`` adds a py-spy run of each server's workers under the
same load after the timed rounds (``--gil``: the Python CPU, not the threads waiting in C)::

    python -m bench.memory_load --compare --seconds 15 --concurrency 16 \
        --database-url postgresql://postgres@127.0.0.1:5432/ibex_bench_memsvc [--json] [--profile]

Example (the service under gunicorn from the Procfile line)::

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/ibex_test_mem ibex migrate
    DATABASE_URL=... REDIS_URL=redis://127.0.0.1:6379/14 PORT=8765 \\
        gunicorn --bind 0.0.0.0:8765 --workers 4 --threads 2 memory_service.wsgi:application
    DATABASE_URL=... python -m bench.memory_load --url http://127.0.0.1:8765 --tool wrk
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import redis

from bench import BenchError
from bench.calibration_app import create_table
from bench.dbadmin import database_name, recreate_database
from bench.fake_embeddings import FakeEmbeddings
from bench.report import dumps, table
from bench.sampling import CpuSampler, finish_py_spy, redis_counters, start_py_spy
from bench.stack import (
    check,
    child_env,
    start_memory_service,
    start_private_redis,
    terminate_on_sigterm,
    wait_http,
)
from cli.stack.processes import ROOT, Launcher, Process, Procfile, free_port
from core.db import make_database
from memories.tokens import TokenStore
from sessions.store import SessionStore

MAX_SECONDS = 60

WRK_SCRIPT = """
local counter = 0
local thread_id = 0
local threads = {}
function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end
function init(args)
  thread_id = tid
end
function request()
  counter = counter + 1
  local n = RUN .. "-" .. thread_id .. "-" .. counter
  local body = '{"agent_id":"AGENT","content":"Bench memory ' .. n .. '","kind":"fact",'
    .. '"source":{"session_id":"SESSION","turn_index":1,"ordinal":0},"metadata":{}}'
  local headers = {}
  headers["Authorization"] = "Bearer TOKEN"
  headers["Content-Type"] = "application/json"
  headers["X-Idempotency-Key"] = "bench-" .. n
  return wrk.format("POST", "/v1/memories", headers, body)
end
"""


def prepare(database_url: str) -> tuple[str, uuid.UUID, uuid.UUID]:
    """An org-scoped write token, the agent to write for and the session the memories name
    as their source (it must exist: a memory's source session is a foreign key)."""
    db = make_database(database_url)
    sessions = SessionStore(db)
    org_id = sessions.ensure_org("bench")
    agent_id = sessions.ensure_agent(org_id, "bench-bot")
    session_id = sessions.create_session(org_id, agent_id, "bench-memory-load").id
    _, token = TokenStore(db).issue(org_id=org_id, name="bench", scopes=["memory:write"])
    db.close()
    return token, agent_id, session_id


def run_httpx(
    url: str, token: str, agent_id: uuid.UUID, session: uuid.UUID, seconds: float, concurrency: int
) -> None:
    run = uuid.uuid4().hex[:8]
    session_id = str(session)
    deadline = time.monotonic() + seconds
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def worker(worker_id: int) -> None:
        mine: list[float] = []
        codes: Counter[int] = Counter()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                tag = f"{run}-{worker_id}-{n}"
                body = {
                    "agent_id": str(agent_id),
                    "content": f"Bench memory {tag}",
                    "kind": "fact",
                    "source": {"session_id": session_id, "turn_index": 1, "ordinal": 0},
                    "metadata": {},
                }
                start = time.perf_counter()
                response = client.post(
                    "/v1/memories", json=body, headers={"X-Idempotency-Key": f"bench-{tag}"}
                )
                mine.append(time.perf_counter() - start)
                codes[response.status_code] += 1
        with lock:
            latencies.extend(mine)
            statuses.update(codes)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    print(f"tool=httpx concurrency={concurrency} seconds={elapsed:.1f}")
    print(f"requests={len(latencies)} statuses={dict(statuses)}")
    print(f"throughput={len(latencies) / elapsed:.0f} req/s")
    print(
        f"latency_ms p50={pct(0.50):.1f} p90={pct(0.90):.1f} p99={pct(0.99):.1f}"
        f" max={latencies[-1] * 1000:.1f} mean={statistics.fmean(latencies) * 1000:.1f}"
    )


def wrk_script(token: str, agent_id: uuid.UUID, session_id: uuid.UUID) -> str:
    """The Lua script of a run: a fresh run tag, so a fresh key and content per POST."""
    return f'local RUN = "{uuid.uuid4().hex[:8]}"\n' + WRK_SCRIPT.replace(
        "AGENT", str(agent_id)
    ).replace("SESSION", str(session_id)).replace("TOKEN", token)


def wrk_command(seconds: float, connections: int, threads: int, script: str, url: str) -> list[str]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise BenchError("wrk is not installed (apt-get install -y wrk), or use --tool httpx")
    return [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, int(seconds))}s", "--latency",
            "-s", script, url]  # fmt: skip


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise BenchError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def parse_wrk(output: str) -> dict[str, Any]:
    """Requests, requests/s, latency percentiles (ms) and non-2xx count of ``wrk --latency``."""
    total = re.search(r"(\d+) requests in ([\d.]+)(\w+)", output)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if total is None or rate is None:
        raise BenchError(f"unexpected wrk output:\n{output}")
    latency = {
        f"p{m.group(1)}": round(_ms(m.group(2)), 2)
        for m in re.finditer(r"^\s+(50|75|90|99)%\s+(\S+)$", output, re.MULTILINE)
    }
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)$", output, re.MULTILINE)
    return {
        "requests": int(total.group(1)),
        "requests_per_s": round(float(rate.group(1)), 1),
        "latency_ms": latency,
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": errors.group(1).strip() if errors else None,
    }


def run_wrk(
    url: str,
    token: str,
    agent_id: uuid.UUID,
    session_id: uuid.UUID,
    seconds: float,
    connections: int,
    threads: int,
) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(wrk_script(token, agent_id, session_id))
        path = f.name
    try:
        command = wrk_command(seconds, connections, threads, path, url)
        print("$ " + " ".join([*command[:-3], "<script>", url]))
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    print(output)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    print(f"non_2xx={non_2xx.group(1) if non_2xx else 0}")


# -- --compare: the service against the calibration app ----------------------------------------

#: The pause before a run, so the requests of the previous one (wrk leaves them in flight when
#: it stops) are not counted in this one.
SETTLE_SECONDS = 0.5
#: What a wrk script needs: the token, the agent and the source session.
Load = tuple[str, uuid.UUID, uuid.UUID]
REAL_APP = "memory_service.wsgi:application"
CALIBRATION_APP = "bench.calibration_app:application"
#: Commands of the benchmark itself (its INFO reads), not of the server under load.
OWN_COMMANDS = frozenset({"info", "ping", "config|get", "config|set"})


def start_calibration(
    launcher: Launcher, env: dict[str, str], *, workers: int, threads: int
) -> tuple[Process, str]:
    """The Procfile's ``web`` line with the calibration app in place of the service's."""
    port = free_port()
    env = {**env, "PORT": str(port), "WEB_CONCURRENCY": str(workers), "WEB_THREADS": str(threads)}
    argv = Procfile.read().argv("web", env, bind_host="127.0.0.1")
    if REAL_APP not in argv:
        raise BenchError(f"the Procfile's web line does not serve {REAL_APP}")
    argv = [CALIBRATION_APP if a == REAL_APP else a for a in argv] + ["--log-level", "warning"]
    process = launcher.start("calibration", argv, env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", launcher)
    return process, url


def _commands(client: redis.Redis) -> Counter[str]:
    per = redis_counters(client)["per_command"]
    return Counter({k: v for k, v in per.items() if k not in OWN_COMMANDS})


def measured_run(
    launcher: Launcher,
    client: redis.Redis,
    server: Process,
    url: str,
    load: Load,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One wrk run against ``url`` (its own script: keys and contents never seen before), with
    the Redis commands and the CPU (the server's processes, the database's backends) per
    request it caused."""
    script = launcher.folder / "post.lua"
    script.write_text(wrk_script(*load))
    time.sleep(SETTLE_SECONDS)
    cpu = CpuSampler()
    cpu.add_tree("server", [server.pid])
    cpu.add_postgres("postgres", database_name(args.database_url))
    before = _commands(client)
    cpu.begin()
    command = wrk_command(args.seconds, args.concurrency, args.wrk_threads, str(script), url)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    spent_cpu = cpu.end()
    if done.returncode != 0:
        raise BenchError(f"wrk failed: {done.stderr.strip() or done.stdout.strip()}")
    check(launcher)
    result = parse_wrk(done.stdout)
    spent = _commands(client)
    spent.subtract(before)
    n = max(1, result["requests"])
    result["cpu_ms_per_request"] = {k: round(1000 * v / n, 3) for k, v in spent_cpu.items()}
    result["redis_commands_per_request"] = round(sum(spent.values()) / n, 2)
    result["redis_per_command"] = {
        k: round(v / n, 2) for k, v in sorted(spent.items()) if round(v / n, 2) > 0
    }
    return result


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    return {
        "requests_per_s": median([r["requests_per_s"] for r in runs]),
        "p50_ms": median([r["latency_ms"].get("p50", 0.0) for r in runs]),
        "p99_ms": median([r["latency_ms"].get("p99", 0.0) for r in runs]),
        "non_2xx": sum(r["non_2xx"] for r in runs),
        "cpu_ms_per_request": {
            k: median([r["cpu_ms_per_request"][k] for r in runs]) for k in ("server", "postgres")
        },
        "redis_commands_per_request": runs[-1]["redis_commands_per_request"],
        "redis_per_command": runs[-1]["redis_per_command"],
        "runs": runs,
    }


def compare(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="ibex-bench-"))
    started = time.monotonic()
    recreate_database(args.database_url)
    create_table(args.database_url)
    load = prepare(args.database_url)
    endpoint = None
    with terminate_on_sigterm(), Launcher(folder, cwd=ROOT) as children:
        redis_url = args.redis_url or start_private_redis(children)
        client = redis.Redis.from_url(redis_url)
        settings = {
            "DATABASE_URL": args.database_url,
            "REDIS_URL": redis_url,
            "EMBEDDINGS_PROVIDER": args.embeddings,
        }
        if args.embeddings == "remote":
            # An OpenAI-compatible endpoint in this process, answering after a set latency.
            endpoint = FakeEmbeddings(dimension=256, latency_ms=args.embeddings_latency_ms)
            endpoint.start()
            settings.update(
                EMBEDDINGS_PROVIDER="openai",
                EMBEDDINGS_BASE_URL=endpoint.base_url,
                EMBEDDINGS_MODEL="fake",
                EMBEDDINGS_DIMENSION="256",
            )
        env = child_env(settings)
        real, real_url = start_memory_service(
            children, env, workers=args.workers, threads=args.threads
        )
        calibration, calibration_url = start_calibration(
            children, env, workers=args.workers, threads=args.threads
        )
        servers = {"real": (real, real_url), "calibration": (calibration, calibration_url)}
        warm = argparse.Namespace(**{**vars(args), "seconds": args.warmup})
        for process, url in servers.values():
            measured_run(children, client, process, url, load, warm)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
        for _ in range(args.rounds):
            for name, (process, url) in servers.items():
                runs[name].append(measured_run(children, client, process, url, load, args))
        profiles: dict[str, Any] = {}
        if args.profile:
            for name, (process, url) in servers.items():
                spy = start_py_spy(children, name, process.pid, args.seconds, gil=True)
                time.sleep(1.0)  # py-spy attaches to every worker before the load starts
                measured_run(children, client, process, url, load, args)
                profiles[name] = finish_py_spy(children, spy)
        client.close()
    embedding_requests = None
    if endpoint is not None:
        endpoint.stop()
        created = sum(r["requests"] for r in runs["real"])
        embedding_requests = {
            "latency_ms": args.embeddings_latency_ms,
            # Over the whole run (warm-up and profile included), against the timed POSTs.
            "requests": endpoint.requests,
            "texts": endpoint.texts,
            "texts_per_request": round(endpoint.texts / endpoint.requests, 1)
            if endpoint.requests
            else None,
            "timed_posts": created,
        }
    real_summary, calibration_summary = _summary(runs["real"]), _summary(runs["calibration"])
    ratios = [
        round(r["requests_per_s"] / c["requests_per_s"], 3)
        for r, c in zip(runs["real"], runs["calibration"], strict=True)
        if c["requests_per_s"]
    ]
    return {
        "benchmark": "memory_load_compare",
        "settings": {
            "database": database_name(args.database_url),
            "seconds": args.seconds,
            "warmup_seconds": args.warmup,
            "rounds": args.rounds,
            "connections": args.concurrency,
            "wrk_threads": args.wrk_threads,
            "workers": args.workers,
            "threads": args.threads,
            "embeddings": args.embeddings,
            "embedding_endpoint": embedding_requests,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "logs": str(folder),
        },
        "real": real_summary,
        "calibration": calibration_summary,
        "ratio": (
            round(real_summary["requests_per_s"] / calibration_summary["requests_per_s"], 3)
            if calibration_summary["requests_per_s"]
            else None
        ),
        "ratio_per_round": ratios,
        "profiles": profiles,
        "seconds": round(time.monotonic() - started, 1),
    }


HEADERS = ["server", "POST/s", "p50 ms", "p99 ms", "non-2xx", "CPU ms/POST (server + Postgres)",
           "Redis cmds/POST", "by command"]  # fmt: skip


def render_compare(document: dict[str, Any]) -> str:
    rows = []
    for name in ("real", "calibration"):
        side = document[name]
        per = ", ".join(f"{k} {v:g}" for k, v in side["redis_per_command"].items())
        cpu = side["cpu_ms_per_request"]
        rows.append([name, side["requests_per_s"], side["p50_ms"], side["p99_ms"],
                     side["non_2xx"], f"{cpu['server']:.2f} + {cpu['postgres']:.2f}",
                     side["redis_commands_per_request"], per])  # fmt: skip
    out = [
        table(HEADERS, rows),
        "",
        f"ratio real/calibration: {document['ratio']} (per round: {document['ratio_per_round']})",
    ]
    for name, profile in document["profiles"].items():
        if profile.get("available"):
            out.append(f"profile {name} ({profile['samples']} samples): {profile['file']}")
            out.extend(f"  {pct:5.1f}%  {what}" for what, pct in profile["self_top_pct"].items())
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--tool", choices=("httpx", "wrk"), default="httpx")
    parser.add_argument("--concurrency", type=int, default=16, help="httpx threads / wrk conns")
    parser.add_argument("--wrk-threads", type=int, default=2)
    compare_options = parser.add_argument_group("--compare (wrk, servers started here)")
    compare_options.add_argument("--compare", action="store_true",
                                 help="the service against the calibration app")  # fmt: skip
    compare_options.add_argument("--rounds", type=int, default=3)
    compare_options.add_argument("--warmup", type=float, default=3, help="seconds per server")
    compare_options.add_argument("--workers", type=int, default=4, help="WEB_CONCURRENCY")
    compare_options.add_argument("--threads", type=int, default=2, help="WEB_THREADS")
    compare_options.add_argument("--redis-url", help="default: a private redis-server")
    compare_options.add_argument(
        "--embeddings",
        choices=("local", "none", "remote"),
        default="local",
        help="the memory service's EMBEDDINGS_PROVIDER: local (the default, a vector embedded"
        " in process with each POST), none (no vectors: what the vector costs a POST) or"
        " remote (openai, against a fake endpoint in this process: --embeddings-latency-ms)",
    )
    compare_options.add_argument(
        "--embeddings-latency-ms",
        type=int,
        default=50,
        help="with --embeddings remote: the endpoint's latency per request",
    )
    compare_options.add_argument("--profile", action="store_true", help="py-spy each server")
    compare_options.add_argument("--json", action="store_true", help="a JSON document")
    compare_options.add_argument("--log-dir", help="the servers' logs (default: a temp folder)")
    args = parser.parse_args()
    if not args.database_url:
        sys.exit("set DATABASE_URL (or --database-url) to the service's database")
    args.seconds = min(args.seconds, MAX_SECONDS)
    if args.compare:
        if not re.search(r"bench|test", database_name(args.database_url)):
            sys.exit("--compare drops and recreates its database: name one with bench or test")
        try:
            document = compare(args)
        except KeyboardInterrupt:
            sys.exit("interrupted; every process started was stopped")
        except BenchError as exc:
            sys.exit(f"bench.memory_load: {exc}")
        print(dumps(document) if args.json else render_compare(document))
        return
    host = urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("this benchmark only targets loopback")
    token, agent_id, session_id = prepare(args.database_url)
    try:
        if args.tool == "wrk":
            run_wrk(
                args.url,
                token,
                agent_id,
                session_id,
                args.seconds,
                args.concurrency,
                args.wrk_threads,
            )
        else:
            run_httpx(args.url, token, agent_id, session_id, args.seconds, args.concurrency)
    except BenchError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    main()
