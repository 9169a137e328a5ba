"""The suite keeps to its own servers and databases: a configured server that does not answer
is reported (never silently replaced), a Redis database holding someone else's keys is refused,
and databases left by a dead run are swept while a live run's are kept."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg2
import pytest
import redis

from cli.stack.processes import free_port
from tests.servers import (
    DB_COMMENT_PREFIX,
    REDIS_OWNER_KEY,
    RunPostgres,
    RunRedis,
    ServerUnavailable,
)


def test_a_configured_postgres_that_does_not_answer_is_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("IBEX_TEST_DATABASE_URL", f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    monkeypatch.delenv("IBEX_TEST_SERVERS", raising=False)
    with pytest.raises(ServerUnavailable, match="does not answer"):
        RunPostgres.find(tmp_path)


def test_a_configured_redis_database_with_foreign_keys_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
        client.set("somebody-elses-key", "1")
        monkeypatch.setenv("IBEX_TEST_REDIS_URL", redis_url)
        with pytest.raises(ServerUnavailable, match="did not write"):
            RunRedis.find(tmp_path)
        assert client.get("somebody-elses-key") == b"1"  # untouched
        # An empty one is taken, and marked as the suite's.
        client.flushdb()
        found = RunRedis.find(tmp_path)
        assert found.url == redis_url and found.private is None
        assert client.exists(REDIS_OWNER_KEY)
        # Marked: a later run may take it again even though it holds keys.
        client.set("left-by-a-test", "1")
        assert RunRedis.find(tmp_path).url == redis_url
    finally:
        client.flushdb()
        client.close()


def _admin(server: RunPostgres):  # type: ignore[no-untyped-def]
    from core.db import connect_params
    from tests.servers import with_database

    conn = psycopg2.connect(**connect_params(with_database(server.server_url, "postgres")))  # type: ignore[arg-type]
    conn.autocommit = True
    return conn


def test_only_databases_of_dead_runs_are_swept(
    postgres_server: RunPostgres, database_url: str
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        "dead": f"ibex_sweep_{os.getpid()}_dead",
        "alive": f"ibex_sweep_{os.getpid()}_alive",
    }
    conn = _admin(postgres_server)
    host = socket.gethostname()
    try:
        with conn.cursor() as cur:
            for key, pid in (("dead", dead.pid), ("alive", os.getppid())):
                cur.execute(f'CREATE DATABASE "{names[key]}"')
                cur.execute(
                    f'COMMENT ON DATABASE "{names[key]}" IS %s',
                    (f"{DB_COMMENT_PREFIX} host={host} pid={pid}",),
                )
        swept = postgres_server.sweep()
        assert names["dead"] in swept and names["alive"] not in swept
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname LIKE 'ibex_sweep_%%'")
            left = {row[0] for row in cur.fetchall()}
        assert left == {names["alive"]}
        # The run's own databases are never swept.
        assert postgres_server.created and not set(postgres_server.created) & set(swept)
    finally:
        with conn.cursor() as cur:
            for name in names.values():
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def test_the_run_names_why_it_took_its_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first and last lines say whether the embedded server was asked for or taken because
    nothing answered at the default URL, and name IBEX_TEST_DATABASE_URL even when unset."""
    import tests.servers as servers

    silent = f"postgresql://postgres@127.0.0.1:{free_port()}/ibex_test"
    monkeypatch.setattr(servers, "DEFAULT_DATABASE_URL", silent)
    monkeypatch.delenv("IBEX_TEST_DATABASE_URL", raising=False)
    monkeypatch.delenv("IBEX_TEST_SERVERS", raising=False)
    fallback = servers.postgres_choice()
    assert fallback.kind == "embedded"
    assert fallback.reason == (
        "IBEX_TEST_DATABASE_URL unset and none answered at its default"
        f" {silent.split('@')[1].split('/')[0]}"
    )
    monkeypatch.setenv("IBEX_TEST_SERVERS", "embedded")
    asked = servers.postgres_choice()
    assert asked.kind == "embedded"
    assert asked.reason == "asked for by IBEX_TEST_SERVERS=embedded"
    assert "answered" not in asked.reason
    monkeypatch.delenv("IBEX_TEST_SERVERS")
    monkeypatch.setenv("IBEX_TEST_DATABASE_URL", silent)
    assert servers.postgres_choice().kind == "unavailable"


