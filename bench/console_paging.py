"""Console paging: the person page over 10,000 memories and the conversation page over a
session of 1,000 turns, through the real HTTP server (the Procfile's ``web`` line).

``python -m bench.console_paging [--memories N] [--turns N] [--pages N] [--database-url URL]
[--json]``

1. Recreates the database ``--database-url`` names (default ``ibex_bench_console`` on the local
   server) and migrates it; ``ibex import`` stores one session of ``--turns`` turns for person
   ``dana``; one ``INSERT ... SELECT generate_series`` adds ``--memories`` memories of dana
   (sourced from that session's turns, ten per turn).
2. Starts the memory service (2 workers x 4 threads), signs in to the console with an org
   token, and times, one request at a time: the person page walked through ``--pages`` pages by
   its "next" links (keyset cursors, 50 memories each), then the same walk filtered by one kind;
   the conversation page at ``--pages`` offsets spread over the whole session (50 turns each,
   their states and the memories each produced).
3. Prints p50/p95/max per page kind with the machine's load (``uptime``) before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.dbadmin import admin_connection, recreate_database
from bench.stack import child_env, ibex, start_memory_service
from cli.stack.processes import ROOT, Launcher

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench_console"
SCOPES = ["memory:read", "sessions:read", "memory:admin"]
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
NEXT = re.compile(r'<a rel="next" href="([^"]+)"')

MEMORIES_SQL = """
SET synchronous_commit = off;
INSERT INTO ibex_memory.memories
    (org_id, agent_id, user_id, session_id, turn_index, ordinal, content, content_hash, kind,
     created_at)
SELECT s.org_id, s.agent_id, s.user_id, s.id, 1 + (g - 1) %% %(turns)s, (g - 1) / %(turns)s,
       'The user mentioned item number ' || g || ' of their long list.', md5(g::text),
       (ARRAY['fact','preference','event','other'])[1 + g %% 4],
       now() - make_interval(secs => %(memories)s - g)
  FROM ibex_core.sessions s, generate_series(1, %(memories)s) g
 WHERE s.external_id = 'long';
ANALYZE ibex_memory.memories;
"""


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def seed(url: str, memories: int, turns: int) -> str:
    """The data set; returns an org token for the console (printed nowhere)."""
    recreate_database(url)
    line = {
        "org": "acme",
        "agent": "bot",
        "session": "long",
        "user": "dana",
        "status": "completed",
        "turns": [
            {
                "messages": [{"role": "user", "content": f"Turn {i}: I like item {i}."}],
                "completion": {"role": "assistant", "content": f"Noted item {i}."},
            }
            for i in range(1, turns + 1)
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as out:
        out.write(json.dumps(line) + "\n")
    try:
        done = subprocess.run(
            ibex("import", out.name),
            env=child_env({"DATABASE_URL": url}),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        os.unlink(out.name)
    if done.returncode != 0:
        raise SystemExit(f"ibex import failed: {done.stderr.strip()}")
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(MEMORIES_SQL, {"memories": memories, "turns": turns})
            cur.execute("SELECT id FROM ibex_core.orgs WHERE slug = 'acme'")
            org_id = cur.fetchone()[0]
    finally:
        conn.close()
    from core.db import make_database
    from memories.tokens import TokenStore
    from models import bind

    db = bind(make_database(url))
    try:
        return TokenStore(db).issue(org_id=org_id, name="console bench", scopes=SCOPES)[1]
    finally:
        db.close()


def sign_in(client: httpx.Client, token: str) -> None:
    page = client.get("/console/signin")
    nonce = CSRF.search(page.text)
    assert nonce is not None
    answer = client.post("/console/signin", data={"csrf": nonce.group(1), "token": token})
    if answer.status_code != 303:
        raise SystemExit(f"sign-in failed: {answer.status_code}")


def timed(client: httpx.Client, path: str) -> tuple[float, str]:
    start = time.perf_counter()
    answer = client.get(path)
    elapsed = (time.perf_counter() - start) * 1000
    if answer.status_code != 200:
        raise SystemExit(f"GET {path}: {answer.status_code}")
    return elapsed, answer.text


def walk(client: httpx.Client, first: str, pages: int) -> list[float]:
    """Follow the "next" links from ``first`` for ``pages`` pages; each page's time in ms."""
    times, path = [], first
    for _ in range(pages):
        elapsed, text = timed(client, path)
        times.append(elapsed)
        found = NEXT.search(text)
        if found is None:
            break
        path = found.group(1).replace("&amp;", "&")
    return times


def figures(times: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "requests": len(ordered),
        "p50_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(p95, 1),
        "max_ms": round(ordered[-1], 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = uptime()
    token = seed(args.database_url, args.memories, args.turns)
    with Launcher(Path(tempfile.mkdtemp(prefix="console-bench-")), cwd=ROOT) as launcher:
        env = child_env(
            {"DATABASE_URL": args.database_url, "REDIS_URL": args.redis_url,
             "EMBEDDINGS_PROVIDER": "none"}
        )  # fmt: skip
        _, base = start_memory_service(launcher, env, workers=2, threads=4)
        with httpx.Client(base_url=base, timeout=30) as client:
            sign_in(client, token)
            timed(client, "/console/person?agent=bot&user=dana")  # warm-up
            person = walk(client, "/console/person?agent=bot&user=dana", args.pages)
            kind = walk(client, "/console/person?agent=bot&user=dana&kind=event", args.pages)
            session_id = re.search(
                r'href="/console/conversations/([0-9a-f-]{36})"',
                client.get("/console/conversations").text,
            )
            assert session_id is not None
            path = f"/console/conversations/{session_id.group(1)}"
            step = max(1, args.turns // args.pages)
            session = [
                timed(client, f"{path}?after={after}")[0] for after in range(0, args.turns, step)
            ]
    return {
        "memories": args.memories,
        "turns": args.turns,
        "person_page": figures(person),
        "person_page_one_kind": figures(kind),
        "conversation_page": figures(session),
        "load_before": load_before,
        "load_after": uptime(),
    }


def render(doc: dict[str, Any]) -> str:
    lines = [f"console paging: {doc['memories']} memories of one person, {doc['turns']} turns"]
    for name in ("person_page", "person_page_one_kind", "conversation_page"):
        f = doc[name]
        lines.append(
            f"  {name:<22} {f['requests']:>4} pages  p50 {f['p50_ms']:>6} ms"
            f"  p95 {f['p95_ms']:>6} ms  max {f['max_ms']:>6} ms"
        )
    lines.append(f"  load before: {doc['load_before']}")
    lines.append(f"  load after:  {doc['load_after']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.console_paging", description=__doc__)
    p.add_argument("--memories", type=int, default=10_000)
    p.add_argument("--turns", type=int, default=1_000)
    p.add_argument("--pages", type=int, default=40, help="pages timed per walk")
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    doc = run(args)
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
