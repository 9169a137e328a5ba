"""``ibex scheduler`` (the Procfile line): send ``scan_sessions`` every
``SCAN_INTERVAL_SECONDS`` until SIGTERM or SIGINT. A thin trigger: the scan runs on a worker.
Before each send it closes the sessions idle for ``SESSION_IDLE_SECONDS``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from cli.common import EXIT_OK
from core.config import Settings

#: The scheduler only sends messages: it runs before the first migration too.
DATABASE = False


def add_parser(sub: Any) -> None:
    sub.add_parser("scheduler", help="send scan_sessions every SCAN_INTERVAL_SECONDS")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from actors import scan_sessions
    from models.session_status import close_idle_sessions

    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    interval = settings.scan_interval_seconds
    print(f"ibex scheduler: sending scan_sessions every {interval}s", flush=True)
    while not stop.is_set():
        try:  # idle sessions first, so this scan already sees the ones it completes
            close_idle_sessions(settings)
        except Exception as exc:  # a database blip must not end the schedule either
            print(f"ibex scheduler: could not close idle sessions: {exc}", file=sys.stderr)
        try:
            scan_sessions.send()
        except Exception as exc:  # a Redis blip must not end the schedule
            print(f"ibex scheduler: could not send scan_sessions: {exc}", file=sys.stderr)
        stop.wait(interval)
    print("ibex scheduler: stopped", flush=True)
    return EXIT_OK
