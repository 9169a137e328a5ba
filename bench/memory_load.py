"""POST throughput and latency of a running memory service (loopback only, bounded in time).

Creates (or reuses) an org ``bench``, its agent ``bench-bot`` and a write token in the database
the service uses, then sends ``POST /v1/memories`` with a unique idempotency key and unique
content per request for ``--seconds``, and prints requests/s and latency percentiles.

Two load generators:
- ``--tool httpx`` (default): ``--concurrency`` threads, one keep-alive httpx client each;
- ``--tool wrk``: wrk with a Lua script that makes every request unique (far less client CPU,
  which matters when the client shares two cores with the server).

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
from urllib.parse import urlparse

import httpx

from core.db import make_database
from memory_service.tokens import TokenStore
from models.store import SessionStore

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


def prepare(database_url: str) -> tuple[str, uuid.UUID]:
    """An org-scoped write token and the agent to write for."""
    db = make_database(database_url)
    sessions = SessionStore(db)
    org_id = sessions.ensure_org("bench")
    agent_id = sessions.ensure_agent(org_id, "bench-bot")
    _, token = TokenStore(db).issue(org_id=org_id, name="bench", scopes=["memory:write"])
    db.close()
    return token, agent_id


def run_httpx(url: str, token: str, agent_id: uuid.UUID, seconds: float, concurrency: int) -> None:
    run = uuid.uuid4().hex[:8]
    session_id = str(uuid.uuid4())
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


def run_wrk(
    url: str, token: str, agent_id: uuid.UUID, seconds: float, connections: int, threads: int
) -> None:
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit("wrk is not installed (apt-get install -y wrk), or use --tool httpx")
    script = f'local RUN = "{uuid.uuid4().hex[:8]}"\n' + WRK_SCRIPT.replace(
        "AGENT", str(agent_id)
    ).replace("SESSION", str(uuid.uuid4())).replace("TOKEN", token)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        command = [
            wrk,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{int(seconds)}s",
            "--latency",
            "-s",
            path,
            url,
        ]
        print("$ " + " ".join([*command[:-3], "<script>", url]))
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    print(output)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    print(f"non_2xx={non_2xx.group(1) if non_2xx else 0}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--tool", choices=("httpx", "wrk"), default="httpx")
    parser.add_argument("--concurrency", type=int, default=16, help="httpx threads / wrk conns")
    parser.add_argument("--wrk-threads", type=int, default=2)
    args = parser.parse_args()
    host = urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("this benchmark only targets loopback")
    if not args.database_url:
        sys.exit("set DATABASE_URL (or --database-url) to the service's database")
    seconds = min(args.seconds, MAX_SECONDS)
    token, agent_id = prepare(args.database_url)
    if args.tool == "wrk":
        run_wrk(args.url, token, agent_id, seconds, args.concurrency, args.wrk_threads)
    else:
        run_httpx(args.url, token, agent_id, seconds, args.concurrency)


if __name__ == "__main__":
    main()
