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
    # Fresh interpreters, the command replaced by one that succeeds: python -m cli (its
    # __main__) and the entry itself leave the objects of the imports frozen.
    as_module = (
        "import gc, runpy, cli\n"
        "cli.main = lambda: 0\n"
        "try:\n"
        "    runpy.run_module('cli', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, gc.get_freeze_count())\n"
    )
    as_entry = "import gc, cli; cli.main = lambda: 0; print(cli.entry(), gc.get_freeze_count())"
    for probe in (as_module, as_entry):
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
        )
        status, frozen = done.stdout.split()
        assert status == "0"
        assert int(frozen) > 1000
