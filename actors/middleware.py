"""Worker middleware: resource lifetimes and the dead-letter mirror.

- :class:`PipelineRuntime` builds the process's stage dependencies once, at process boot, into
  the runtime every actor is declared with (:data:`actors.stage.WORKER`): the
  database (a small connection pool), the LLM provider and one :class:`MemoryClient` (one
  pooled httpx client per process). Without ``DATABASE_URL`` (or ``MEMORY_SERVICE_TOKEN``) the
  worker process exits at once with a one-line error naming the variable: extraction without
  the session store is refused. It also shortens the interpreter's thread switch interval
  (:data:`WORKER_SWITCH_INTERVAL_S`).
- :class:`DatabaseConnection` checks a connection out of the pool for each message and gives it
  back when the message is acked or nacked.
- :class:`DeadLetterMirror` (``after_nack``) writes every failed message into
  ``ibex_core.dead_letters`` (payload, actor, queue, exception type and message, traceback,
  attempts, slot identity) and marks its turn ``failed`` with the reason, so the pointer of
  that session waits for an operator's replay.
- :func:`mirror_malformed` records in the same table a payload the consumer could not even
  decode into a message (see :mod:`actors.guard`), marked ``MalformedMessage`` with the reason.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import traceback
import uuid
from typing import Any

import dramatiq
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import Middleware
from playhouse.postgres_ext import PooledPostgresqlExtDatabase

from actors.logs import describe
from actors.runtime import WORKER
from core.config import Settings
from core.db import make_pool, transaction
from core.errors import ConfigError, DatabaseUnavailableError, PermanentError
from core.threads import SWITCH_INTERVAL_S, switch_often
from extraction import deadletter_rows
from extraction.deadletter_rows import DeadLetterRecord
from extraction.envelope import MALFORMED, decode_problem, salvage
from extraction.stages import StageDeps
from extraction.values import TurnRef
from schema.messages import ActorName
from sessions.store import SessionStore

log = logging.getLogger(__name__)


#: The actors whose messages name one turn: a dead letter of theirs fails that turn.
TURN_ACTORS = frozenset({ActorName.EXTRACT, ActorName.WRITE, ActorName.POINTER})


#: The worker process's thread switch interval (:mod:`core.threads` says why it is short).
WORKER_SWITCH_INTERVAL_S = SWITCH_INTERVAL_S


def install_deps(deps: StageDeps | None) -> None:
    """Set the stage dependencies of this process (tests, the CLI); None removes them."""
    WORKER.install(deps)


def pooled_database(url: str, max_connections: int) -> PooledPostgresqlExtDatabase:
    """A connection pool on ``url``: a message checks a connection out and gives it back."""
    return make_pool(url, max_connections=max_connections, application_name="ibex-worker")


def build_worker_deps(settings: Settings) -> StageDeps:
    """Everything a worker process needs, or a ConfigError naming the missing variable."""
    from extraction.memory_client import MemoryClient
    from extraction.providers import make_provider

    url = settings.require_database_url()
    if not settings.memory_service_token:
        raise ConfigError(
            "MEMORY_SERVICE_TOKEN is not set: the worker cannot write memories",
            variable="MEMORY_SERVICE_TOKEN",
        )
    db = pooled_database(url, max_connections=settings.worker_threads + 4)
    memory = MemoryClient(
        settings.memory_service_url,
        settings.memory_service_token,
        timeout=float(settings.http_timeout_seconds),
    )
    from embeddings import embedder_from_settings
    from extraction.metrics import PipelineMetrics, PrometheusMetrics
    from memories.vectors import EmbeddingStore

    embedder = embedder_from_settings(settings)
    if embedder is not None:
        # Register the model; a dimension that differs from the one its vectors were stored
        # with: refuse to start.
        try:
            EmbeddingStore(db).register(embedder.model, embedder.dimension)
        except DatabaseUnavailableError:
            log.warning("could not check the stored embedding dimension at start")
    return StageDeps(
        store=SessionStore(db),
        settings=settings,
        provider=make_provider(settings),
        memory=memory,
        metrics=PrometheusMetrics() if settings.metrics_port else PipelineMetrics(),
        embedder=embedder,
    )


class PipelineRuntime(Middleware):
    """Builds the stage dependencies at process boot; closes the HTTP clients at shutdown."""

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        switch_often()
        # httpx logs every request at INFO: five lines a turn, and nothing an operator needs.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        if WORKER.installed is not None:
            return
        try:
            install_deps(build_worker_deps(Settings.from_env()))
        except ConfigError as exc:
            # One line, then a non-zero exit of this worker process (and so of `dramatiq`).
            print(f"ibex worker: configuration error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        deps = WORKER.installed
        if deps is None:
            return
        for resource in (getattr(deps, "memory", None), getattr(deps, "provider", None)):
            close = getattr(resource, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.warning("closing %r failed", resource, exc_info=True)


class DatabaseConnection(Middleware):
    """One database connection per message, from the process's pool."""

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        deps = WORKER.installed
        if deps is not None:
            deps.store.db.connect(reuse_if_open=True)

    def _release(self) -> None:
        deps = WORKER.installed
        if deps is None:
            return
        db = deps.store.db
        try:
            if not db.is_closed() and not db.in_transaction():
                db.close()
        except Exception:
            log.warning("releasing the database connection failed", exc_info=True)

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self._release()

    def after_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        self._release()