def test_the_embedded_postgres_has_the_production_extensions_and_log() -> None:
    """pg_trgm, btree_gin and vector load, and the statement log the benchmarks count from is
    where they look for it, its lines naming user@database. (Not under pytest's temp root:
    every pytest start resets it to owner-only, and root runs the server as another user.)"""
    from bench.dbadmin import StatementLog
    from cli.stack.embedded import EmbeddedPostgres
    from tests.servers import temp_folder

    folder = temp_folder()
    server = EmbeddedPostgres(folder / "postgres")
    conn = psycopg2.connect(server.start())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for extension in ("pg_trgm", "btree_gin", "vector"):
                cur.execute(f"CREATE EXTENSION {extension}")
            cur.execute("CREATE TABLE t (agent int, content text)")
            cur.execute("CREATE INDEX ON t USING gin (agent, content gin_trgm_ops)")
            cur.execute("SELECT similarity('jazz', 'jaz'), '[1,2]'::vector <-> '[1,3]'::vector")
            assert cur.fetchone() == (0.5, 1.0)
            cur.execute("CREATE DATABASE counted")
        log = StatementLog(conn, "counted")
        assert log.available, log.path
        log.enable()
        log.mark()
        counted_conn = psycopg2.connect(server.url.replace("/postgres?", "/counted?"))
        try:
            with counted_conn.cursor() as cur:
                cur.execute("SELECT 1")
        finally:
            counted_conn.close()
        deadline = time.monotonic() + 5
        while (found := log.count()) is not None and not found[0] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert found is not None and sum(found[0].values()) >= 1, found
    finally:
        conn.close()
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_embedded_postgres_loads_its_buffers_back_after_a_restart() -> None:
    """pg_prewarm is preloaded: the pages a table had in shared buffers at a stop are in them
    again after the next start (read by a scan as hits, none from outside), where a server
    without it would read them all from the OS."""
    from cli.stack.embedded import EmbeddedPostgres
    from tests.servers import temp_folder

    folder = temp_folder()
    server = EmbeddedPostgres(folder / "postgres")

    def scan_buffers(url: str) -> str:
        """The scan's own ``Buffers:`` line (not the planner's catalog reads)."""
        conn = psycopg2.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM t")
                lines = [line.strip() for (line,) in cur.fetchall()]
        finally:
            conn.close()
        assert lines[0].startswith("Seq Scan on t"), lines
        return lines[1]

    try:
        url = server.start()
        conn = psycopg2.connect(url)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW shared_preload_libraries")
                assert cur.fetchone()[0] == "pg_prewarm"
                cur.execute("CREATE TABLE t AS SELECT g, repeat('x', 200) AS pad"
                            " FROM generate_series(1, 20000) g")  # fmt: skip
        finally:
            conn.close()
        assert "shared hit=" in scan_buffers(url)
        server.stop()  # autoprewarm writes the list of pages the buffers held
        assert (folder / "postgres" / "autoprewarm.blocks").is_file()
        url = server.start()
        waited = server.wait_for_prewarm(timeout=60)
        assert waited < 60
        after = scan_buffers(url)
        assert "shared hit=" in after and "read=" not in after, after
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_data_folder_of_another_postgres_major_is_refused_with_a_hint(tmp_path: Path) -> None:
    """An ``ibex demo`` folder made by PostgreSQL 16 (pgserver) is not handed to 18's pg_ctl."""
    from cli.stack.embedded import EmbeddedPostgres
    from core.errors import ConfigError

    folder = tmp_path / "postgres"
    folder.mkdir()
    (folder / "PG_VERSION").write_text("16\n")
    with pytest.raises(ConfigError, match=r"made by PostgreSQL 16.*PostgreSQL 18.*--fresh"):
        EmbeddedPostgres(folder).start()
    assert sorted(p.name for p in folder.iterdir()) == ["PG_VERSION"]  # nothing started
