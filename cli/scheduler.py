"""``ibex scheduler`` (the Procfile line): send ``scan_sessions`` every
``SCAN_INTERVAL_SECONDS`` until SIGTERM or SIGINT. A thin trigger: the scan runs on a worker.
Before each send it closes the sessions idle for ``SESSION_IDLE_SECONDS``. With
``PRUNE_DONE_AFTER_DAYS`` it also prunes, once an hour and in a thread of its own (a long prune
must not delay the scans), what ``ibex prune --done-older-than <N>d --yes`` would; with
``PRUNE_DELETED_AFTER_DAYS``, what ``ibex prune --deleted-older-than <N>d --yes`` would. With
an embedder (``EMBEDDINGS_PROVIDER`` not ``none``), a thread embeds, every interval, a bounded
number of the memories lacking a vector of the configured model (what ``ibex reembed`` does,
in small rounds)."""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sys
import threading
from typing import Any

from cli.common import EXIT_OK
from core.config import Settings

#: The scheduler only sends messages: it runs before the first migration too.
DATABASE = False
#: The process's ``service.name`` in traces unless ``OTEL_SERVICE_NAME`` is set.
SERVICE = "ibex-scheduler"


def add_parser(sub: Any) -> None:
    sub.add_parser("scheduler", help="send scan_sessions every SCAN_INTERVAL_SECONDS")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from actors import scan_sessions
    from core import tracing
    from sessions.status import close_idle_sessions

    tracing.setup(SERVICE)  # each scan_sessions it sends starts a trace (actors/tracing.py)
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    interval = settings.scan_interval_seconds
    print(f"ibex scheduler: sending scan_sessions every {interval}s", flush=True)
    pruner = None
    if settings.prune_done_after_days is not None or settings.prune_deleted_after_days is not None:
        pruner = threading.Thread(
            target=prune_hourly, args=(settings, stop), name="prune", daemon=True
        )
        pruner.start()
    backfiller = None
    if settings.embeddings_provider != "none" and settings.database_url:
        backfiller = threading.Thread(
            target=backfill_rounds, args=(settings, stop), name="backfill", daemon=True
        )
        backfiller.start()
    while not stop.is_set():
        closed: int | None = None
        sent = False
        try:  # idle sessions first, so this scan already sees the ones it completes
            closed = close_idle_sessions(settings)
        except Exception as exc:  # a database blip must not end the schedule either
            print(f"ibex scheduler: could not close idle sessions: {exc}", file=sys.stderr)
        try:
            scan_sessions.send()
            sent = True
        except Exception as exc:  # a Redis blip must not end the schedule
            print(f"ibex scheduler: could not send scan_sessions: {exc}", file=sys.stderr)
        print(round_line(closed, sent), flush=True)
        stop.wait(interval)
    if backfiller is not None:
        backfiller.join(timeout=5)
    if pruner is not None:
        pruner.join(timeout=5)  # stops between batches; a batch is a short transaction
    tracing.flush()
    print("ibex scheduler: stopped", flush=True)
    return EXIT_OK


def round_line(closed: int | None, sent: bool) -> str:
    """The one line a round logs: idle sessions closed (None: the database did not answer)
    and whether the scan was sent; the worker's log says how many turns each scan sent."""
    closing = (
        "closed ? idle sessions"
        if closed is None
        else (f"closed {closed} idle session{'' if closed == 1 else 's'}")
    )
    sending = "sent scan_sessions" if sent else "scan_sessions NOT sent"
    return f"ibex scheduler: round: {closing}, {sending}"


#: Seconds between two prunes of the scheduler.
PRUNE_EVERY_SECONDS = 3600


def prune_hourly(settings: Settings, stop: threading.Event) -> None:
    """Prune once now, then every :data:`PRUNE_EVERY_SECONDS`, until ``stop`` is set."""
    from cli.erasure import Erasure
    from cli.status import database
    from extraction.turns import TurnStore

    db = None
    while not stop.is_set():
        try:
            db = db or database(settings)
            if settings.prune_done_after_days is not None:
                age = dt.timedelta(days=settings.prune_done_after_days)
                pruned = TurnStore(db).prune_done(dt.datetime.now(dt.UTC) - age, stop=stop.is_set)
                print(
                    f"ibex scheduler: pruned the extraction state of {pruned.turns} done turns"
                    f" ({pruned.slots} slots) older than {settings.prune_done_after_days}d",
                    flush=True,
                )
            if settings.prune_deleted_after_days is not None:
                age = dt.timedelta(days=settings.prune_deleted_after_days)
                erased = Erasure(db).erase(dt.datetime.now(dt.UTC) - age, stop=stop.is_set)
                print(
                    f"ibex scheduler: erased {erased.describe()} deleted more than"
                    f" {settings.prune_deleted_after_days}d ago",
                    flush=True,
                )
        except Exception as exc:  # a database blip must not end the schedule
            print(f"ibex scheduler: could not prune: {exc}", file=sys.stderr)
        stop.wait(PRUNE_EVERY_SECONDS)


#: The backfill round: at most this many batches of BACKFILL_BATCH memories per org a round
#: (bounded work however large the backlog; the next round continues).
BACKFILL_BATCH = 100
BACKFILL_BATCHES = 10


def backfill_rounds(settings: Settings, stop: threading.Event) -> None:
    """Every ``SCAN_INTERVAL_SECONDS``: embed the memories that lack a vector of the
    configured model (API writes during an embedder outage, turns extracted during one, rows
    from before semantic search), a bounded number per org, until ``stop`` is set. An outage
    or a database blip skips the round; the next one tries again."""
    from cli.reembed import _orgs
    from cli.status import database
    from embeddings import embedder_from_settings
    from memories.backfill import backfill
    from memories.vectors import EmbeddingStore

    embedder = embedder_from_settings(settings)
    if embedder is None:
        return
    db = None
    while not stop.is_set():
        try:
            db = db or database(settings)
            embeddings = EmbeddingStore(db)
            embedded = 0
            for org_id, _ in _orgs(db, None) or []:
                if stop.is_set():
                    break
                embedded += backfill(
                    embeddings,
                    embedder,
                    org_id,
                    batch_size=BACKFILL_BATCH,
                    max_batches=BACKFILL_BATCHES,
                ).embedded
            if embedded:
                print(f"ibex scheduler: embedded {embedded} memories", flush=True)
        except Exception as exc:  # an embedder outage or a database blip: next round
            print(f"ibex scheduler: could not backfill vectors: {exc}", file=sys.stderr)
        stop.wait(settings.scan_interval_seconds)
