"""What the benchmarks measure besides time: CPU seconds of process trees and Postgres
backends (sampled), Redis command counts, gunicorn access log lines, and py-spy profiles.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import redis

from bench.stack import child_env
from cli.stack.processes import Launcher, Process


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


# -- profiles --------------------------------------------------------------------------------


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter, or on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.is_file() else shutil.which("py-spy")


def start_py_spy(
    launcher: Launcher, name: str, pid: int, seconds: float, *, gil: bool = False
) -> Process | None:
    """Sample ``pid`` and its subprocesses for ``seconds`` (100 Hz, on-CPU threads only) into
    ``profile-<name>.txt`` in py-spy's raw (collapsed stacks) format. With ``gil``, only the
    thread holding the GIL is sampled: the Python CPU of each process, without the threads
    that wait in C (a socket read, a Postgres round trip) and still look busy to py-spy."""
    exe = py_spy()
    if exe is None:
        return None
    out = launcher.folder / f"profile-{name}.txt"
    argv = [exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking",
            "--format", "raw", "--rate", "100", "--duration", str(max(1, int(seconds))),
            "--output", str(out)]  # fmt: skip
    if gil:
        argv.append("--gil")
    return launcher.start(f"py-spy-{name}", argv, child_env({}), may_exit=True)


def finish_py_spy(
    launcher: Launcher, process: Process | None, timeout: float = 30
) -> dict[str, Any]:
    if process is None:
        return {"available": False}
    try:
        process.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher.stop_one(process)
    else:
        launcher.forget(process)
    path = launcher.folder / f"profile-{process.name.removeprefix('py-spy-')}.txt"
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
