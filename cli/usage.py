"""``ibex usage --org SLUG [--since DATE] [--json]``: what an org's extraction cost.

From the usage ledger, each turn counted once with its persisted result: turns, LLM calls,
input, output and embedding tokens and their cost in USD (the price table, ``LLM_PRICES``), in
total, per model and per UTC day, and the org's turns by extraction state. ``--since`` is a day
(``YYYY-MM-DD``, UTC); without it, everything. ``--json`` prints the object ``GET /v1/usage``
answers, with ``org`` the org's slug.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK
from core.config import Settings
from schema.common import SLUG

DATABASE = True


def add_parser(sub: Any) -> None:
    usage = sub.add_parser("usage", help="what an org's extraction cost: turns, calls, tokens")
    usage.add_argument("--org", metavar="SLUG", required=True, help="the org")
    usage.add_argument("--since", metavar="DATE", help="from this day (YYYY-MM-DD, UTC)")
    usage.add_argument("--json", action="store_true", help="stable JSON output")


def _fail(message: str) -> int:
    print(f"ibex usage: {message}", file=sys.stderr)
    return EXIT_FAILURE


def _line(label: str, f: dict[str, Any]) -> str:
    return (
        f"{label}: {f['turns']} turns, {f['llm_calls']} LLM calls, {f['input_tokens']} input +"
        f" {f['output_tokens']} output tokens, {f['embedding_tokens']} embedding tokens,"
        f" {f['cost']:.6f} USD"
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    from core.db import make_database
    from core.prices import PriceTable
    from extraction.usage import UsageReader
    from schema.usage import parse_day
    from sessions.store import SessionStore

    if not SLUG.match(args.org):
        return _fail(f"invalid org slug {args.org!r}")
    try:
        since = None if args.since is None else parse_day(args.since)
    except ValueError:
        return _fail(f"--since must be a day, YYYY-MM-DD, not {args.since!r}")
    db = make_database(settings.require_database_url())
    try:
        org_id = SessionStore(db).find_org(args.org)
        if org_id is None:
            return _fail(f"no org {args.org!r}")
        summary = UsageReader(db, PriceTable.from_json(settings.llm_prices)).summary(org_id, since)
    finally:
        db.close()
    data = summary.as_json(args.org)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return EXIT_OK
    print(_line(f"org {args.org}" + (f" since {args.since}" if args.since else ""), data))
    for item in data["by_model"]:
        print("  " + _line(f"{item['provider'] or '-'} {item['model'] or '-'}", item))
    for item in data["by_day"]:
        print("  " + _line(item["day"], item))
    states = ", ".join(f"{k} {v}" for k, v in data["turn_states"].items()) or "none"
    print(f"turns by state: {states}")
    if data["unpriced_models"]:
        print(f"not in the price table (counted at 0): {', '.join(data['unpriced_models'])}")
    return EXIT_OK
