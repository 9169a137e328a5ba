"""``ibex prune --done-older-than 30d [--dry-run] [--yes]``: delete the per-turn extraction
state (``extraction_turns`` and ``extraction_slots`` rows) of done turns that their session's
pointer has passed, done longer ago than the given age.

Nothing reads those rows again for correctness: a pruned turn stays done (it is below the
pointer), is never sent or extracted again, and a session that grows later extracts only its
new turns. The memories, checkpoints and payloads are kept. Deletes in short batches (see
:meth:`extraction.turns.TurnStore.prune_done`), so it may run while the pipeline runs.

``ibex prune --deleted-older-than 30d`` erases what was soft-deleted longer ago than the age:
sessions with their checkpoints, payload archive, extraction state, memories and dead
letters; deleted memories; forgotten users with their tokens (:mod:`models.erasure`). Either
flag, or both (the done turns first).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, positive_int
from cli.durations import parse_age
from core.config import Settings

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
        "prune",
        help="delete the per-turn extraction state of done turns the pointer has passed,"
        " and erase what was soft-deleted long ago",
    )
    p.add_argument(
        "--done-older-than",
        metavar="AGE",
        type=age_arg,
        help="only turns done longer ago than this, e.g. 30d, 12h",
    )
    p.add_argument(
        "--deleted-older-than",
        metavar="AGE",
        type=age_arg,
        help="erase sessions (with their turns, payloads, extraction state and memories),"
        " memories and users soft-deleted longer ago than this, e.g. 30d",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted, only")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1000,
        metavar="N",
        help="turns (or deleted sessions, memories, users) per transaction (default 1000)",
    )
    p.add_argument("--json", action="store_true", help="stable JSON output")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.done_older_than is None and args.deleted_older_than is None:
        print(
            "ibex prune: give --done-older-than AGE, --deleted-older-than AGE, or both",
            file=sys.stderr,
        )
        return EXIT_USAGE
    code = EXIT_OK
    if args.done_older_than is not None:
        code = _prune_done(args, settings)
    if code == EXIT_OK and args.deleted_older_than is not None:
        code = _erase_deleted(args, settings)
    return code


def _erase_deleted(args: argparse.Namespace, settings: Settings) -> int:
    from cli.progress import Progress
    from cli.status import database
    from models.erasure import Erasure

    cutoff = dt.datetime.now(dt.UTC) - args.deleted_older_than
    erasure = Erasure(database(settings))
    found = erasure.count(cutoff)
    what = f"{found.describe()} deleted before {cutoff:%Y-%m-%d %H:%M:%S} UTC"
    if args.dry_run or found.total == 0:
        if args.json:
            _print_erased_json(found, cutoff, dry_run=True, seconds=0.0)
        elif found.total == 0:
            print("nothing to erase: nothing was deleted that long ago")
        else:
            print(f"would erase {what}")
        return EXIT_OK
    refused = _unconfirmed(args, f"Erase {what}?", "nothing erased")
    if refused is not None:
        return refused
    progress = Progress("erasing", total=found.total)
    started = time.monotonic()
    erased = erasure.erase(
        cutoff,
        batch_size=args.batch_size,
        progress=lambda done: progress.update(done.total, f"{done.sessions} sessions"),
    )
    progress.close()
    seconds = time.monotonic() - started
    if args.json:
        _print_erased_json(erased, cutoff, dry_run=False, seconds=seconds)
    else:
        print(f"erased {erased.describe()} in {seconds:.1f}s")
    return EXIT_OK


def _unconfirmed(args: argparse.Namespace, question: str, declined: str) -> int | None:
    """None when the deletion may go ahead (``--yes``, or a person said yes on the terminal);
    otherwise the exit status to stop with."""
    if args.yes:
        return None
    if not sys.stdin.isatty():
        print("ibex prune: refusing without --yes (no terminal to confirm on)", file=sys.stderr)
        return EXIT_FAILURE
    answer = input(f"{question} This cannot be undone [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        print(declined)
        return EXIT_OK
    return None


def _print_erased_json(erased: Any, cutoff: dt.datetime, *, dry_run: bool, seconds: float) -> None:
    print(
        json.dumps(
            {
                "deleted_cutoff": cutoff.isoformat(),
                "dry_run": dry_run,
                "erased": erased.as_json(),
                "seconds": round(seconds, 3),
            },
            sort_keys=True,
        )
    )


def _prune_done(args: argparse.Namespace, settings: Settings) -> int:
    from cli.progress import Progress
    from cli.status import database
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
    refused = _unconfirmed(args, f"Delete {what}?", "nothing pruned")
    if refused is not None:
        return refused
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
