"""``ibex budget set|show|clear --org SLUG``: an org's LLM token budget per period.

- ``set --org SLUG --tokens N [--period month|day]``: at most N LLM tokens (input + output) per
  calendar month (the default) or day, UTC. Over it, the org's turns wait
  (``waiting_for_budget``) with no LLM call, are never dead-lettered, and resume by themselves
  when the limit is raised (at once: their leases end) or the period turns (at the next scan
  after it). Other orgs go on. The overrun is bounded by the calls already in flight when the
  limit was reached: at most ``WORKER_PROCESSES x WORKER_THREADS`` calls.
- ``show --org SLUG [--json]``: ``limit``, ``used`` (this period), ``period`` and
  ``waiting_turns``.
- ``clear --org SLUG``: no limit any more; waiting turns resume.
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


def _tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of tokens: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("tokens must not be negative")
    return value


def add_parser(sub: Any) -> None:
    budget = sub.add_parser("budget", help="an org's LLM token budget per month or day")
    actions = budget.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    set_ = actions.add_parser("set", help="set the org's token limit per period")
    set_.add_argument("--org", metavar="SLUG", required=True)
    set_.add_argument("--tokens", metavar="N", type=_tokens, required=True)
    set_.add_argument("--period", choices=("month", "day"), default="month")
    show = actions.add_parser("show", help="the org's limit, use this period, waiting turns")
    show.add_argument("--org", metavar="SLUG", required=True)
    show.add_argument("--json", action="store_true", help="stable JSON output")
    clear = actions.add_parser("clear", help="remove the org's limit")
    clear.add_argument("--org", metavar="SLUG", required=True)


def _fail(action: str, message: str) -> int:
    print(f"ibex budget {action}: {message}", file=sys.stderr)
    return EXIT_FAILURE


def run(args: argparse.Namespace, settings: Settings) -> int:
    from core.db import make_database
    from extraction.budgets import BudgetStore, budget_json
    from sessions.store import SessionStore

    if not SLUG.match(args.org):
        return _fail(args.action, f"invalid org slug {args.org!r}")
    db = make_database(settings.require_database_url())
    try:
        org_id = SessionStore(db).find_org(args.org)
        if org_id is None:
            return _fail(args.action, f"no org {args.org!r}")
        budgets = BudgetStore(db)
        if args.action == "set":
            now = budgets.set(org_id, args.tokens, args.period)
            print(
                f"org {args.org}: at most {now.limit} LLM tokens per {now.period};"
                f" {now.used} used this {now.period}; {now.waiting_turns} turns waiting"
            )
            return EXIT_OK
        if args.action == "clear":
            had = budgets.clear(org_id)
            print(f"org {args.org}: " + ("budget cleared" if had else "had no budget"))
            return EXIT_OK
        budget = budgets.get(org_id)
    finally:
        db.close()
    if args.json:
        print(json.dumps({"org": args.org, **budget_json(budget)}, indent=2, sort_keys=True))
    elif budget is None:
        print(f"org {args.org}: no budget")
    else:
        share = f" ({100 * budget.used // budget.limit} %)" if budget.limit else ""
        spent = " (spent: turns wait until it is raised or the period turns)"
        print(
            f"org {args.org}: {budget.used} of {budget.limit} LLM tokens used this"
            f" {budget.period}{share}; {budget.waiting_turns} turns waiting"
            + (spent if budget.spent else "")
        )
    return EXIT_OK
