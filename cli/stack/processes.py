"""The Procfile's processes, started the way production starts them, and always stopped.

:class:`Procfile` reads the ``Procfile`` (``release``, ``web``, ``worker``, ``scheduler``) and
turns a line into an argv with the shell's ``$VAR``, ``${VAR}`` and ``${VAR:-default}``
expanded from a given environment (no shell runs). :class:`Launcher` starts such an argv, or
any other, each in its own process group with its output appended to a log file, waits for it
to be ready (an HTTP ``200`` from a URL, or a predicate), and stops every group it started:
SIGTERM to the group, then SIGKILL to whatever is left after a grace period. The signal helpers
of :class:`Process` (SIGKILL, SIGSTOP, SIGCONT of the whole group) and its list of
:meth:`~Process.children` (to signal one worker process) are the faults the chaos tests
inject. :func:`free_port` is the one way to pick a loopback port.

Used by ``ibex demo``, the benchmarks and the tests that run real processes, so the command
they run is the Procfile's own.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from core.errors import ConfigError, IbexError

#: The checkout the package runs from: where the Procfile lives.
ROOT = Path(__file__).resolve().parents[2]
PROCFILE = ROOT / "Procfile"

_VARIABLE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)
_LINE = re.compile(r"^(?P<name>[A-Za-z0-9_-]+):\s*(?P<command>.+?)\s*$")


#: Where the kernel's ephemeral ports (the local ports of outgoing connections) start when
#: /proc does not say (Linux's default; other systems start higher).
EPHEMERAL_LOW = 32768
#: The lowest port :func:`free_port` answers.
PORTS_FROM = 10000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's range of
    ephemeral ports. Port 0 would give one from that range, which any outgoing connection (a
    worker's to Redis or Postgres) may take as its local port between this answer and the
    child's bind: the child then fails with "Address already in use". A port below the range
    is only ever taken by a listener, and this checks that none holds it."""
    low = _ephemeral_low()
    chooser = random.SystemRandom()
    for _ in range(200):
        port = chooser.randrange(PORTS_FROM, low)
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))  # every port tried is in use: the kernel's choice
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW
    return low if low > PORTS_FROM + 1000 else EPHEMERAL_LOW


