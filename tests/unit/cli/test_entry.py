"""The console script's entry: the command, then the process's objects frozen out of the
garbage collector before the interpreter's teardown (which would otherwise walk them all)."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

import cli

ROOT = Path(__file__).resolve().parents[3]


def test_the_entry_runs_the_command_then_freezes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli, "main", lambda: calls.append("main") or 3)
    monkeypatch.setattr(cli.gc, "freeze", lambda: calls.append("freeze"))
    assert cli.entry() == 3
    assert calls == ["main", "freeze"]


def test_a_command_that_raises_leaves_the_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fails() -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "main", fails)
    monkeypatch.setattr(cli.gc, "freeze", lambda: calls.append("freeze"))
    with pytest.raises(RuntimeError):
        cli.entry()
    assert calls == []


def test_the_console_script_and_python_m_cli_go_through_the_entry() -> None:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    scripts = setup["options.entry_points"]["console_scripts"].split()
    assert scripts == ["ibex", "=", "cli:entry"]
    # A fresh interpreter: a usage error exits 2 through python -m cli, and after a command
    # the objects of its imports are frozen.
    done = subprocess.run(
        [sys.executable, "-m", "cli", "no-such-command"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
    probe = "import gc, cli; cli.main = lambda: 0; print(cli.entry(), gc.get_freeze_count())"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    status, frozen = done.stdout.split()
    assert status == "0"
    assert int(frozen) > 1000
