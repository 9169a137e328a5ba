"""``ibex import FILE``: import sessions from a JSON Lines file (``-`` for standard input)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, positive_int
from core.config import Settings

DATABASE = True


def add_parser(sub: Any) -> None:
    p = sub.add_parser("import", help="import sessions from a JSON Lines file ('-' for stdin)")
    p.add_argument("file", help="path of the .jsonl file, or - for standard input")
    p.add_argument(
        "--max-line-bytes",
        type=positive_int,
        default=None,
        metavar="N",
        help="reject lines longer than N bytes (default 16777216, 16 MiB)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a stable JSON document: counts, each imported and each rejected line",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from cli.progress import Progress
    from models.importer import MAX_LINE_BYTES, ImportStopped, import_lines, read_lines
    from models.store import SessionStore

    store = SessionStore.from_url(settings.require_database_url())
    if args.file == "-":
        stream = sys.stdin.buffer
        close = False
    else:
        try:
            stream = open(args.file, "rb")  # noqa: SIM115
        except OSError as exc:
            print(f"ibex import: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return EXIT_FAILURE
        close = True
    progress = Progress("importing")
    stopped: ImportStopped | None = None
    try:
        report = import_lines(
            store,
            read_lines(stream, args.max_line_bytes or MAX_LINE_BYTES),
            lambda r: progress.update(
                r.lines,
                f"{r.sessions_created + r.sessions_extended} sessions, "
                f"{r.turns_added} turns, {r.lines_rejected} rejected",
            ),
            keep_lines=args.json,
        )
    except ImportStopped as exc:
        stopped, report = exc, exc.report
    except OSError as exc:
        print(f"ibex import: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        progress.close()
        if close:
            stream.close()
    if args.json:
        document = report.as_json()
        document["stopped"] = (
            {"line": stopped.line, "error": str(stopped)} if stopped is not None else None
        )
        print(json.dumps(document, sort_keys=True))
    else:
        for error in report.errors:
            print(f"ibex import: {error}", file=sys.stderr)
        print(report.summary())
    if stopped is not None:
        print(_stopped_message(stopped.line, str(stopped)), file=sys.stderr)
    return EXIT_FAILURE if report.errors or stopped is not None else EXIT_OK


def _stopped_message(line: int, reason: str) -> str:
    if line <= 1:
        return f"ibex import: stopped at line 1, nothing was imported: {reason}"
    done = "line 1" if line == 2 else f"lines 1-{line - 1}"
    return (
        f"ibex import: stopped at line {line}; what {done} imported is committed,"
        f" re-run the import to finish: {reason}"
    )
