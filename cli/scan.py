"""``ibex scan``: run one scan now and send its ``extract_turn`` messages through the broker."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.common import EXIT_OK, add_session_args, resolve_session
from core.config import Settings

DATABASE = True
#: The process's ``service.name`` in traces unless ``OTEL_SERVICE_NAME`` is set.
SERVICE = "ibex-scan"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("scan", help="run one extraction scan now and send what it finds")
    add_session_args(p)
    p.add_argument("--json", action="store_true", help="stable JSON output")
    p.add_argument(
        "--verbose", dest="list_messages", action="store_true", help="list every message sent"
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    # The broker is loaded before the scan: the turns it leases are sent as soon as its
    # transaction commits, not a module import later.
    from actors.broker import send_all
    from core import tracing
    from extraction.stages import StageDeps, scan
    from sessions.store import SessionStore

    store = SessionStore.from_url(settings.require_database_url())
    session_id = resolve_session(store, args)
    report = scan(StageDeps(store=store, settings=settings), session_id=session_id)
    # With OTEL_* asking for traces, each turn sent starts its trace here, as from a worker's
    # scan (actors/tracing.py).
    tracing.setup(SERVICE)
    send_all(report.sent)
    tracing.flush()
    if args.json:
        print(
            json.dumps(
                {
                    "sessions": report.sessions,
                    "turns": report.turns,
                    "sent": [{"actor": m.actor_name, **m.kwargs} for m in report.sent],
                },
                sort_keys=True,
            )
        )
    else:
        if args.list_messages:
            for message in report.sent:
                print(f"sent {message}")
        sessions = "session" if report.sessions == 1 else "sessions"
        turns = "turn" if report.turns == 1 else "turns"
        print(f"{report.sessions} {sessions} scanned, {report.turns} {turns} sent")
    return EXIT_OK
