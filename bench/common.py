"""Shared helpers of the benchmarks: a fresh database, child process groups that are always
stopped, the memory service and the fake LLM as subprocesses, and the counters the benchmarks
read (CPU time of process trees, Postgres statements from the server log, Redis commands,
gunicorn access log lines).

Everything here talks to loopback services only, and everything started here is stopped by
:meth:`Children.stop` (SIGTERM to each process group, then SIGKILL), which the benchmarks run
in ``finally`` blocks; :func:`terminate_on_sigterm` turns SIGTERM into the same unwinding as
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx
import psutil
import psycopg2
import psycopg2.extensions
import redis

from core.config import DEFAULTS
from core.db import connect_params

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"
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


class BenchError(RuntimeError):
    """A benchmark could not run (a process died, a service did not answer, ...)."""


# -- signals ---------------------------------------------------------------------------------


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Raise KeyboardInterrupt on SIGTERM too, so ``finally`` blocks stop every child."""

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- child processes -------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    may_exit: bool = False  # a tool that ends by itself (py-spy), not a service

    @property
    def pid(self) -> int:
        return self.process.pid

    def tree(self) -> list[psutil.Process]:
        """The process and its descendants (those still alive)."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []


@dataclass
class Children:
    """Child processes, each in its own process group; :meth:`stop` ends them all."""

    folder: Path
    children: list[Child] = field(default_factory=list)

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], *, may_exit: bool = False
    ) -> Child:
        log = self.folder / f"{name}.log"
        with log.open("ab") as handle:
            process = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=ROOT,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        child = Child(name, process, log, may_exit)
        self.children.append(child)
        return child

    def check(self) -> None:
        for child in self.children:
            if not child.may_exit and child.process.poll() is not None:
                tail = child.log.read_text(errors="replace")[-2000:]
                raise BenchError(
                    f"the {child.name} process exited with status {child.process.returncode}:"
                    f"\n{tail}"
                )

    def stop_one(self, child: Child, grace: float = 10.0) -> None:
        _stop_group(child.process, grace)
        with contextlib.suppress(ValueError):
            self.children.remove(child)

    def stop(self, grace: float = 10.0) -> None:
        for child in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            _stop_group(child.process, max(0.1, deadline - time.monotonic()))
        self.children.clear()


def _stop_group(process: subprocess.Popen[bytes], grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    # Whatever is left of the group (a stuck grandchild too) is killed.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, children: Children, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children.check()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise BenchError(f"{url} did not answer within {timeout:.0f}s")


def wait_log(child: Child, children: Children, text: str, count: int, timeout: float) -> None:
    """Wait until ``text`` appears ``count`` times in the child's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children.check()
        if child.log.read_text(errors="replace").count(text) >= count:
            return
        time.sleep(0.1)
    raise BenchError(f"{child.name}: {text!r} not seen {count} times within {timeout:.0f}s")


def python() -> str:
    return sys.executable


def ibex(*args: str) -> list[str]:
    """argv of the ``ibex`` command: the console script, else ``python -m cli``."""
    script = Path(sys.executable).with_name("ibex")
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-m", "cli", *args]


def child_env(overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment of a benchmark child: ours without the pipeline's variables (a stray
    ``METRICS_PORT`` or ``WORKER_THREADS`` in the shell must not change a run), plus
    ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in _PIPELINE_VARIABLES}
    env.update(overrides)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


#: Every variable :class:`core.config.Settings` reads: a child sees only what we set.
_PIPELINE_VARIABLES = frozenset(DEFAULTS)


# -- databases -------------------------------------------------------------------------------


def _with_path(url: str, name: str) -> str:
    return urlunparse(urlparse(url)._replace(path=f"/{name}"))


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
    from memory_service.store import TokenStore
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


# -- counters --------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def redis_counters(client: redis.Redis) -> dict[str, Any]:
    """Server-wide totals: commands (sum of INFO commandstats calls, and per command) and
    CPU seconds."""
    stats = client.info("commandstats")
    per = {
        k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if isinstance(v, dict)
    }
    cpu = client.info("cpu")
    return {
        "commands": float(sum(per.values())),
        "per_command": per,
        "cpu": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
    }


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


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


