"""Traces through the queue: the W3C trace context rides in each message's options.

:class:`TraceMessages` is in the broker's middleware only when the ``OTEL_*`` variables ask for
traces (:func:`core.tracing.wanted`); otherwise nothing of it runs.

- On enqueue, a message that carries no ``traceparent`` yet gets the current span's. A retry
  (Dramatiq's ``Retries`` copies the options) and a replay from the dead-letter queue (``ibex
  dlq replay`` keeps them) carry the one their first delivery had, so they join its trace.
- Each ``extract_turn`` message starts its turn's trace: a root span ``scan turn`` (producer),
  linked to the span that sent it (the scan's), so one trace holds one turn, from the scan
  through extract, the LLM call, the writes and their memory POSTs, and the pointer.
- A message sent with no span current (the scheduler's ``scan_sessions``) starts a trace with
  a ``<actor> send`` producer span.
- On processing, the actor runs inside ``<actor> process`` (consumer), a child of the context
  the message carries, with the actor, the message id, the queue, the retry count and the ids
  the message names (org, session, turn, ordinal): never its text.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import threading
import uuid
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware

from core import tracing
from schema.messages import ActorName

#: The process's ``service.name`` unless ``OTEL_SERVICE_NAME`` is set.
WORKER_SERVICE = "ibex-worker"


def message_ids(message: Any) -> dict[str, Any]:
    """The ids a message's keyword arguments name, as span attributes (``ibex.org_id``, ...);
    anything that is not an id is left out."""
    kwargs = message.kwargs if isinstance(message.kwargs, dict) else {}
    out: dict[str, Any] = {}
    for key in ("org_id", "session_id"):
        value = kwargs.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                out[f"ibex.{key}"] = str(uuid.UUID(value))
    for key in ("turn_index", "ordinal"):
        value = kwargs.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[f"ibex.{key}"] = value
    return out


def _attributes(message: Any, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": "dramatiq",
        "messaging.operation.type": operation,
        "messaging.destination.name": str(message.queue_name),
        "messaging.message.id": str(message.message_id),
        "ibex.actor": str(message.actor_name),
        **message_ids(message),
    }


class TraceMessages(Middleware):
    """The trace context into each message's options, and each delivery inside a span."""

    def __init__(self) -> None:
        self._running = threading.local()

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        if tracing.setup(WORKER_SERVICE):
            # A worker process ends through multiprocessing, which skips atexit (where the SDK
            # flushes) but runs its own finalizers, also when a second SIGTERM cuts the
            # graceful stop short: the spans still queued are exported then.
            multiprocessing.util.Finalize(None, tracing.flush, exitpriority=10)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        tracing.flush()

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        options = message.options
        if "traceparent" in options or not tracing.enabled():
            return  # a retry or a replay stays in its trace
        if message.actor_name == ActorName.EXTRACT:
            with tracing.span(
                "scan turn",
                kind="producer",
                parent=tracing.root(),
                links=tracing.current_link(),
                attributes=_attributes(message, "send"),
            ):
                tracing.inject(options)
        elif tracing.has_current():
            tracing.inject(options)
        else:
            with tracing.span(
                f"{message.actor_name} send",
                kind="producer",
                attributes=_attributes(message, "send"),
            ):
                tracing.inject(options)

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        if not tracing.enabled():
            return
        attributes = _attributes(message, "process")
        attributes["ibex.retries"] = int(message.options.get("retries", 0) or 0)
        self._running.span = tracing.begin(
            f"{message.actor_name} process",
            kind="consumer",
            parent=tracing.parent_of(message.options),
            attributes=attributes,
        )

    def _end(self, exception: BaseException | None) -> None:
        running = getattr(self._running, "span", None)
        self._running.span = None
        if running is not None:
            running.end(exception)

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._end(exception)

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self._end(None)


def tracing_middleware() -> list[Middleware]:
    """:class:`TraceMessages` when the ``OTEL_*`` variables ask for traces, else nothing."""
    return [TraceMessages()] if tracing.wanted() else []


__all__ = ["WORKER_SERVICE", "TraceMessages", "message_ids", "tracing_middleware"]
