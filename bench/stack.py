"""The processes of a benchmark, started with :mod:`cli.stack.processes`: the Procfile's ``web``
and ``worker`` lines as production runs them, a private ``redis-server``, the fake LLM, and
the ``ibex`` command; every one of them is stopped by :meth:`~cli.stack.processes.Launcher.stop`
(SIGTERM to each process group, then SIGKILL), which the benchmarks run in ``finally``
blocks; :func:`terminate_on_sigterm` turns SIGTERM into the same unwinding as Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis

from bench import BenchError
from cli.stack.processes import Launcher, Process, ProcessError, ProcessExited, free_port, http_ok
from core.config import DEFAULTS

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"


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


def check(launcher: Launcher) -> None:
    """:meth:`Launcher.check` as a :class:`BenchError` with the tail of the dead one's log."""
    try:
        launcher.check()
    except ProcessExited as exc:
        raise BenchError(f"{exc}:\n{exc.process.log_tail(2000)}") from exc


def wait(launcher: Launcher, ready: Callable[[], bool], what: str, timeout: float) -> None:
    """:meth:`Launcher.wait_until`, its failures as :class:`BenchError`."""
    try:
        launcher.wait_until(ready, what, timeout)
    except ProcessExited:
        check(launcher)
        raise
    except ProcessError as exc:
        raise BenchError(str(exc)) from exc


def wait_http(url: str, launcher: Launcher, timeout: float = 30.0) -> None:
    wait(launcher, lambda: http_ok(url), f"{url} did not answer", timeout)


def wait_log(process: Process, launcher: Launcher, text: str, count: int, timeout: float) -> None:
    """Wait until ``text`` appears ``count`` times in the process's log."""
    wait(
        launcher,
        lambda: process.log_tail(1 << 30).count(text) >= count,
        f"{process.name}: {text!r} not seen {count} times",
        timeout,
    )


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
    ``METRICS_PORT``, ``WORKER_THREADS`` or ``OTEL_*`` in the shell must not change a run), plus
    ``overrides``.

    Nor ``PYTHONDONTWRITEBYTECODE``: a process started with it compiles every module of the
    checkout from source (an install's modules are compiled once, when installed), about
    65 ms of each ``ibex scan`` or ``ibex extract`` process on the benchmark machine. The
    children cache their bytecode in the checkout's ``__pycache__`` folders instead."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _PIPELINE_VARIABLES
        and not k.startswith("OTEL_")  # traces: --tracing only
        and k != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(overrides)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


#: Every variable :class:`core.config.Settings` reads: a child sees only what we set.
_PIPELINE_VARIABLES = frozenset(DEFAULTS)


# -- the services under test -----------------------------------------------------------------


def start_private_redis(launcher: Launcher) -> str:
    """A private ``redis-server`` on a free loopback port (no persistence); returns the URL of
    its db 9. Its INFO commandstats and CPU counters then count the benchmark alone."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise BenchError("--private-redis needs redis-server on PATH")
    port = free_port()
    argv = [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(launcher.folder)]  # fmt: skip
    launcher.start("redis", argv, child_env({}))

    def ping() -> bool:
        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False
        finally:
            client.close()

    wait(launcher, ping, "the private redis-server did not answer", 15)
    return f"redis://127.0.0.1:{port}/9"


def start_memory_service(
    launcher: Launcher,
    env: Mapping[str, str],
    *,
    workers: int = 2,
    threads: int = 4,
    access_log: Path | None = None,
) -> tuple[Process, str]:
    """The Procfile's ``web`` line on a free loopback port, ``workers`` x ``threads``;
    returns (process, base URL)."""
    port = free_port()
    env = {
        **env,
        "PORT": str(port),
        "WEB_CONCURRENCY": str(workers),
        "WEB_THREADS": str(threads),
    }
    extra = ["--log-level", "warning"]
    if access_log is not None:
        extra += ["--access-logfile", str(access_log)]
    process = launcher.start_procfile(
        "web", env, name="memory-service", bind_host="127.0.0.1", extra_args=extra
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", launcher)
    return process, url


def start_workers(
    launcher: Launcher, name: str, env: Mapping[str, str], *, processes: int, threads: int
) -> Process:
    """The Procfile's ``worker`` line with ``processes`` x ``threads``."""
    env = {**env, "WORKER_PROCESSES": str(processes), "WORKER_THREADS": str(threads)}
    return launcher.start_procfile("worker", env, name=name)


def start_fake_llm(launcher: Launcher, *, latency_ms: float, memories: int) -> tuple[Process, str]:
    """The fake LLM (:func:`fake_llm_main`) on a free port; returns (process, LLM_BASE_URL)."""
    port = free_port()
    process = launcher.start(
        "fake-llm",
        [
            python(),
            "-m",
            "bench.stack",
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
    wait_http(f"http://127.0.0.1:{port}/healthz", launcher)
    return process, f"http://127.0.0.1:{port}/v1"


def start_trace_sink(launcher: Launcher) -> tuple[Process, str]:
    """The OTLP/HTTP trace sink (:mod:`bench.trace_sink`) on a free port; returns (process,
    ``OTEL_EXPORTER_OTLP_ENDPOINT``). ``GET /stats`` counts the spans received."""
    port = free_port()
    process = launcher.start(
        "trace-sink", [python(), "-m", "bench.trace_sink", "--port", str(port)], child_env({})
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", launcher)
    return process, f"http://127.0.0.1:{port}"


def start_fake_embeddings(launcher: Launcher, *, dimension: int) -> tuple[Process, str]:
    """The fake embeddings endpoint (:mod:`bench.fake_embeddings`) on a free port; returns
    (process, EMBEDDINGS_BASE_URL). ``GET /stats`` counts its requests."""
    port = free_port()
    process = launcher.start(
        "fake-embeddings",
        [python(), "-m", "bench.fake_embeddings", "--port", str(port), "--dimension",
         str(dimension)],
        child_env({}),
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/stats", launcher)
    return process, f"http://127.0.0.1:{port}"


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


if __name__ == "__main__":
    if sys.argv[1:2] == ["fake-llm"]:
        raise SystemExit(fake_llm_main(sys.argv[2:]))
    print("usage: python -m bench.stack fake-llm [bench.fake_llm options]", file=sys.stderr)
    raise SystemExit(2)
