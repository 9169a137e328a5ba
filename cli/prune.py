"""``ibex prune --done-older-than 30d [--dry-run] [--yes]``: delete the per-turn extraction
state (``extraction_turns`` and ``extraction_slots`` rows) of done turns that their session's
pointer has passed, done longer ago than the given age.

Nothing reads those rows again for correctness: a pruned turn stays done (it is below the
pointer), is never sent or extracted again, and a session that grows later extracts only its
new turns. The memories, checkpoints and payloads are kept. Deletes in short batches (see
:meth:`extraction.turns.TurnStore.prune_done`), so it may run while the pipeline runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, positive_int
from core.config import Settings
from core.durations import parse_age

DATABASE = True


def age_arg(value: str) -> dt.timedelta:
    """argparse type of an age: ``90s``, ``30m``, ``12h`` or ``30d`` (a usage error otherwise)."""
    try:
        age = parse_age(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if age <= dt.timedelta(0):
        raise argparse.ArgumentTypeError(f"must be more than zero: {value!r}")
    return age


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prune", help="delete the per-turn extraction state of done turns the pointer has passed"
    )
    p.add_argument(
        "--done-older-than",
        metavar="AGE",
        type=age_arg,
        required=True,
        help="only turns done longer ago than this, e.g. 30d, 12h",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted, only")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1000,
        metavar="N",
        help="turns per transaction (default 1000)",
    )
    p.add_argument("--json", action="store_true", help="stable JSON output")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from cli.status import database
    from core.progress import Progress
    from extraction.turns import TurnStore

    cutoff = dt.datetime.now(dt.UTC) - args.done_older_than
    turns = TurnStore(database(settings))
    found = turns.count_prunable(cutoff)
    what = (
        f"the extraction state of {found.turns} done turns ({found.turns} extraction_turns and"
        f" {found.slots} extraction_slots rows) done before {cutoff:%Y-%m-%d %H:%M:%S} UTC"
    )
    if args.dry_run or found.turns == 0:
        if args.json:
            _print_json(found, cutoff, dry_run=True, seconds=0.0)
        elif found.turns == 0:
            print("nothing to prune: no done turn passed by its pointer is that old")
        else:
            print(f"would delete {what}")
        return EXIT_OK
    if not args.yes:
        if not sys.stdin.isatty():
            print("ibex prune: refusing without --yes (no terminal to confirm on)", file=sys.stderr)
            return EXIT_FAILURE
        answer = input(f"Delete {what}? This cannot be undone [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing pruned")
            return EXIT_OK
    progress = Progress("pruning", total=found.turns)
    started = time.monotonic()
    pruned = turns.prune_done(
        cutoff,
        batch_size=args.batch_size,
        progress=lambda done: progress.update(done.turns, f"{done.slots} slots"),
    )
    progress.close()
    seconds = time.monotonic() - started
    if args.json:
        _print_json(pruned, cutoff, dry_run=False, seconds=seconds)
    else:
        print(
            f"pruned the extraction state of {pruned.turns} done turns ({pruned.turns}"
            f" extraction_turns and {pruned.slots} extraction_slots rows) in {seconds:.1f}s"
        )
    return EXIT_OK


def _print_json(counts: Any, cutoff: dt.datetime, *, dry_run: bool, seconds: float) -> None:
    print(
        json.dumps(
            {
                "cutoff": cutoff.isoformat(),
                "dry_run": dry_run,
                "turns": counts.turns,
                "slots": counts.slots,
                "seconds": round(seconds, 3),
            },
            sort_keys=True,
        )
    )