def expand(command: str, env: Mapping[str, str]) -> str:
    """``command`` with ``$VAR``, ``${VAR}`` and ``${VAR:-default}`` replaced from ``env``, as
    the shell does (``:-`` also applies to an empty value). A variable that is unset and has
    no default is a :class:`ConfigError` naming it (the shell would silently use "")."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        value = env.get(name, "")
        if value:
            return value
        default = match.group("default")
        if default is not None:
            return default
        if name in env:
            return ""
        raise ConfigError(f"the Procfile needs {name} and it is not set", variable=name)

    return _VARIABLE.sub(replace, command)


@dataclass(frozen=True)
class Procfile:
    """The process types of a Procfile, by name, as written (unexpanded)."""

    commands: Mapping[str, str]
    path: Path | None = None

    @classmethod
    def parse(cls, text: str, path: Path | None = None) -> Procfile:
        commands: dict[str, str] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = _LINE.match(line)
            if match is None:
                raise ConfigError(f"Procfile line {number} is not 'name: command': {raw!r}")
            if match.group("name") in commands:
                raise ConfigError(f"Procfile line {number} repeats {match.group('name')!r}")
            commands[match.group("name")] = match.group("command")
        return cls(commands, path)

    @classmethod
    def read(cls, path: Path = PROCFILE) -> Procfile:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the Procfile at {path}: {exc.strerror}") from exc
        return cls.parse(text, path)

    def command(self, name: str) -> str:
        try:
            return self.commands[name]
        except KeyError:
            raise ConfigError(f"the Procfile has no {name!r} process") from None

    def argv(self, name: str, env: Mapping[str, str], *, bind_host: str | None = None) -> list[str]:
        """The argv of process ``name`` with ``env``'s values; ``bind_host`` replaces the host
        of a ``--bind host:port`` (``127.0.0.1`` keeps a test's server off the network)."""
        argv = shlex.split(expand(self.command(name), env))
        if bind_host is not None:
            argv = rebind(argv, bind_host)
        return argv


def rebind(argv: Sequence[str], host: str) -> list[str]:
    """``argv`` with the host of every ``--bind host:port`` (or ``--bind=host:port``, gunicorn)
    or ``--host HOST`` (uvicorn) replaced; a :class:`ConfigError` when there is none."""
    out = list(argv)
    found = False
    for i, arg in enumerate(out):
        if arg == "--host" and i + 1 < len(out):
            out[i + 1] = host
            found = True
        elif arg == "--bind" and i + 1 < len(out):
            out[i + 1] = f"{host}:{out[i + 1].rpartition(':')[2]}"
            found = True
        elif arg.startswith("--bind="):
            out[i] = f"--bind={host}:{arg.rpartition(':')[2]}"
            found = True
    if not found:
        raise ConfigError(f"no --bind or --host to rebind in {shlex.join(out)!r}")
    return out


def resolve(program: str, env: Mapping[str, str]) -> str:
    """The executable of ``program``: the script installed beside this interpreter first (a
    virtualenv's ``gunicorn``, ``dramatiq``, ``ibex`` even when it is not on ``PATH``), else
    ``env``'s ``PATH``."""
    if os.sep in program:
        return program
    local = Path(sys.executable).with_name(program)
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise ConfigError(f"{program} is not installed (not beside {sys.executable}, not on PATH)")
    return found


class ProcessError(IbexError):
    """A started process exited when it should not have, or did not become ready."""


class ProcessExited(ProcessError):
    def __init__(self, process: Process) -> None:
        super().__init__(f"the {process.name} process exited with status {process.returncode}")
        self.process = process


@dataclass
class Process:
    """A started process, the leader of its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    may_exit: bool = False  # a tool that ends by itself (py-spy), not a service

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def group_alive(self) -> bool:
        """Any process of the group is left (a forked child outlives its leader too)."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def children(self) -> list[int]:
        """The pids of the leader's direct children (gunicorn's or Dramatiq's worker
        processes), read from ``/proc``; empty where there is no ``/proc``."""
        found: list[int] = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    found += [int(p) for p in (task / "children").read_text().split()]
        return sorted(set(found))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every process of the group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL of the whole group, and wait until none of it is left."""
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while self.group_alive():
            if time.monotonic() > deadline:
                raise ProcessError(f"the {self.name} process group survived SIGKILL")
            time.sleep(0.02)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM to the group, SIGKILL to what is left after ``grace`` seconds; the exit
        status of the leader."""
        self.signal(signal.SIGTERM)
        self.resume()  # a paused group cannot act on SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(0.1, grace))
        # Whatever is left of the group (a stuck grandchild too) is killed.
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        return self.popen.returncode

    def log_tail(self, chars: int = 2500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


@dataclass
class Launcher:
    """Processes started in ``folder`` (their logs go there); :meth:`stop` ends them all.

    A context manager: leaving the ``with`` block stops every process, on error too.
    """

    folder: Path
    procfile: Procfile | None = None
    cwd: Path | None = None
    processes: list[Process] = field(default_factory=list)

    def __enter__(self) -> Launcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log: Path | None = None,
        may_exit: bool = False,
    ) -> Process:
        """``argv`` in a new process group (session), stdout and stderr appended to ``log``
        (``<folder>/<name>.log`` by default), stdin closed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        log = log or self.folder / f"{name}.log"
        program = resolve(argv[0], env)
        with log.open("ab") as handle:
            popen = subprocess.Popen(
                [program, *argv[1:]],
                env=dict(env),
                cwd=self.cwd,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        process = Process(name, popen, log, may_exit)
        self.processes.append(process)
        return process

    def start_procfile(
        self,
        kind: str,
        env: Mapping[str, str],
        *,
        name: str | None = None,
        extra_args: Sequence[str] = (),
        bind_host: str | None = None,
        log: Path | None = None,
    ) -> Process:
        """The Procfile's ``kind`` line (``web``, ``worker``, ...) expanded from ``env``, with
        ``extra_args`` appended; see :meth:`Procfile.argv` for ``bind_host``."""
        procfile = self.procfile or Procfile.read()
        argv = procfile.argv(kind, env, bind_host=bind_host) + list(extra_args)
        return self.start(name or kind, argv, env, log=log)

    def check(self) -> None:
        """Raise :class:`ProcessExited` for the first service that has exited."""
        for process in self.processes:
            if not process.may_exit and not process.alive():
                raise ProcessExited(process)

    def wait_until(
        self, ready: Callable[[], bool], what: str, timeout: float = 30.0, poll: float = 0.1
    ) -> None:
        """Poll ``ready`` until it is true; :meth:`check` between polls, so a process that
        dies ends the wait at once."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            if ready():
                return
            if time.monotonic() > deadline:
                raise ProcessError(f"{what} within {timeout:.0f}s")
            time.sleep(poll)

    def wait_http(self, url: str, timeout: float = 30.0) -> None:
        """Until ``url`` answers 200 (a ``/healthz``)."""
        self.wait_until(lambda: http_ok(url), f"{url} did not answer", timeout)

    def stop_one(self, process: Process, grace: float = 10.0) -> int | None:
        with contextlib.suppress(ValueError):
            self.processes.remove(process)
        return process.stop(grace)

    def forget(self, process: Process) -> None:
        """No longer stop ``process`` with the others (it has ended by itself)."""
        with contextlib.suppress(ValueError):
            self.processes.remove(process)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to every group at once, then each gets what is left of ``grace`` before
        SIGKILL. Safe to call twice."""
        for process in self.processes:
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            process.stop(deadline - time.monotonic())
        self.processes.clear()

    def __iter__(self) -> Iterator[Process]:
        return iter(list(self.processes))


def http_ok(url: str) -> bool:
    """``url`` answers 200 within a second."""
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


__all__ = [
    "PROCFILE",
    "ROOT",
    "Launcher",
    "Process",
    "ProcessError",
    "ProcessExited",
    "Procfile",
    "expand",
    "free_port",
    "http_ok",
    "rebind",
    "resolve",
]
