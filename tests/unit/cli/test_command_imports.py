"""The command line's parser and the ``migrate`` and ``import`` command modules load neither
Dramatiq nor the actors (checked in a fresh interpreter: this one has loaded both)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import sys
from cli import main as entry
from cli import COMMANDS, build_parser
parser = build_parser()
args = parser.parse_args(sys.argv[1:])
assert COMMANDS[args.command].__name__ in ("cli.migrate", "cli.imports"), args.command
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("dramatiq", "actors", "redis"))
print(",".join(loaded))
"""


@pytest.mark.parametrize(
    "argv", [["migrate"], ["import", "sessions.jsonl"], ["import", "--json", "-"]]
)
def test_parsing_migrate_and_import_loads_no_broker(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"loaded by the parser: {done.stdout.strip()}"


def test_every_command_is_a_module_of_the_cli_package() -> None:
    from cli import COMMANDS

    assert list(COMMANDS) == [
        "migrate",
        "import",
        "token",
        "user",
        "search",
        "session",
        "usage",
        "budget",
        "scan",
        "extract",
        "scheduler",
        "status",
        "dlq",
        "prune",
        "reembed",
        "demo",
        "up",
        "mcp",
    ]
    for name, module in COMMANDS.items():
        assert module.__name__.startswith("cli."), name
        assert callable(module.add_parser) and callable(module.run), name
        assert isinstance(module.DATABASE, bool), name
    assert not COMMANDS["migrate"].DATABASE and COMMANDS["import"].DATABASE
