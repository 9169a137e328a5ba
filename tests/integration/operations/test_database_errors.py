"""Every command that needs the database reports an unreachable, unmigrated or not fully
migrated database in one line that says what to do, never with a traceback."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import main

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

#: One invocation of every command that needs the database.
COMMANDS = [
    ["status"],
    ["token", "list"],
    ["token", "create", "--service", "--scope", "memory:read"],
    ["scan"],
    ["dlq", "list"],
    ["extract"],
    ["import", "-"],
]

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/ibex"


@pytest.fixture
def empty_database(postgres_server) -> Iterator[str]:
    """A database that exists and was never migrated."""
    url = postgres_server.create("unmigrated")
    yield url
    postgres_server.drop(url)


def _run(monkeypatch, capsys, url: str, argv: list[str], redis_url: str) -> tuple[int, str]:
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("MEMORY_SERVICE_TOKEN", "ibex_unused")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = main(argv)
    out = capsys.readouterr()
    assert out.out == ""
    return code, out.err


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a))
def test_unmigrated_database_gets_one_line_saying_run_migrate(
    argv, empty_database, monkeypatch, capsys, redis_server_url
) -> None:
    code, err = _run(monkeypatch, capsys, empty_database, argv, redis_server_url)
    assert code == 1
    assert err.count("\n") == 1, err
    assert err.startswith(f"ibex {argv[0]}: ")
    assert "never migrated" in err and "run `ibex migrate`" in err


@pytest.mark.parametrize("argv", [*COMMANDS, ["migrate"]], ids=lambda a: " ".join(a))
def test_unreachable_database_gets_one_line(argv, monkeypatch, capsys, redis_server_url) -> None:
    code, err = _run(monkeypatch, capsys, UNREACHABLE, argv, redis_server_url)
    assert code == 1
    assert err.count("\n") == 1, err
    assert "cannot connect to the database at 127.0.0.1:1/ibex" in err
    assert "check DATABASE_URL" in err and "run `ibex migrate`" in err


def test_pending_migrations_are_named_then_migrate_fixes_them(
    empty_database, monkeypatch, capsys, redis_server_url
) -> None:
    import psycopg2

    from core.migrate import load_migrations, migrate

    migrations = load_migrations()
    assert len(migrations) >= 2
    # The database as an older release left it: every migration but the last applied.
    migrate(empty_database)
    conn = psycopg2.connect(empty_database)
    with conn, conn.cursor() as cur:
        cur.execute(
            "DELETE FROM public.ibex_schema_migrations WHERE version = %s",
            (migrations[-1].version,),
        )
    conn.close()
    code, err = _run(monkeypatch, capsys, empty_database, ["status"], redis_server_url)
    assert code == 1 and err.count("\n") == 1
    assert f"missing 1 of {len(migrations)} migrations ({migrations[-1].name})" in err
    assert "run `ibex migrate`" in err


def test_real_cli_prints_no_traceback(empty_database, redis_server_url) -> None:
    env = {**os.environ, "REDIS_URL": redis_server_url}
    for url, expected in ((empty_database, "never migrated"), (UNREACHABLE, "cannot connect")):
        env["DATABASE_URL"] = url
        done = subprocess.run(
            [str(BIN / "ibex"), "status"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1 and expected in done.stderr
        assert "run `ibex migrate`" in done.stderr