def _identity(message: Any, actor_fn: Any | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if actor_fn is not None:
        with contextlib.suppress(TypeError):
            values.update(
                inspect.signature(actor_fn).bind_partial(*message.args, **message.kwargs).arguments
            )
    for key, value in (message.kwargs or {}).items():
        values.setdefault(key, value)
    out: dict[str, Any] = {}
    for key in ("org_id", "session_id"):
        try:
            out[key] = uuid.UUID(str(values[key]))
        except (KeyError, ValueError, TypeError, AttributeError):
            out[key] = None
    for key in ("turn_index", "ordinal"):
        value = values.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
        out[key] = value if ok else None
    return out


def _traceback_of(exc: BaseException | None) -> str | None:
    if exc is None or exc.__traceback__ is None:
        return None
    return "".join(traceback.format_exception(exc, limit=30))


class DeadLetterMirror(Middleware):
    """``after_nack``: every failed message into ``ibex_core.dead_letters``; its turn failed."""

    def after_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        try:
            self._mirror(broker, message)
        except Exception:
            # Never let the mirror break the worker: the message is in Redis's dead letters.
            log.exception("could not mirror dead letter %s", message.message_id)

    def _mirror(self, broker: dramatiq.Broker, message: Any) -> None:
        exc = getattr(message, "_exception", None)
        if exc is not None:
            exc_type, exc_message = type(exc).__name__, str(exc)
        else:
            exc_type, exc_message = None, None
        try:
            actor_fn = broker.get_actor(message.actor_name).fn
        except ActorNotFound:
            actor_fn = None
        retries = int(message.options.get("retries", 0) or 0)
        # Exhausted retries were already counted for this delivery; a thrown error was not.
        thrown = exc is None or isinstance(exc, PermanentError | ActorNotFound)
        ident = _identity(message, actor_fn)
        record = DeadLetterRecord(
            redis_message_id=str(message.options.get("redis_message_id") or message.message_id),
            message_id=str(message.message_id),
            queue_name=str(message.queue_name),
            actor_name=str(message.actor_name),
            payload=dict(message.asdict()),
            exception_type=exc_type,
            exception_message=exc_message,
            traceback=_traceback_of(exc) or message.options.get("traceback"),
            attempts=retries + (1 if thrown else 0),
            **ident,
        )
        # By actor, id, the ids it carries and the error's class: the error's message may
        # quote the payload (a conversation, a memory), which stays in the mirror.
        log.error("dead letter: %s: %s", describe(message), exc_type)
        deps = WORKER.installed
        if deps is None:
            log.error("no database in this process: dead letter %s not mirrored", record.message_id)
            return
        # One transaction: a worker killed in between must not leave a mirrored dead letter
        # whose turn is still pending (the scan would send it again behind the operator's back).
        with transaction(deps.store.db):
            deadletter_rows.mirror(deps.store.db, record)
            if (
                record.actor_name in TURN_ACTORS
                and record.org_id
                and record.session_id
                and record.turn_index
            ):
                ref = TurnRef(record.org_id, record.session_id, record.turn_index)
                deps.turns.mark_failed(ref, f"{exc_type}: {exc_message}")


def mirror_malformed(queue: str, redis_message_id: str, raw: bytes, reason: str) -> None:
    """Record a message the consumer could not deliver (see :mod:`actors.guard`) in
    ``ibex_core.dead_letters``, marked malformed with the reason. Its raw payload is kept as
    it is when it is a JSON object, else as text under ``raw``."""
    decoded, _ = decode_problem(raw)
    _fields, payload, message_id, actor = salvage(decoded, raw)
    record = DeadLetterRecord(
        redis_message_id=redis_message_id,
        message_id=message_id if isinstance(message_id, str) and message_id else redis_message_id,
        queue_name=queue,
        actor_name=actor if isinstance(actor, str) else "",
        payload=payload,
        exception_type=MALFORMED,
        exception_message=reason,
        traceback=None,
        attempts=1,
    )
    deps = WORKER.installed
    if deps is None:
        log.error(
            "no database in this process: malformed message %s not mirrored", redis_message_id
        )
        return
    db = deps.store.db
    try:
        deadletter_rows.mirror(db, record)
    finally:
        # The consumer thread holds no message: give the pool its connection back at once.
        if not db.is_closed() and not db.in_transaction():
            db.close()


def pipeline_middleware() -> list[Middleware]:
    """The pipeline's middleware in order; ``after_*`` hooks run in reverse, so the mirror
    writes before the connection is given back."""
    return [PipelineRuntime(), DatabaseConnection(), DeadLetterMirror()]


__all__ = [
    "WORKER_SWITCH_INTERVAL_S",
    "DatabaseConnection",
    "DeadLetterMirror",
    "PipelineRuntime",
    "build_worker_deps",
    "install_deps",
    "mirror_malformed",
    "pipeline_middleware",
    "pooled_database",
]
