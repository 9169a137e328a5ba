"""End to end with real processes: ``ibex import`` of a generated file, the memory service (the
Procfile's ``web`` line), a fake OpenAI-compatible LLM, ``dramatiq actors`` workers (the
``worker`` line), both started by :mod:`cli.stack.processes`, ``ibex scan``; the workers are killed
with SIGKILL mid-run and restarted, scans recover the lost work, and every invariant of the
pipeline is checked from the database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fake_embeddings import FakeEmbeddings
from bench.fake_llm import FakeLLM
from cli.stack.processes import ROOT, Launcher, Process, free_port
from memory_service.tokens.store import TokenStore

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

BIN = Path(sys.executable).parent
SESSIONS, TURNS, MEMORIES = 8, 5, 2


@pytest.fixture
def stack(db: Any, database_url: str, redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Memory service (the Procfile's web line), fake LLM, the environment of every process,
    and the launcher that stops every process a test starts."""
    _, token = TokenStore(db).issue(org_id=None, name="pipeline", scopes=["memory:write"])
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "IBEX_"))},
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PORT": str(port),
        "WEB_CONCURRENCY": "2",
        "WEB_THREADS": "4",
        "MEMORY_SERVICE_URL": f"http://127.0.0.1:{port}",
        "MEMORY_SERVICE_TOKEN": token,
        "WORKER_PROCESSES": "2",
        "WORKER_THREADS": "4",
        "MAX_RETRIES": "8",
        "RETRY_MIN_BACKOFF_MS": "50",
        "RETRY_MAX_BACKOFF_MS": "500",
        "EXTRACTION_LEASE_SECONDS": "4",
        "EXTRACTION_CLAIM_SECONDS": "3",
        "LLM_TIMEOUT_SECONDS": "5",
        "HTTP_TIMEOUT_SECONDS": "5",
    }
    # The vectors come from the project's fake embeddings server, which counts requests.
    embeddings = FakeEmbeddings(dimension=16).start()
    env.update(
        {
            "EMBEDDINGS_PROVIDER": "openai",
            "EMBEDDINGS_BASE_URL": embeddings.base_url,
            "EMBEDDINGS_MODEL": "fake",
            "EMBEDDINGS_DIMENSION": "16",
        }
    )
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("web", env, bind_host="127.0.0.1")
        llm = FakeLLM(latency_ms=250, memories=MEMORIES).start()
        env.update({"LLM_PROVIDER": "openai", "LLM_BASE_URL": llm.base_url, "LLM_MODEL": "fake"})
        try:
            launcher.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=20)
            yield {
                "env": env,
                "llm": llm,
                "tmp": tmp_path,
                "launcher": launcher,
                "embeddings": embeddings,
            }
        finally:
            llm.stop()
            embeddings.stop()


def _ibex(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ibex"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _start_worker(launcher: Launcher, env: dict[str, str]) -> Process:
    """The Procfile's worker line; its log is ``worker.log`` in the launcher's folder."""
    return launcher.start_procfile("worker", env)


def _write_sessions(path: Path) -> None:
    with path.open("w") as out:
        for s in range(SESSIONS):
            turns = [
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": f"Remember that user {s} has lucky number {s * 100 + t}.",
                        }
                    ],
                    "completion": {"role": "assistant", "content": "Noted."},
                }
                for t in range(TURNS)
            ]
            line = {
                "org": "acme" if s % 2 else "globex",
                "agent": f"bot{s % 3}",
                "session": f"conv-{s}",
                "turns": turns,
            }
            out.write(json.dumps(line) + "\n")


def _progress(db: Any) -> tuple[int, int]:
    done, pointer_sum = db.execute_sql(
        "SELECT (SELECT count(*) FROM ibex_core.extraction_turns WHERE state = 'done'),"
        "       (SELECT COALESCE(sum(last_extracted_turn), 0) FROM ibex_core.sessions)"
    ).fetchone()
    return int(done), int(pointer_sum)


