"""``ibex session show --org SLUG --agent SLUG EXTERNAL_ID [--json]``: a conversation's turns,
each with its extraction state, what it extracted and what it cost.

``EXTERNAL_ID`` is the application's id of the conversation (or the session's id); an external
id names a session per user, so every live session of the agent with it is shown. The table
holds no conversation text; ``--json`` prints each turn as recorded (what
``GET /v1/sessions/{id}/turns`` answers), messages included. A failed turn names the class of
its last error and is retried by the pipeline; a dead-lettered one waits for
``ibex dlq replay``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK
from core.config import Settings
from schema.common import SLUG

DATABASE = True

#: Turns read per page.
PAGE = 500


def add_parser(sub: Any) -> None:
    session = sub.add_parser("session", help="a conversation's turns and their states")
    actions = session.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    show = actions.add_parser("show", help="the turns of a session with their states and usage")
    show.add_argument("external_id", metavar="EXTERNAL_ID", help="the conversation's id")
    show.add_argument("--org", metavar="SLUG", required=True, help="the org")
    show.add_argument("--agent", metavar="SLUG", required=True, help="the agent")
    show.add_argument("--json", action="store_true", help="stable JSON output, turns in full")


def _fail(message: str) -> int:
    print(f"ibex session show: {message}", file=sys.stderr)
    return EXIT_FAILURE


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _print_session(info: Any, turns: list[Any], counts: dict[str, int]) -> None:
    s = info.session
    states = ", ".join(f"{state} {n}" for state, n in sorted(counts.items())) or "no turns"
    print(
        f"session {s.id} (external id {s.external_id!r}, {s.status}): {s.turn_count} turns;"
        f" {states}; pointer {s.last_extracted_turn}"
    )
    header = ("turn", "state", "memories", "llm calls", "tokens in/out", "cost USD", "reason")
    rows = [header]
    for t in turns:
        u = t.usage
        rows.append(
            (
                str(t.turn_index),
                t.state,
                _cell(t.memories),
                _cell(u and u.llm_calls),
                "-" if u is None else f"{u.input_tokens}/{u.output_tokens}",
                "-" if u is None else f"{u.cost:.6f}",
                _cell(t.reason),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if any(t.state == "dead_lettered" for t in turns):
        print("dead-lettered turns wait for a replay: 'ibex dlq ls', then 'ibex dlq replay ID'")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from core.db import make_database
    from core.prices import PriceTable
    from sessions.errors import SessionNotFoundError
    from sessions.readback import RecordedTurn
    from sessions.service import SessionService
    from sessions.store import SessionStore

    for name, slug in (("org", args.org), ("agent", args.agent)):
        if not SLUG.match(slug):
            return _fail(f"invalid {name} slug {slug!r}")
    db = make_database(settings.require_database_url())
    shown: list[dict[str, Any]] = []
    try:
        store = SessionStore(db)
        org_id = store.find_org(args.org)
        if org_id is None:
            return _fail(f"no org {args.org!r}")
        found = store.find_sessions(args.external_id, org=args.org, agent=args.agent, limit=100)
        service = SessionService(db, PriceTable.from_json(settings.llm_prices))
        for found_session in found:
            sid = found_session.session_id
            try:
                info = service.info(org_id, sid)
            except SessionNotFoundError:
                continue  # deleted
            turns: list[RecordedTurn] = []
            while True:
                after = turns[-1].turn_index if turns else 0
                page = service.turns(org_id, sid, after=after, limit=PAGE)
                turns.extend(page)
                if len(page) < PAGE:
                    break
            counts = service.reader.state_counts(org_id, [sid]).get(sid, Counter())
            if not args.json:
                _print_session(info, turns, dict(counts))
            shown.append(
                {
                    "session_id": str(sid),
                    "external_id": info.session.external_id,
                    "user_id": None if info.session.user_id is None else str(info.session.user_id),
                    "turn_count": info.session.turn_count,
                    "pointer": info.session.last_extracted_turn,
                    "states": dict(counts),
                    "turns": [asdict(t) for t in turns],
                }
            )
    finally:
        db.close()
    if not shown:
        return _fail(
            f"no live session {args.external_id!r} of agent {args.agent!r} in org {args.org!r}"
        )
    if args.json:
        print(json.dumps({"sessions": shown}, indent=2, sort_keys=True, default=str))
    return EXIT_OK
