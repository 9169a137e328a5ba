"""The environment of the Procfile's processes started by a test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cli.stack.processes import ROOT

BIN = Path(sys.executable).parent
#: The caller's shell settings that would change what a test's processes do.
STRIPPED = ("LLM_", "IBEX_", "OTEL_")


def procfile_env(
    database_url: str,
    redis_url: str,
    port: int,
    *,
    token: str | None = None,
    strip: tuple[str, ...] = (),
    **extra: str,
) -> dict[str, str]:
    """This interpreter's scripts first on the path, the test's Postgres and Redis, the web on
    ``port`` (one gunicorn worker of 4 threads) and the worker pointed at it with ``token``,
    one worker process of 2 threads; without the caller's ``LLM_*``, ``IBEX_*`` and ``OTEL_*``
    variables (nor those starting with one of ``strip``); ``extra`` last."""
    dropped = STRIPPED + strip
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "PORT": str(port),
            "WEB_CONCURRENCY": "1",
            "WEB_THREADS": "4",
            "MEMORY_SERVICE_URL": f"http://127.0.0.1:{port}",
            "WORKER_PROCESSES": "1",
            "WORKER_THREADS": "2",
        }
    )
    if token is not None:
        env["MEMORY_SERVICE_TOKEN"] = token
    env.update(extra)
    return env