def _extracted(db: Any) -> int:
    return int(
        db.execute_sql(
            "SELECT count(*) FROM ibex_core.extraction_turns WHERE result IS NOT NULL"
        ).fetchone()[0]
    )


def test_workers_killed_mid_run_recover_and_end_with_every_invariant(
    stack: dict[str, Any], db: Any
) -> None:
    env, llm, tmp, launcher = stack["env"], stack["llm"], stack["tmp"], stack["launcher"]
    total = SESSIONS * TURNS
    data = tmp / "sessions.jsonl"
    _write_sessions(data)
    imported = _ibex(env, "import", str(data))
    assert imported.returncode == 0, imported.stderr

    started = time.monotonic()
    worker = _start_worker(launcher, env)
    try:
        scan = _ibex(env, "scan", "--json")
        assert scan.returncode == 0, scan.stderr
        assert json.loads(scan.stdout)["turns"] == total

        # Kill every worker process (master and children) with SIGKILL mid-run: while LLM
        # calls are in flight, after some turns were extracted.
        deadline = time.monotonic() + 20
        while _extracted(db) < total // 4:
            assert time.monotonic() < deadline, worker.log_tail(3000)
            time.sleep(0.05)
        worker.kill()
        launcher.forget(worker)
        done_at_kill, extracted_at_kill = _progress(db)[0], _extracted(db)
        assert extracted_at_kill < total, "every turn was extracted before the kill"
        # Turns whose LLM answer died with the killed threads: claimed, nothing persisted.
        lost_answers = int(
            db.execute_sql(
                "SELECT count(*) FROM ibex_core.extraction_turns"
                " WHERE claim_token IS NOT NULL AND result IS NULL"
            ).fetchone()[0]
        )

        # Restart; scans re-send whatever the kill lost once its lease has expired.
        worker = _start_worker(launcher, env)
        deadline = time.monotonic() + 35
        while _progress(db)[1] < total:
            assert worker.alive(), worker.log_tail(3000)
            assert time.monotonic() < deadline, f"stuck at {_progress(db)}"
            time.sleep(1.0)
            _ibex(env, "scan")
        elapsed = time.monotonic() - started

        # Invariant 5: a second run sends, writes and calls nothing.
        calls_before = sum(llm.calls.values())
        again = _ibex(env, "scan", "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["turns"] == 0
    finally:
        launcher.stop_one(worker)
    assert sum(llm.calls.values()) == calls_before

    turns = db.execute_sql(
        "SELECT state::text, llm_calls, memory_count,"
        "       (SELECT count(*) FROM ibex_core.extraction_slots x"
        "         WHERE x.session_id = e.session_id AND x.turn_index = e.turn_index)"
        "  FROM ibex_core.extraction_turns e"
    ).fetchall()
    assert len(turns) == total
    assert all(state == "done" for state, *_ in turns)  # invariant 2/3: all done
    assert all(slots == count == MEMORIES for _, _, count, slots in turns)
    calls = [int(c) for _, c, _, _ in turns]
    # Invariant 4: one call per turn, except turns whose answer died with a killed thread.
    assert min(calls) == 1 and max(calls) <= 2
    assert sum(calls) == total + lost_answers
    pointers = db.execute_sql(
        "SELECT last_extracted_turn, turn_count FROM ibex_core.sessions"
    ).fetchall()
    assert all(p == n == TURNS for p, n in pointers)
    # Invariant 1: at most one memory per slot; and none lost.
    per_slot = db.execute_sql(
        "SELECT count(*) FROM ibex_memory.memories GROUP BY session_id, turn_index, ordinal"
        " HAVING count(*) > 1"
    ).fetchall()
    assert per_slot == []
    memories = int(db.execute_sql("SELECT count(*) FROM ibex_memory.memories").fetchone()[0])
    assert memories == total * MEMORIES
    assert db.execute_sql("SELECT count(*) FROM ibex_core.dead_letters").fetchone()[0] == 0
    # Vectors are paid once per persisted answer (a kill -9 between the embedding request and
    # the persist is the only repeat, as for the LLM call), never by a redelivered write;
    # every memory got its vector in the write's own statement.
    requests = stack["embeddings"].requests
    assert total <= requests <= sum(calls), (requests, sum(calls))
    vectors = int(
        db.execute_sql(
            "SELECT count(*) FROM ibex_memory.memory_embeddings WHERE model = 'openai:fake'"
        ).fetchone()[0]
    )
    assert vectors == memories
    print(
        f"\ne2e: {total} turns, {memories} memories, {sum(calls)} LLM calls"
        f" ({sum(calls) / total:.2f} per turn); SIGKILL of every worker process with"
        f" {extracted_at_kill} turns extracted, {done_at_kill} done and {lost_answers} LLM"
        f" calls in flight; {elapsed:.1f}s"
    )


def test_a_worker_without_database_url_exits_non_zero_naming_it(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL",) and not k.startswith("IBEX_")
    }
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(ROOT)})
    env.update(
        {"WORKER_PROCESSES": "1", "WORKER_THREADS": "1", "REDIS_URL": "redis://127.0.0.1:1/0"}
    )
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        worker = _start_worker(launcher, env)
        worker.popen.wait(timeout=60)
    stderr = worker.log_tail(100_000)
    assert worker.returncode not in (0, None)
    ours = [line for line in stderr.splitlines() if line.startswith("ibex worker:")]
    assert len(ours) == 1 and "DATABASE_URL" in ours[0], stderr


