"""A user's session, extracted by real processes (``ibex import``, the memory service under
gunicorn, ``dramatiq actors`` workers, ``ibex scan``, a fake OpenAI-compatible LLM), becomes
memories carrying that user; an agent-wide session's stay agent-wide. Two people saying the
same thing to one agent keep a memory each."""

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

from bench.fake_llm import FakeLLM
from core.processes import ROOT, Launcher, free_port
from memory_service.tokens.store import TokenStore

pytestmark = [pytest.mark.slow]

BIN = Path(sys.executable).parent
TURNS, MEMORIES = 2, 2
#: (session, user key or None): two people and one agent-wide session, all saying the same.
SESSIONS = [("dana-1", "dana"), ("grace-1", "grace"), ("dana-2", "dana"), ("shared-1", None)]


@pytest.fixture
def stack(db: Any, database_url: str, redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    _, token = TokenStore(db).issue(org_id=None, name="pipeline", scopes=["memory:write"])
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "IBEX_"))},
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PORT": str(port),
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "4",
        "MEMORY_SERVICE_URL": f"http://127.0.0.1:{port}",
        "MEMORY_SERVICE_TOKEN": token,
        "WORKER_PROCESSES": "1",
        "WORKER_THREADS": "4",
        "MAX_RETRIES": "3",
        "RETRY_MIN_BACKOFF_MS": "50",
        "RETRY_MAX_BACKOFF_MS": "500",
    }
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("web", env, bind_host="127.0.0.1")
        llm = FakeLLM(memories=MEMORIES).start()
        env.update({"LLM_PROVIDER": "openai", "LLM_BASE_URL": llm.base_url, "LLM_MODEL": "fake"})
        try:
            launcher.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=20)
            yield {"env": env, "tmp": tmp_path, "launcher": launcher}
        finally:
            llm.stop()


def _ibex(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ibex"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _write_sessions(path: Path) -> None:
    with path.open("w") as out:
        for session, user in SESSIONS:
            line: dict[str, Any] = {
                "org": "acme",
                "agent": "support-bot",
                "session": session,
                "turns": [
                    {
                        "messages": [{"role": "user", "content": f"I am allergic to item {t}."}],
                        "completion": {"role": "assistant", "content": "Noted."},
                    }
                    for t in range(TURNS)
                ],
            }
            if user is not None:
                line["user"] = user
            out.write(json.dumps(line) + "\n")


def test_a_users_session_is_extracted_into_memories_carrying_the_user(
    stack: dict[str, Any], db: Any
) -> None:
    env, tmp, launcher = stack["env"], stack["tmp"], stack["launcher"]
    data = tmp / "sessions.jsonl"
    _write_sessions(data)
    imported = _ibex(env, "import", str(data))
    assert imported.returncode == 0, imported.stderr
    total = len(SESSIONS) * TURNS
    worker = launcher.start_procfile("worker", env)
    try:
        scan = _ibex(env, "scan", "--json")
        assert scan.returncode == 0, scan.stderr
        assert json.loads(scan.stdout)["turns"] == total
        deadline = time.monotonic() + 60
        while True:
            (pointers,) = db.execute_sql(
                "SELECT COALESCE(sum(last_extracted_turn), 0) FROM ibex_core.sessions"
            ).fetchone()
            if int(pointers) == total:
                break
            assert worker.alive(), worker.log_tail(3000)
            assert time.monotonic() < deadline, worker.log_tail(3000)
            time.sleep(0.5)
    finally:
        launcher.stop_one(worker)

    rows = db.execute_sql(
        "SELECT s.external_id, u.external_id, m.user_id IS NOT DISTINCT FROM s.user_id,"
        "       m.content, m.deleted_at IS NULL"
        "  FROM ibex_memory.memories m"
        "  JOIN ibex_core.sessions s ON s.id = m.session_id"
        "  LEFT JOIN ibex_core.users u ON u.id = m.user_id"
        " ORDER BY 1, 4"
    ).fetchall()
    # Each memory carries its session's user: Dana's, Grace's, and none for the agent-wide
    # session. Dana's two sessions say the same: each of her memories is written once, from
    # whichever session came first, and the other session's slot is answered as its duplicate.
    assert len(rows) == (len(SESSIONS) - 1) * TURNS * MEMORIES
    assert all(same and live for _, _, same, _, live in rows)
    per_user: dict[str | None, int] = {}
    for session, user, *_ in rows:
        assert user == dict(SESSIONS)[session]
        per_user[user] = per_user.get(user, 0) + 1
    assert per_user == {"dana": TURNS * MEMORIES, "grace": TURNS * MEMORIES, None: TURNS * MEMORIES}
    assert db.execute_sql("SELECT count(*) FROM ibex_core.dead_letters").fetchone()[0] == 0
    # The same words from two people and from the agent-wide session are three memories; a
    # person repeating them in a second session is one (the duplicate is the same memory).
    per_content = db.execute_sql(
        "SELECT content, count(DISTINCT id), count(DISTINCT COALESCE(user_id::text, '-'))"
        "  FROM ibex_memory.memories GROUP BY content"
    ).fetchall()
    assert per_content and all(ids == 3 and scopes == 3 for _, ids, scopes in per_content)
    outcomes = dict(
        db.execute_sql(
            "SELECT outcome, count(*) FROM ibex_core.extraction_slots GROUP BY outcome"
        ).fetchall()
    )
    assert outcomes.get("duplicate_content") == TURNS * MEMORIES  # dana-2 repeats dana-1
    # The idempotency key stays the formula over (org, session, turn, ordinal): no user in it.
    from extraction.keys import idempotency_key

    keyed = db.execute_sql(
        "SELECT org_id, session_id, turn_index, ordinal, idempotency_key::text"
        "  FROM ibex_core.extraction_slots"
    ).fetchall()
    assert len(keyed) == total * MEMORIES
    assert all(idempotency_key(o, s, t, n) == key for o, s, t, n, key in keyed)
