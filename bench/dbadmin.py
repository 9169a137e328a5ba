"""Database administration for the benchmarks: a fresh database per run, a service token,
small query helpers, and the statements Postgres executes for one database, counted from the
server log (``log_statement = 'all'`` on that database only).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg2
import psycopg2.extensions

from bench import BenchError
from core.db import connect_params

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench"
POSTGRES_LOG_FOLDER = Path("/var/log/postgresql")

#: Tables emptied between runs, children first (TRUNCATE ... CASCADE handles order anyway).
PIPELINE_TABLES = (
    "ibex_memory.memories",
    "ibex_core.dead_letters",
    "ibex_core.extraction_slots",
    "ibex_core.extraction_turns",
)
SESSION_TABLES = (
    "ibex_core.checkpoint_payloads",
    "ibex_core.checkpoints",
    "ibex_core.sessions",
    "ibex_core.agents",
    "ibex_core.orgs",
)


def _with_path(url: str, name: str) -> str:
    return urlunparse(urlparse(url)._replace(path=f"/{name}"))


def with_database(url: str, name: str) -> str:
    """``url`` naming the database ``name`` instead."""
    return _with_path(url, name)


def database_name(url: str) -> str:
    return urlparse(url).path.lstrip("/")


def admin_connection(url: str) -> psycopg2.extensions.connection:
    """An autocommit connection to ``url`` as whoever it names (a superuser: RLS bypassed)."""
    conn = psycopg2.connect(**connect_params(url))
    conn.autocommit = True
    return conn


def recreate_database(url: str) -> None:
    """Drop and create the database ``url`` names, then apply the migrations."""
    from core.migrate import migrate

    name = database_name(url)
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise BenchError(f"refusing an unusual database name {name!r}")
    conn = admin_connection(_with_path(url, "postgres"))
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    migrate(url)


def create_service_token(url: str) -> str:
    """A service token (read and write, any org) for the memory service; printed nowhere."""
    from core.db import make_database
    from memories.tokens import TokenStore
    from models import bind

    db = bind(make_database(url))
    try:
        _, token = TokenStore(db).issue(
            org_id=None, name="benchmark", scopes=["memory:read", "memory:write"]
        )
        return token
    finally:
        db.close()


def truncate(conn: psycopg2.extensions.connection, tables: Iterable[str]) -> None:
    with conn.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


def scalar(conn: psycopg2.extensions.connection, sql: str, params: Sequence[Any] = ()) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return row[0] if row else None


def rows(
    conn: psycopg2.extensions.connection, sql: str, params: Sequence[Any] = ()
) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def postgres_xacts(conn: psycopg2.extensions.connection, name: str) -> int:
    """Committed plus rolled-back transactions of database ``name`` (pg_stat_database)."""
    with conn.cursor() as cur:
        # The statistics snapshot is per transaction; autocommit gives a fresh one per query.
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (name,),
        )
        row = cur.fetchone()
    return int(row[0]) if row else 0


def server_log(conn: psycopg2.extensions.connection) -> Path:
    """Where this server writes its log: the logging collector's current file when it runs,
    else Debian's ``pg_ctlcluster`` file for the server's major version (stderr goes there)."""
    try:
        current = scalar(conn, "SELECT pg_current_logfile()")
    except psycopg2.Error:  # not allowed for this role: guess the Debian location
        current = None
    if current:
        path = Path(current)
        return path if path.is_absolute() else Path(scalar(conn, "SHOW data_directory")) / path
    major = int(scalar(conn, "SHOW server_version_num")) // 10000
    return POSTGRES_LOG_FOLDER / f"postgresql-{major}-main.log"


class StatementLog:
    """Counts the statements Postgres executes for one database, from the server log.

    ``log_statement = 'all'`` is set on that database only (``ALTER DATABASE``), so each
    statement a client sends (BEGIN, SET LOCAL ROLE, set_config, every query, COMMIT) is one
    ``LOG:  statement:`` line prefixed with the backend pid and ``user@database``. Lines of
    the given ``exclude`` pids (the benchmark's own polling connection) are not counted.
    Unavailable (``None`` counts) when the log file cannot be read.
    """

    LINE = re.compile(r"\[(\d+)\] [^@\s]*@(\S+) LOG:  statement: ")

    def __init__(
        self, conn: psycopg2.extensions.connection, database: str, path: Path | None = None
    ) -> None:
        self.conn = conn
        self.database = database
        self.path = path or server_log(conn)
        self.available = self.path.is_file() and os.access(self.path, os.R_OK)
        self._offset = 0

    def enable(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"ALTER DATABASE \"{self.database}\" SET log_statement = 'all'")

    def disable(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{self.database}" RESET log_statement')

    def mark(self) -> None:
        self._offset = self.path.stat().st_size if self.available else 0

    def count(self, exclude: Iterable[int] = ()) -> tuple[dict[int, int], Counter[str]] | None:
        """Statements per backend pid since :meth:`mark`, and how often each statement shape
        (its first line, literals replaced by ``?``) was seen."""
        if not self.available:
            return None
        skip = set(exclude)
        out: dict[int, int] = {}
        shapes: Counter[str] = Counter()
        pending: list[str] | None = None  # the statement being read (continuation lines)

        def flush() -> None:
            if pending is not None:
                shapes[statement_shape(" ".join(pending))] += 1

        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            for raw in handle:
                line = raw.decode("utf-8", "replace")
                if pending is not None and line.startswith("\t"):
                    if sum(map(len, pending)) < 200:
                        pending.append(line)
                    continue
                flush()
                pending = None
                if "LOG:  statement: " not in line:
                    continue
                match = self.LINE.search(line)
                if match is None or match.group(2) != self.database:
                    continue
                pid = int(match.group(1))
                if pid not in skip:
                    out[pid] = out.get(pid, 0) + 1
                    pending = [line[match.end() :]]
            flush()
        return out, shapes


_LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


def statement_shape(text: str, width: int = 90) -> str:
    """A statement's text, whitespace collapsed, literals replaced by ``?``, cut to ``width``."""
    return _LITERALS.sub("?", " ".join(text.split()))[:width]


def backend_applications(conn: psycopg2.extensions.connection, database: str) -> dict[int, str]:
    """pid → application_name of the live backends of ``database``."""
    found = rows(
        conn,
        "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s",
        (database,),
    )
    return {int(pid): str(app or "") for pid, app in found}
