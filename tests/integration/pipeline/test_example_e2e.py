"""``examples/chat_with_memory.py`` end to end against real processes, as a deployment runs
them: the Procfile's ``web``, ``worker`` and ``scheduler`` lines started by
:mod:`cli.stack.processes`, the rules extractor, a token from ``ibex token create``. The example
opens a session, appends two turns, completes it, polls the session until its extraction
progress is done (the scheduler's scan, then the workers), asks for context and prints it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.stack.processes import ROOT, Launcher, free_port
from memories.tokens import TokenStore
from tests.integration.procfile_env import procfile_env

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "examples" / "chat_with_memory.py"
FACTS = {
    # (turn_index, content) of every memory the rules extractor finds in the conversation.
    (1, "The user's name is Dana."),
    (1, "The user is allergic to peanuts."),
    (2, "The user lives in Lisbon."),
    (2, "The user loves hiking."),
}


@pytest.fixture
def env(db: Any, database_url: str, redis_url: str) -> dict[str, str]:
    """The environment of every process: the pipeline's service token, small pools, a scan
    every second, the rules extractor (no LLM_BASE_URL)."""
    _, service = TokenStore(db).issue(org_id=None, name="pipeline", scopes=["memory:write"])
    return procfile_env(
        database_url, redis_url, free_port(), token=service, SCAN_INTERVAL_SECONDS="1"
    )


@pytest.fixture
def stack(env: dict[str, str], tmp_path: Path) -> Iterator[Launcher]:
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("web", env, bind_host="127.0.0.1")
        launcher.start_procfile("worker", env)
        launcher.start_procfile("scheduler", env)
        launcher.wait_http(f"{env['MEMORY_SERVICE_URL']}/readyz", timeout=30)
        yield launcher


def app_token(env: dict[str, str]) -> str:
    """An application's token file, made as an operator makes it (the token alone on
    standard output)."""
    made = subprocess.run(
        [
            *(str(BIN / "ibex"), "token", "create", "--org", "acme", "--create-org"),
            *("--scope", "sessions:write", "--scope", "sessions:read", "--scope", "memory:read"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert made.returncode == 0, made.stderr
    assert len(made.stdout.splitlines()) == 1, made.stdout
    return made.stdout


def test_the_example_feeds_a_conversation_and_gets_its_memories_back(
    stack: Launcher, env: dict[str, str], db: Any
) -> None:
    token = app_token(env)
    started = time.monotonic()
    ran = subprocess.run(
        [
            *(sys.executable, str(EXAMPLE), env["MEMORY_SERVICE_URL"]),
            *("--timeout", "40", "--interval", "0.25"),
        ],
        input=token,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    logs = "".join(p.log_tail() for p in stack)
    assert ran.returncode == 0, ran.stdout + ran.stderr + logs
    assert time.monotonic() - started < 45

    out = ran.stdout
    found = re.search(
        r"^session ([0-9a-f-]{36}): 2 of 2 turns extracted \(pointer 2, 0 failed\)$",
        out,
        re.MULTILINE,
    )
    assert found, out
    session_id = found.group(1)
    block = out[out.index("<memories>") : out.index("</memories>")]
    # The context for the next conversation's first question holds every fact, the allergy
    # included, each once.
    assert sorted(block.splitlines()[1:]) == sorted(f"- {c}" for _, c in FACTS), out
    assert re.search(r"^\d+ memories, \d+ tokens, \d+ dropped$", out, re.MULTILINE), out

    # Every memory written once: one row per slot, each fact once, nothing else.
    rows = db.execute_sql(
        "SELECT turn_index, ordinal, content FROM ibex_memory.memories"
        " WHERE session_id = %s AND deleted_at IS NULL ORDER BY turn_index, ordinal",
        (session_id,),
    ).fetchall()
    assert {(t, c) for t, _, c in rows} == FACTS and len(rows) == len(FACTS)
    assert len({(t, o) for t, o, _ in rows}) == len(rows)
    turns = db.execute_sql(
        "SELECT turn_index, state::text, llm_calls, memory_count FROM ibex_core.extraction_turns"
        " WHERE session_id = %s ORDER BY turn_index",
        (session_id,),
    ).fetchall()
    assert turns == [(1, "done", 1, 2), (2, "done", 1, 2)]
    slots = db.execute_sql(
        "SELECT count(*) FROM ibex_core.extraction_slots WHERE session_id = %s", (session_id,)
    ).fetchone()[0]
    assert slots == len(FACTS)
    assert db.execute_sql("SELECT count(*) FROM ibex_core.dead_letters").fetchone()[0] == 0