def test_ibex_extract_runs_the_stages_inline_and_a_second_run_does_nothing(
    stack: dict[str, Any], db: Any
) -> None:
    env, llm, tmp = stack["env"], stack["llm"], stack["tmp"]
    llm.configure(latency_ms=0)
    data = tmp / "sessions.jsonl"
    _write_sessions(data)
    assert _ibex(env, "import", str(data)).returncode == 0
    one = db.execute_sql("SELECT id FROM ibex_core.sessions ORDER BY id LIMIT 1").fetchone()[0]

    single = _ibex(env, "extract", "--session", str(one), "--json")
    assert single.returncode == 0, single.stderr
    report = json.loads(single.stdout)
    assert (report["sessions"], report["turns"], report["turns_done"]) == (1, TURNS, TURNS)
    assert report["llm_calls"] == TURNS and report["memories"] == TURNS * MEMORIES

    rest = _ibex(env, "extract", "--json")
    assert rest.returncode == 0, rest.stderr
    report = json.loads(rest.stdout)
    total = (SESSIONS - 1) * TURNS
    assert (report["turns"], report["turns_done"], report["llm_calls"]) == (total, total, total)
    assert report["memories"] == total * MEMORIES and report["failures"] == []

    again = _ibex(env, "extract", "--json")
    assert again.returncode == 0
    report = json.loads(again.stdout)
    assert (report["turns"], report["llm_calls"], report["memory_posts"]) == (0, 0, 0)
    pointers = db.execute_sql("SELECT last_extracted_turn FROM ibex_core.sessions").fetchall()
    assert all(p[0] == TURNS for p in pointers)


def test_the_scheduler_sends_scans_and_stops_cleanly_on_sigterm(
    redis_url: str, tmp_path: Path
) -> None:
    import redis

    env = {k: v for k, v in os.environ.items() if not k.startswith("IBEX_")}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "SCAN_INTERVAL_SECONDS": "1",
        }
    )
    client = redis.Redis.from_url(redis_url)
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        scheduler = launcher.start_procfile("scheduler", env)
        try:
            launcher.wait_until(
                lambda: client.llen("dramatiq:scan") >= 2, "the scheduler sent nothing", 15
            )
        finally:
            client.close()
        # SIGTERM, and the scheduler exits 0 well before the SIGKILL that would follow.
        assert launcher.stop_one(scheduler, grace=10) == 0
    assert not scheduler.group_alive()
