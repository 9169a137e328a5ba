"""The process launcher against the real Procfile: the ``web`` line started as production
starts it, ready when ``/healthz`` answers, paused and resumed as a group, and stopped with
nothing of its process group left behind."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest

from cli.stack.processes import ROOT, Launcher, ProcessError, ProcessExited, free_port, http_ok

pytestmark = pytest.mark.slow


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            found.append(int(entry.name))
    return found


def test_web_from_the_procfile_becomes_healthy_and_stops_as_a_group(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PORT": str(port),
        "WEB_CONCURRENCY": "2",
        "WEB_THREADS": "2",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    url = f"http://127.0.0.1:{port}/healthz"
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        web = launcher.start_procfile("web", env, bind_host="127.0.0.1")
        launcher.wait_http(url)
        # The Procfile's gunicorn: a master and WEB_CONCURRENCY workers, one group.
        members = _group(web.pid)
        assert web.pid in members and len(members) >= 3, members
        assert "BufferingThreadWorker" in " ".join(
            (Path("/proc") / str(web.pid) / "cmdline").read_bytes().decode().split("\0")
        )
        web.pause()
        try:
            assert not http_ok(url)  # every process of the group is stopped
        finally:
            web.resume()
        launcher.wait_http(url, timeout=10)
        assert httpx.get(url, timeout=2).status_code == 200
    assert launcher.processes == []
    assert web.returncode == 0  # gunicorn's graceful shutdown on SIGTERM
    assert _group(web.pid) == [] and not web.group_alive()
    assert "Shutting down" in web.log_tail()


def test_a_service_that_exits_ends_the_wait_at_once_and_is_named(tmp_path: Path) -> None:
    """A service that exits while its health is awaited fails the wait with its exit status,
    not a timeout; a process that ignores SIGTERM is killed after the grace period."""
    with Launcher(tmp_path) as launcher:
        dies = launcher.start("dies", [sys.executable, "-c", "raise SystemExit(3)"], os.environ)
        with pytest.raises(ProcessExited, match="the dies process exited with status 3"):
            launcher.wait_http(f"http://127.0.0.1:{free_port()}/healthz", timeout=30)
        launcher.forget(dies)
        stubborn = launcher.start(
            "stubborn",
            [sys.executable, "-c", "import signal, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
             "time.sleep(60)"],
            os.environ,
        )  # fmt: skip
        launcher.wait_until(lambda: "ready" in stubborn.log_tail(), "never ready", timeout=10)
        with pytest.raises(ProcessError, match="not ready within 0s"):
            launcher.wait_until(lambda: False, "not ready", timeout=0)
        assert launcher.stop_one(stubborn, grace=0.5) == -signal.SIGKILL
    assert not stubborn.group_alive()


def test_free_port_is_a_loopback_port_nothing_listens_on() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free: binding it succeeds
        sock.listen()
        assert free_port() != port  # taken now: never handed out