class CpuSampler:
    """CPU seconds used by groups of processes over a window, sampled every ``interval``.

    A group is a set of root pids (their descendants included, looked up at every sample) or
    the Postgres backends of one database (found by their process title). A process seen at
    :meth:`begin` counts from its CPU time then; one that appears later counts from zero; one
    that exits before :meth:`end` counts up to its last sample (at most ``interval`` short).
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.groups: dict[str, Any] = {}
        self._start: dict[int, float] = {}
        self._last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add_tree(self, name: str, pids: Sequence[int]) -> None:
        self.groups[name] = ("tree", list(pids))

    def add_postgres(self, name: str, database: str, exclude: Sequence[int] = ()) -> None:
        self.groups[name] = ("postgres", (database, set(exclude)))

    def _processes(self) -> Iterator[tuple[str, psutil.Process]]:
        for name, (kind, spec) in self.groups.items():
            if kind == "tree":
                for pid in spec:
                    try:
                        root = psutil.Process(pid)
                        yield name, root
                        for child in root.children(recursive=True):
                            yield name, child
                    except psutil.Error:
                        continue
            else:
                database, exclude = spec
                needle = f" {database} "
                for proc in psutil.process_iter(["name", "cmdline"]):
                    try:
                        title = " ".join(proc.info["cmdline"] or []) + " "
                    except psutil.Error:
                        continue
                    postgres = title.startswith("postgres: ") and needle in title
                    if postgres and proc.pid not in exclude:
                        yield name, proc

    def _sample(self) -> dict[int, tuple[str, float]]:
        out: dict[int, tuple[str, float]] = {}
        for name, proc in self._processes():
            with contextlib.suppress(psutil.Error):
                out[proc.pid] = (name, cpu_seconds(proc))
        return out

    def begin(self) -> None:
        first = self._sample()
        with self._lock:
            self._start = {pid: cpu for pid, (_, cpu) in first.items()}
            self._last = dict(first)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            sample = self._sample()
            with self._lock:
                self._last.update(sample)

    def end(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        final = self._sample()
        with self._lock:
            self._last.update(final)
            totals: dict[str, float] = dict.fromkeys(self.groups, 0.0)
            for pid, (name, cpu) in self._last.items():
                totals[name] += max(0.0, cpu - self._start.get(pid, 0.0))
        return totals


def count_access_log(path: Path, offset: int) -> dict[str, int]:
    """Requests in a gunicorn access log since ``offset``, by ``METHOD path-prefix status``."""
    out: dict[str, int] = {}
    if not path.exists():
        return out
    pattern = re.compile(r'"(\w+) (/[^ ?"]*)[^"]*" (\d{3})')
    with path.open("rb") as handle:
        handle.seek(offset)
        for raw in handle:
            match = pattern.search(raw.decode("utf-8", "replace"))
            if match is None:
                continue
            method, route, status = match.groups()
            route = "/v1/memories/{id}" if route.startswith("/v1/memories/") else route
            key = f"{method} {route} {status}"
            out[key] = out.get(key, 0) + 1
    return out


def file_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# -- the services under test -----------------------------------------------------------------


def start_private_redis(children: Children) -> str:
    """A private ``redis-server`` on a free loopback port (no persistence); returns the URL of
    its db 9. Its INFO commandstats and CPU counters then count the benchmark alone."""
    import shutil

    exe = shutil.which("redis-server")
    if exe is None:
        raise BenchError("--private-redis needs redis-server on PATH")
    port = free_port()
    argv = [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(children.folder)]  # fmt: skip
    children.start("redis", argv, child_env({}))
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 15
    while True:
        children.check()
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise BenchError("the private redis-server did not answer") from None
            time.sleep(0.05)
        finally:
            client.close()
    return f"redis://127.0.0.1:{port}/9"


def start_memory_service(
    children: Children,
    env: Mapping[str, str],
    *,
    workers: int = 2,
    threads: int = 4,
    access_log: Path | None = None,
) -> tuple[Child, str]:
    """gunicorn with the memory service on a free loopback port; returns (child, base URL)."""
    port = free_port()
    argv = [
        python(),
        "-m",
        "gunicorn",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--worker-class",
        "gthread",
        "--log-level",
        "warning",
    ]
    if access_log is not None:
        argv += ["--access-logfile", str(access_log)]
    argv.append("memory_service.wsgi:application")
    child = children.start("memory-service", argv, {**env, "PORT": str(port)})
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", children)
    return child, url


def start_fake_llm(children: Children, *, latency_ms: float, memories: int) -> tuple[Child, str]:
    """The fake LLM (:func:`fake_llm_main`) on a free port; returns (child, LLM_BASE_URL)."""
    port = free_port()
    child = children.start(
        "fake-llm",
        [
            python(),
            "-m",
            "bench.common",
            "fake-llm",
            "--port",
            str(port),
            "--latency-ms",
            str(latency_ms),
            "--memories",
            str(memories),
        ],
        child_env({}),
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", children)
    return child, f"http://127.0.0.1:{port}/v1"


def fake_llm_main(argv: Sequence[str]) -> int:
    """``python -m bench.fake_llm`` with TCP_NODELAY on its connections.

    Its handler writes the headers and the body of a response in two ``send`` calls; with
    Nagle's algorithm on, the body waits for the client's delayed ACK of the headers, about
    40 ms per request on Linux loopback, whatever ``--latency-ms`` says. The benchmarks need
    the latency they set, so they serve it with Nagle off.
    """
    import bench.fake_llm as fake

    make_handler = fake._handler_for

    def handler_for(llm: Any) -> Any:
        class NoDelay(make_handler(llm)):  # type: ignore[misc]
            disable_nagle_algorithm = True

        return NoDelay

    fake._handler_for = handler_for
    return fake.main(list(argv))


def llm_control(base_url: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
    root = base_url.rsplit("/v1", 1)[0]
    if body is None and path == "/stats":
        return httpx.get(f"{root}{path}", timeout=10).json()
    return httpx.post(f"{root}{path}", json=dict(body or {}), timeout=10).json()


# -- the machine -----------------------------------------------------------------------------


def machine(conn: psycopg2.extensions.connection, client: redis.Redis) -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "postgres": scalar(conn, "SHOW server_version"),
        "redis": str(client.info("server").get("redis_version")),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def dumps(document: Any) -> str:
    return json.dumps(document, indent=2, sort_keys=True)


def table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A plain text table: the first column left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in header], *[[_cell(c) for c in row] for row in body]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """The same table as :func:`table`, as GitHub Markdown."""
    lines = ["| " + " | ".join(str(c) for c in header) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in body:
        lines.append("| " + " | ".join(_cell(c).strip() for c in row) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"
    return str(value)


# -- profiles --------------------------------------------------------------------------------


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter, or on PATH."""
    import shutil

    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.is_file() else shutil.which("py-spy")


