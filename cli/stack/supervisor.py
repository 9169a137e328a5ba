"""What keeps ``ibex up`` honest while it runs: one start per data folder, ports checked before
anything starts, a crashed child restarted with backoff, and a lost Postgres or Redis said on
the console.

- :func:`hold_folder`: an exclusive ``flock`` on ``<data dir>/lock`` (holding the pid), held
  for the life of the process (the kernel drops it when the process dies, however it dies): a
  second ``ibex up`` on the same folder stops at once, naming the pid that holds it, before it
  can rewrite the folder's ``env`` file.
- :func:`port_in_use`: a port is tried before the first process starts, so a port another
  server holds is named as such (and not mistaken for a refused token later).
- :class:`Supervisor`: a service that exits is started again after 1 s, 2 s, 4 s ... (at most
  30 s); a service that has run for a minute since its last start is trusted again (its
  backoff starts over). Every exit and restart is one console line.
- :class:`Watch`: a server probed every few seconds; losing it and getting it back are each one
  console line (the web process's ``/readyz`` says the same, but nobody watches it).

The classes take their clock, their output and their probes as arguments: tests drive them
without processes or sleeping.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from core.errors import ConfigError

#: Restart delays: the first, the longest, and how long a restarted service must run before
#: its next crash counts as a first one again.
FIRST_DELAY = 1.0
MOST_DELAY = 30.0
STABLE_AFTER = 60.0


def hold_folder(folder: Path) -> IO[str]:
    """Lock ``folder`` for this process (the returned file holds the lock: keep it open), or a
    :class:`ConfigError` naming the process that holds it."""
    path = folder / "lock"
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(
            f"the data folder {folder} is in use by another ibex up (pid {holder}): stop that"
            " one (Ctrl-C in its terminal), or give this one another --data-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (or holds it), as a server starting there
    would find it (``SO_REUSEADDR``, as gunicorn and uvicorn bind)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def check_ports(ports: dict[str, int]) -> None:
    """A :class:`ConfigError` naming the first port of ``ports`` (what it is for -> port) that
    is taken."""
    for what, port in ports.items():
        if port_in_use(port):
            raise ConfigError(
                f"port {port} ({what}) is in use: another ibex up or another server listens"
                f" on 127.0.0.1:{port}; stop it, or choose another port"
            )


class Child(Protocol):
    """What the supervisor needs of a started process (:class:`cli.stack.processes.Process`)."""

    name: str
    log: Path

    def alive(self) -> bool: ...

    @property
    def returncode(self) -> int | None: ...


@dataclass
class _Watched:
    start: Callable[[], Child]
    process: Child
    started: float
    failures: int = 0
    due: float | None = None


class Supervisor:
    """Restart the services it watches when they exit, with backoff."""

    def __init__(
        self,
        *,
        say: Callable[[str], None],
        forget: Callable[[Any], None] = lambda process: None,
        clock: Callable[[], float] = time.monotonic,
        first: float = FIRST_DELAY,
        most: float = MOST_DELAY,
        stable: float = STABLE_AFTER,
    ) -> None:
        self.say = say
        self.forget = forget
        self.clock = clock
        self.first, self.most, self.stable = first, most, stable
        self.watched: list[_Watched] = []

    def watch(self, process: Child, start: Callable[[], Child]) -> None:
        """Restart ``process`` with ``start`` whenever it exits."""
        self.watched.append(_Watched(start, process, self.clock()))

    def delay(self, failures: int) -> float:
        return float(min(self.first * 2 ** (failures - 1), self.most))

    def poll(self) -> None:
        now = self.clock()
        for item in self.watched:
            if item.due is None:
                if item.process.alive():
                    if item.failures and now - item.started >= self.stable:
                        item.failures = 0
                    continue
                item.failures += 1
                wait = self.delay(item.failures)
                item.due = now + wait
                self.forget(item.process)
                self.say(
                    f"ibex up: the {item.process.name} process exited with status"
                    f" {item.process.returncode}; restarting in {wait:g}s"
                    f" (its log: {item.process.log})"
                )
            elif now >= item.due:
                item.process = item.start()
                item.started, item.due = now, None
                self.say(f"ibex up: the {item.process.name} process restarted")


class Watch:
    """A server probed every ``every`` seconds; its loss and its return each said once."""

    def __init__(
        self,
        name: str,
        probe: Callable[[], bool],
        *,
        lost: str,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        every: float = 2.0,
    ) -> None:
        self.name, self.probe, self.lost, self.say = name, probe, lost, say
        self.clock, self.every = clock, every
        self.up = True
        self.next = clock()

    def poll(self) -> None:
        now = self.clock()
        if now < self.next:
            return
        self.next = now + self.every
        ok = self.probe()
        if self.up and not ok:
            self.say(f"ibex up: lost {self.name}: {self.lost}; waiting for it to come back")
        elif ok and not self.up:
            self.say(f"ibex up: {self.name} is back")
        self.up = ok


def redis_probe(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    return probe


def postgres_probe(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        import psycopg2

        try:
            connection = psycopg2.connect(url, connect_timeout=2)
        except psycopg2.Error:
            return False
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return True
        except psycopg2.Error:
            return False
        finally:
            connection.close()

    return probe
