"""``ibex migrate`` and ``ibex import`` run to the end without importing Dramatiq, the actors
or a Redis client: the interpreter's import log (``-X importtime``) of the real commands,
against the real database, names none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BROKER_MODULES = ("dramatiq", "actors", "redis")

pytestmark = pytest.mark.integration


def _imported(stderr: str) -> set[str]:
    # -X importtime writes "import time: self | cumulative | module" per import.
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _run(database_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_migrate_imports_no_broker(db, database_url: str) -> None:
    done = _run(database_url, "migrate")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "database is up to date" in done.stdout
    imported = _imported(done.stderr)
    assert "cli.migrate" in imported and "core.migrate" in imported
    loaded = sorted(m for m in imported if m.split(".")[0] in BROKER_MODULES)
    assert loaded == []


def test_import_imports_no_broker(db, database_url: str, tmp_path: Path) -> None:
    record = {
        "org": "acme",
        "agent": "support-bot",
        "session": "conv-imports",
        "status": "completed",
        "turns": [
            {
                "messages": [{"role": "user", "content": "hello"}],
                "completion": {"role": "assistant", "content": "hi"},
            }
        ],
    }
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(record) + "\n")
    done = _run(database_url, "import", "--json", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["turns_added"] == 1
    imported = _imported(done.stderr)
    assert "sessions.importer" in imported
    loaded = sorted(m for m in imported if m.split(".")[0] in BROKER_MODULES)
    assert loaded == []
