"""``ibex extract``: run the stage functions inline and sequentially, without the broker: for
debugging, and as the sequential baseline of the benchmarks. It refuses to run without a
database (fail closed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, add_session_args, resolve_session
from core.config import Settings
from core.errors import PermanentError, TransientError

log = logging.getLogger(__name__)

DATABASE = True


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "extract", help="run the extraction stages inline, without the broker (debugging)"
    )
    add_session_args(p)
    p.add_argument("--json", action="store_true", help="stable JSON output")


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

    def extract(self, turn: Any, context: Sequence[Any], related: Sequence[Any] = ()) -> Any:
        self.calls += 1
        return self.inner.extract(turn, context, related)


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
    from extraction.dispatch import run_message
    from extraction.retry import RetryPolicy
    from extraction.stages import Delivery
    from schema.messages import ActorName

    policy = RetryPolicy.from_settings(deps.settings)
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
            time.sleep(min(policy.delay_for(exc, tries) / 1000, INLINE_MAX_WAIT_S))
            queue.append((message, tries + 1, delivery))
            continue
        if message.actor_name == ActorName.POINTER:
            status = deps.turns.turn_status(_ref(message.kwargs))
            if status is not None and status.state == "done":
                report.turns_done += 1
        queue.extend((m, 0, Delivery()) for m in follow)


def _release(deps: Any, message: Any, exc: BaseException) -> None:
    """Nothing retries a message this run gave up on: free its turn for the next run now,
    instead of leaving it leased for EXTRACTION_LEASE_SECONDS."""
    if "turn_index" not in message.kwargs:
        return
    try:
        deps.turns.release_lease(_ref(message.kwargs), f"{type(exc).__name__}: {exc}")
    except Exception:
        log.warning("could not release the lease of %s", message, exc_info=True)


def _ref(kwargs: Mapping[str, Any]) -> Any:
    from extraction.values import TurnRef

    return TurnRef.of(kwargs["org_id"], kwargs["session_id"], kwargs["turn_index"])


def run(args: argparse.Namespace, settings: Settings) -> int:
    from extraction.memory_client import MemoryClient
    from extraction.providers import make_provider
    from extraction.stages import StageDeps, scan
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
    from embeddings import embedder_from_settings

    # The same stages as the worker's, vectors included (one embedding request per turn).
    deps = StageDeps(
        store=store,
        settings=settings,
        provider=provider,
        memory=memory,
        embedder=embedder_from_settings(settings),
    )
    started = time.monotonic()
    report = InlineReport()
    try:
        scanned = scan(deps, session_id=session_id)
        report.turns_sent = scanned.turns
        retried = deps.turns.last_errors([_ref(m.kwargs) for m in scanned.sent])
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


__all__ = ["DATABASE", "InlineReport", "add_parser", "drain_inline", "run"]
