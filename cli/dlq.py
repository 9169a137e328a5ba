"""``ibex dlq list|show|replay|purge``: the dead letters, in Redis and their Postgres mirror."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, print_json_or_empty
from cli.status import database, redis_client
from core.config import Settings

DATABASE = True


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dlq", help="list, show, replay or purge dead letters")
    dsub = p.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    ls = dsub.add_parser("list", help="list open dead letters")
    ls.add_argument("--queue")
    ls.add_argument("--actor")
    ls.add_argument("--json", action="store_true")
    show = dsub.add_parser("show", help="show one dead letter with its payload and traceback")
    show.add_argument("id")
    show.add_argument("--json", action="store_true")
    replay = dsub.add_parser("replay", help="send dead letters back to their queue, once")
    replay.add_argument("ids", nargs="*", metavar="ID")
    replay.add_argument("--all", action="store_true", help="every open dead letter (filtered)")
    replay.add_argument("--queue")
    replay.add_argument("--actor")
    replay.add_argument("--dry-run", action="store_true", help="say what would be replayed")
    purge = dsub.add_parser("purge", help="delete open dead letters")
    purge.add_argument("--queue")
    purge.add_argument("--older-than", metavar="AGE", help="e.g. 90s, 30m, 12h, 7d")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from actors.deadletters import DeadLetterStore

    store = DeadLetterStore(
        database(settings), redis_client(settings), lease_seconds=settings.extraction_lease_seconds
    )
    action = args.dlq_command
    if action == "list":
        return _dlq_list(store, args)
    if action == "show":
        return _dlq_show(store, args)
    if action == "replay":
        return _dlq_replay(store, args)
    return _dlq_purge(store, args)


def _dlq_list(store: Any, args: argparse.Namespace) -> int:
    letters = store.list(queue=args.queue, actor=args.actor)
    if print_json_or_empty(
        letters, as_json=args.json, to_json=lambda letter: letter.as_json(), empty="no dead letters"
    ):
        return EXIT_OK
    print(f"{'ID':<8} {'QUEUE':<8} {'ACTOR':<16} {'FAILED AT':<20} {'TRIES':>5}  SLOT / ERROR")
    for letter in letters:
        print(
            f"{letter.ref[:8]:<8} {letter.queue:<8} {letter.actor or '?':<16}"
            f" {letter.failed_at.strftime('%Y-%m-%d %H:%M:%S'):<20} {letter.attempts:>5}"
            f"  {letter.slot}"
        )
        if letter.malformed is not None:
            print(f"{'':<8} MALFORMED (cannot be replayed): {letter.malformed}")
        else:
            print(f"{'':<8} {letter.exception_type or '?'}: {letter.exception_message or ''}")
    print(f"{len(letters)} dead letters")
    return EXIT_OK


def _dlq_show(store: Any, args: argparse.Namespace) -> int:
    letter = store.get(args.id)
    if letter is None:
        print(f"ibex dlq: no open dead letter {args.id}", file=sys.stderr)
        return EXIT_FAILURE
    data = letter.as_json(full=True)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
        return EXIT_OK
    for key in (
        "id",
        "redis_message_id",
        "message_id",
        "queue",
        "actor",
        "org_id",
        "session_id",
        "turn_index",
        "ordinal",
        "failed_at",
        "attempts",
        "exception_type",
        "exception_message",
        "in_redis",
        "in_mirror",
        "malformed",
    ):
        print(f"{key:>18}: {data[key]}")
    print("           payload:")
    print(json.dumps(data["payload"], indent=2, sort_keys=True))
    print("         traceback:")
    print(data["traceback"] or "(none)")
    return EXIT_OK


def _dlq_replay(store: Any, args: argparse.Namespace) -> int:
    from cli.progress import Progress

    if args.all == bool(args.ids):
        print("ibex dlq replay: give dead letter IDs or --all (not both)", file=sys.stderr)
        return EXIT_USAGE
    if args.all:
        refs = [letter.ref for letter in store.list(queue=args.queue, actor=args.actor)]
    else:
        refs = list(args.ids)
    progress = Progress("replaying", total=len(refs))
    report = store.replay(refs, dry_run=args.dry_run, progress=progress.update)
    progress.close()
    for ref in report.missing:
        print(f"ibex dlq replay: no dead letter {ref}", file=sys.stderr)
    for ref, reason in report.refused:
        print(
            f"ibex dlq replay: {ref} is malformed ({reason}): not replayed; purge it",
            file=sys.stderr,
        )
    print(report.summary(dry_run=args.dry_run))
    return EXIT_FAILURE if report.missing or report.refused else EXIT_OK


def _dlq_purge(store: Any, args: argparse.Namespace) -> int:
    from cli.durations import parse_age

    older = None
    if args.older_than:
        try:
            older = parse_age(args.older_than)
        except ValueError as exc:
            print(f"ibex dlq purge: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if not args.yes:
        if not sys.stdin.isatty():
            print(
                "ibex dlq purge: refusing without --yes (no terminal to confirm on)",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        scope = f"queue {args.queue}" if args.queue else "all queues"
        age = f" older than {args.older_than}" if args.older_than else ""
        answer = input(f"Purge dead letters of {scope}{age}? This cannot be undone [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing purged")
            return EXIT_OK
    count = store.purge(queue=args.queue, older_than=older)
    print(f"purged {count} dead letters")
    return EXIT_OK