def start_py_spy(children: Children, name: str, pid: int, seconds: float) -> Child | None:
    """Sample ``pid`` and its subprocesses for ``seconds`` (100 Hz, on-CPU threads only) into
    ``profile-<name>.txt`` in py-spy's raw (collapsed stacks) format."""
    exe = py_spy()
    if exe is None:
        return None
    out = children.folder / f"profile-{name}.txt"
    argv = [exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking",
            "--format", "raw", "--rate", "100", "--duration", str(max(1, int(seconds))),
            "--output", str(out)]  # fmt: skip
    return children.start(f"py-spy-{name}", argv, child_env({}), may_exit=True)


def finish_py_spy(children: Children, child: Child | None, timeout: float = 30) -> dict[str, Any]:
    if child is None:
        return {"available": False}
    try:
        child.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        children.stop_one(child)
    else:
        with contextlib.suppress(ValueError):
            children.children.remove(child)
    path = children.folder / f"profile-{child.name.removeprefix('py-spy-')}.txt"
    return summarize_profile(path)


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _frame_parts(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip(), ""
    return match.group("func"), match.group("file")


def _area(file: str) -> str:
    """Which part of the stack a source file belongs to."""
    f = file.replace("\\", "/")
    for needle, area in (
        ("psycopg2", "psycopg2 (Postgres driver)"),
        ("peewee", "peewee"),
        ("playhouse", "peewee"),
        ("httpx", "httpx/httpcore/h11"),
        ("httpcore", "httpx/httpcore/h11"),
        ("h11", "httpx/httpcore/h11"),
        ("dramatiq", "dramatiq"),
        ("redis", "redis-py"),
        ("marshmallow", "marshmallow"),
        ("falcon", "falcon"),
        ("gunicorn", "gunicorn"),
        ("json", "json"),
        ("uuid", "uuid"),
        ("ssl", "ssl"),
        ("logging", "logging"),
        ("threading", "threading"),
        ("socket", "socket"),
        ("selectors", "socket"),
    ):
        if f"/{needle}" in f or f.startswith(needle):
            return area
    for ours in ("extraction/", "actors/", "memory_service/", "models/", "core/", "schema/"):
        if ours in f:
            return "ibex " + ours.rstrip("/")
    return "other (stdlib, interpreter)"


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Self time by area of the code, and the functions with the most self and inclusive
    samples, from a py-spy raw (collapsed stacks) file."""
    if not path.exists():
        return {"available": False}
    total = 0
    by_area: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ")
                  and not f.startswith("thread ")]  # fmt: skip
        if not frames:
            continue
        total += count
        func, file = _frame_parts(frames[-1])
        by_area[_area(file)] += count
        self_time[f"{func} ({Path(file).name})"] += count
        seen = set()
        for frame in frames:
            func, file = _frame_parts(frame)
            if not any(p in file for p in ("extraction/", "actors/", "memory_service/",
                                           "models/", "core/")):  # fmt: skip
                continue
            key = f"{func} ({file.split('/main/')[-1]})"
            if key not in seen:
                seen.add(key)
                inclusive[key] += count

    def pct(counter: Counter[str]) -> dict[str, float]:
        return {k: round(100 * v / total, 1) for k, v in counter.most_common(top)} if total else {}

    return {
        "available": True,
        "samples": total,
        "self_by_area_pct": pct(by_area),
        "self_top_pct": pct(self_time),
        "ibex_inclusive_top_pct": pct(inclusive),
        "file": str(path),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["fake-llm"]:
        raise SystemExit(fake_llm_main(sys.argv[2:]))
    print("usage: python -m bench.common fake-llm [bench.fake_llm options]", file=sys.stderr)
    raise SystemExit(2)
