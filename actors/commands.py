"""``ibex scan``, ``ibex extract`` and ``ibex scheduler`` (DESIGN sections 2 and 8).

- ``scan`` runs one scan now and sends its ``extract_turn`` messages through the broker.
- ``extract`` runs the same stage functions inline and sequentially, without the broker: for
  debugging, and as the sequential baseline of the benchmarks. It refuses to run without a
  database (fail closed).
- ``scheduler`` (the Procfile line) sends ``scan_sessions`` every ``SCAN_INTERVAL_SECONDS``
  until SIGTERM or SIGINT: a thin trigger, the scan itself runs on a worker. Before each send
  it closes the sessions idle for ``SESSION_IDLE_SECONDS``.

Registered with :func:`core.cli.register` when the CLI loads its extensions.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.cli import EXIT_FAILURE, EXIT_OK, register
from core.config import Settings
from core.errors import NotFoundError, PermanentError, TransientError, TurnBusyError
from models.store import close_idle_sessions

log = logging.getLogger(__name__)


def add_session_args(p: Any) -> None:
    """``--session ID`` (the session's external id or its UUID) and the ``--org`` and
    ``--agent`` slugs that pick one when an external id is used in several places."""
    p.add_argument(
        "--session", metavar="ID", type=session_id_arg, help="only this session (id or UUID)"
    )
    p.add_argument("--org", metavar="SLUG", help="the session's org, when --session is ambiguous")
    p.add_argument("--agent", metavar="SLUG", help="the session's agent, when ambiguous")


def _add_scan(sub: Any) -> None:
    p = sub.add_parser("scan", help="run one extraction scan now and send what it finds")
    add_session_args(p)
    p.add_argument("--json", action="store_true", help="stable JSON output")
    p.add_argument(
        "--verbose", dest="list_messages", action="store_true", help="list every message sent"
    )


def _add_extract(sub: Any) -> None:
    p = sub.add_parser(
        "extract", help="run the extraction stages inline, without the broker (debugging)"
    )
    add_session_args(p)
    p.add_argument("--json", action="store_true", help="stable JSON output")


def _add_scheduler(sub: Any) -> None:
    sub.add_parser("scheduler", help="send scan_sessions every SCAN_INTERVAL_SECONDS")


register("scan", _add_scan, "actors.commands:run_scan")
register("extract", _add_extract, "actors.commands:run_extract")
register("scheduler", _add_scheduler, "actors.commands:run_scheduler", database=False)


def session_id_arg(value: str) -> str:
    """argparse type of ``--session``: an empty or overlong id is a usage error (status 2)."""
    value = value.strip()
    if not value or len(value) > 512:
        raise argparse.ArgumentTypeError(f"not a session id: {value!r}")
    return value


def resolve_session(store: Any, args: argparse.Namespace) -> uuid.UUID | None:
    """The session ``--session`` names (with ``--org``/``--agent``), or None without it.
    Raises :class:`~core.errors.NotFoundError` when it names none or several."""
    if args.session is None:
        if args.org or args.agent:
            raise NotFoundError("--org and --agent narrow --session: give --session too")
        return None
    found = store.find_sessions(args.session, org=args.org, agent=args.agent)
    narrowed = "".join(
        f" {flag} {value}"
        for flag, value in (("--org", args.org), ("--agent", args.agent))
        if value
    )
    if not found:
        raise NotFoundError(f"no session {args.session!r}{narrowed}")
    if len(found) > 1:
        raise NotFoundError(
            f"session {args.session!r}{narrowed} is ambiguous: "
            + ", ".join(str(name) for name in found)
            + "; add --org and/or --agent"
        )
    return uuid.UUID(str(found[0].session_id))


# -- ibex scan -------------------------------------------------------------------------------


def run_scan(args: argparse.Namespace, settings: Settings) -> int:
    from extraction.stages import StageDeps, scan
    from models.store import SessionStore

    store = SessionStore.from_url(settings.require_database_url())
    session_id = resolve_session(store, args)
    report = scan(StageDeps(store=store, settings=settings), session_id=session_id)

    from actors.broker import send_all

    send_all(report.sent)
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
        print(f"{report.sessions} sessions scanned, {report.turns} turns sent")
    return EXIT_OK


# -- ibex extract ----------------------------------------------------------------------------

#: How often ``ibex extract`` retries a transient failure of one message before reporting it.
INLINE_RETRIES = 3
#: The longest ``ibex extract`` waits before retrying one message.
INLINE_MAX_WAIT_S = 5.0


class _CountingProvider:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.calls = 0

    def extract(self, turn: Any, context: Sequence[Any]) -> Any:
        self.calls += 1
        return self.inner.extract(turn, context)


class _CountingMemory:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.posts = 0
        self.created = 0

    def create_memory(self, org_id: Any, body: Mapping[str, Any], idempotency_key: str) -> Any:
        self.posts += 1
        outcome = self.inner.create_memory(org_id, body, idempotency_key)
        if 200 <= outcome.status < 300 and not outcome.replayed:
            self.created += 1
        return outcome


@dataclass
class InlineReport:
    turns_sent: int = 0
    turns_done: int = 0
    messages: int = 0
    failures: list[str] = field(default_factory=list)


def drain_inline(deps: Any, first: Sequence[Any], report: InlineReport) -> None:
    """Run ``first`` and everything it leads to, one message at a time, in this thread."""
    from extraction.stages import POINTER, Delivery, run_message

    # Each message keeps its Delivery across its retries, as a worker's message keeps its id.
    queue = deque((m, 0, Delivery()) for m in first)
    while queue:
        message, tries, delivery = queue.popleft()
        report.messages += 1
        try:
            follow = run_message(deps, message.actor_name, message.kwargs, delivery=delivery)
        except PermanentError as exc:
            report.failures.append(f"{message}: {type(exc).__name__}: {exc}")
            _release(deps, message, exc)
            continue
        except TransientError as exc:
            if tries >= INLINE_RETRIES:
                report.failures.append(f"{message}: gave up: {type(exc).__name__}: {exc}")
                _release(deps, message, exc)
                continue
            wait = getattr(exc, "retry_after", None)
            if wait is None or not isinstance(exc, TurnBusyError):
                wait = deps.settings.retry_min_backoff_ms / 1000 * 2**tries
            time.sleep(min(max(float(wait), 0.05), INLINE_MAX_WAIT_S))
            queue.append((message, tries + 1, delivery))
            continue
        if message.actor_name == POINTER:
            status = deps.state.turn_status(_ref(message.kwargs))
            if status is not None and status.state == "done":
                report.turns_done += 1
        queue.extend((m, 0, Delivery()) for m in follow)


def _release(deps: Any, message: Any, exc: BaseException) -> None:
    """Nothing retries a message this run gave up on: free its turn for the next run now,
    instead of leaving it leased for EXTRACTION_LEASE_SECONDS."""
    if "turn_index" not in message.kwargs:
        return
    try:
        deps.state.release_lease(_ref(message.kwargs), f"{type(exc).__name__}: {exc}")
    except Exception:
        log.warning("could not release the lease of %s", message, exc_info=True)


def _ref(kwargs: Mapping[str, Any]) -> Any:
    from extraction.state import TurnRef

    return TurnRef.of(kwargs["org_id"], kwargs["session_id"], kwargs["turn_index"])


def run_extract(args: argparse.Namespace, settings: Settings) -> int:
    from extraction.providers import make_provider
    from extraction.stages import StageDeps, scan
    from memory_service.client import MemoryClient
    from models.store import SessionStore

    # Fail closed: no database, no extraction (the ConfigError names DATABASE_URL).
    store = SessionStore.from_url(settings.require_database_url())
    session_id = resolve_session(store, args)
    if not settings.memory_service_token:
        print(
            "ibex extract: configuration error: MEMORY_SERVICE_TOKEN is not set: cannot write"
            " memories",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    provider = _CountingProvider(make_provider(settings))
    client = MemoryClient(
        settings.memory_service_url,
        settings.memory_service_token,
        timeout=float(settings.http_timeout_seconds),
    )
    memory = _CountingMemory(client)
    deps = StageDeps(store=store, settings=settings, provider=provider, memory=memory)
    started = time.monotonic()
    report = InlineReport()
    try:
        scanned = scan(deps, session_id=session_id)
        report.turns_sent = scanned.turns
        retried = deps.state.last_errors([_ref(m.kwargs) for m in scanned.sent])
        if not args.json:
            for ref, error in retried.items():
                print(
                    f"ibex extract: retrying turn {ref.turn_index} of session {ref.session_id};"
                    f" it failed last time: {error}",
                    file=sys.stderr,
                )
        drain_inline(deps, scanned.sent, report)
    finally:
        client.close()
    elapsed = time.monotonic() - started
    summary = {
        "sessions": scanned.sessions,
        "turns": report.turns_sent,
        "turns_done": report.turns_done,
        "memories": memory.created,
        "memory_posts": memory.posts,
        "llm_calls": provider.calls,
        "failures": report.failures,
        "retried": [
            {"session_id": str(r.session_id), "turn_index": r.turn_index, "last_error": e}
            for r, e in retried.items()
        ],
        "seconds": round(elapsed, 3),
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        for failure in report.failures:
            print(f"ibex extract: {failure}", file=sys.stderr)
        print(
            f"{scanned.sessions} sessions, {report.turns_sent} turns, {report.turns_done} done,"
            f" {memory.created} memories written ({memory.posts} POSTs),"
            f" {provider.calls} LLM calls, {len(report.failures)} failed, {elapsed:.2f}s"
        )
    return EXIT_FAILURE if report.failures else EXIT_OK


# -- ibex scheduler --------------------------------------------------------------------------


def run_scheduler(args: argparse.Namespace, settings: Settings) -> int:
    from actors import scan_sessions

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


__all__ = ["drain_inline", "run_extract", "run_scan", "run_scheduler"]
