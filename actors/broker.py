"""The Dramatiq broker every actor is declared on, and how follow-up messages are sent.

Importing this module installs the process's broker (a :class:`RedisBroker` on ``REDIS_URL``)
as Dramatiq's global broker, so ``dramatiq actors`` finds it. Tests swap it with
:func:`use_broker` (a :class:`StubBroker`, or a RedisBroker on fakeredis), which moves every
declared actor onto the new broker.

Settings chosen on purpose (Dramatiq's delivery facts behind them: docs/reliability.md):

- ``heartbeat_timeout`` 30 s, the heartbeat refreshed every second and every consumer running
  Dramatiq's maintenance on its queue every 10 s (:mod:`actors.guard`): a killed worker's
  unacked messages come back within about 40 s instead of Dramatiq's default of tens of
  minutes. The scan's leases remain the real backstop (some retries are dropped).
- Retries from the one :class:`~extraction.retry.RedeliveryPolicy` (``MAX_RETRIES``,
  ``RETRY_MIN_BACKOFF_MS``, ``RETRY_MAX_BACKOFF_MS``); permanent
  errors are in every actor's ``throws`` and never retried.
- The time limit sits above the LLM and HTTP timeouts, so a slow call fails as a timeout (a
  clean retry) before Dramatiq's asynchronous interrupt would hit the thread.
- The consumers are guarded (:mod:`actors.guard`): a payload the worker cannot run becomes a
  dead letter, mirrored into Postgres, instead of crashing the consumer and its batch.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.encoder import JSONEncoder
from dramatiq.middleware import (
    AgeLimit,
    CurrentMessage,
    Middleware,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from core.config import Settings, export_environment
from core.errors import ConfigError
from core.fastjson import compact, loads
from extraction.retry import RedeliveryPolicy
from extraction.stages import Send
from schema.messages import Queue

if TYPE_CHECKING:
    from actors.guard import GuardedRedisBroker

log = logging.getLogger(__name__)

#: A worker silent for this long is presumed dead and its messages are requeued (ms).
HEARTBEAT_TIMEOUT_MS = 30_000
#: Slack on top of the slowest single call a stage makes, for the database work around it.
TIME_LIMIT_SLACK_S = 60


def time_limit_ms(settings: Settings) -> int:
    slowest = max(settings.llm_timeout_seconds, settings.http_timeout_seconds)
    return (slowest + TIME_LIMIT_SLACK_S) * 1000


class TurnBusyRetry(dramatiq.Retry):
    """Wait for another delivery's LLM claim to end. Not counted against ``MAX_RETRIES``: the
    wait is bounded by the claim's expiry, and the turn's own attempt counter bounds how often
    a claim can be taken at all."""


def retry_when(max_retries: int) -> Callable[[int, BaseException], bool]:
    def should_retry(retries: int, exception: BaseException) -> bool:
        return isinstance(exception, TurnBusyRetry) or retries < max_retries

    return should_retry


def base_middleware(settings: Settings) -> list[Middleware]:
    policy = RedeliveryPolicy.from_settings(settings)
    return [
        AgeLimit(),
        TimeLimit(time_limit=time_limit_ms(settings)),
        ShutdownNotifications(),
        Retries(
            max_retries=policy.max_retries,
            min_backoff=policy.min_backoff_ms,
            max_backoff=policy.max_backoff_ms,
            retry_when=retry_when(policy.max_retries),
        ),
        # The running message, for the stage actors: what a retry carries (actors/stage.py).
        CurrentMessage(),
    ]


def metrics_middleware(settings: Settings) -> list[Middleware]:
    """Dramatiq's Prometheus middleware on ``METRICS_PORT`` (none when it is unset). Every
    worker process writes its series to a directory per port; the master's exposition server
    serves them all, the pipeline's own ``ibex_*`` series included."""
    if not settings.metrics_port:
        return []
    port = settings.metrics_port
    export_environment(
        {
            "dramatiq_prom_port": str(port),
            "dramatiq_prom_host": "0.0.0.0",  # noqa: S104 - scraped from other hosts
            "dramatiq_prom_db": os.path.join(tempfile.gettempdir(), f"ibex-worker-metrics-{port}"),
        }
    )
    from dramatiq.middleware.prometheus import Prometheus

    class WorkerMetrics(Prometheus):
        # Dramatiq forks the exposition server from the master process, which never imported
        # this module: fork a function of ours, so that importing it configures the port.
        @property
        def forks(self) -> list[Any]:
            return [serve_metrics]

    return [WorkerMetrics()]


def serve_metrics() -> int:
    """The worker's metrics endpoint: a process the ``dramatiq`` master forks. Importing this
    module built the broker, which exported ``METRICS_PORT`` to Dramatiq's Prometheus module."""
    from dramatiq.middleware.prometheus import _run_exposition_server

    return int(_run_exposition_server() or 0)


def make_broker(
    settings: Settings,
    *,
    stub: bool = False,
    client: object | None = None,
    extra_middleware: Iterable[Middleware] | None = None,
) -> dramatiq.Broker:
    """A broker for ``settings``: Redis from ``REDIS_URL`` (or ``client``, e.g. fakeredis), or a
    StubBroker for unit tests. The pipeline's own middleware is added unless
    ``extra_middleware`` replaces it."""
    from actors import logs
    from actors.guard import GuardedRedisBroker
    from actors.middleware import mirror_malformed, pipeline_middleware
    from actors.tracing import tracing_middleware

    logs.install()  # messages are logged by actor, id and ids, never their text
    middleware = base_middleware(settings)
    middleware.extend(pipeline_middleware() if extra_middleware is None else extra_middleware)
    middleware.extend(tracing_middleware())  # none unless OTEL_* asks for traces
    broker: dramatiq.Broker
    if stub:
        return StubBroker(middleware=middleware)
    middleware.extend(metrics_middleware(settings))
    # A message the worker cannot run becomes a dead letter instead of crashing the consumer.
    if client is not None:
        broker = GuardedRedisBroker(
            client=client,
            middleware=middleware,
            heartbeat_timeout=HEARTBEAT_TIMEOUT_MS,
            on_malformed=mirror_malformed,
        )
    else:
        broker = GuardedRedisBroker(
            url=settings.redis_url,
            middleware=middleware,
            heartbeat_timeout=HEARTBEAT_TIMEOUT_MS,
            on_malformed=mirror_malformed,
        )
    return broker


def use_broker(new: dramatiq.Broker) -> dramatiq.Broker:
    """Make ``new`` the global broker and move every declared actor onto it; returns it."""
    global broker
    old = broker
    for actor in list(old.actors.values()):
        actor.broker = new
        new.declare_actor(actor)
    broker = new
    dramatiq.set_broker(new)
    return new


def current_broker() -> dramatiq.Broker:
    """The broker the actors are declared on now (after any :func:`use_broker`)."""
    return broker


#: Messages per Redis round trip when :func:`send_all` sends through the Redis broker.
SEND_PIPELINE_SIZE = 1000


def send_all(messages: Iterable[Send]) -> int:
    """Send follow-up messages through the current broker; return how many were sent.

    On the pipeline's Redis broker (:class:`~actors.guard.GuardedRedisBroker`) the messages go
    out in batches of :data:`SEND_PIPELINE_SIZE`, each message built as ``RedisBroker.enqueue``
    builds it (a fresh ``redis_message_id``, the enqueue middleware hooks), each batch in one
    round trip of one HSET and one RPUSH per queue. Any other broker sends one message at a
    time."""
    from actors.guard import GuardedRedisBroker

    current = broker
    if isinstance(current, GuardedRedisBroker):
        return _send_pipelined(current, messages)
    count = 0
    for message in messages:
        current.get_actor(message.actor_name).send_with_options(kwargs=message.kwargs)
        count += 1
    return count


def _send_pipelined(redis_broker: GuardedRedisBroker, messages: Iterable[Send]) -> int:
    count = 0
    batch: list[Send] = []
    for message in messages:
        batch.append(message)
        if len(batch) >= SEND_PIPELINE_SIZE:
            count += _send_batch(redis_broker, batch)
            batch = []
    if batch:
        count += _send_batch(redis_broker, batch)
    return count


def _overrides(middleware: Iterable[Middleware], hook: str) -> bool:
    """Whether any of ``middleware`` implements ``hook`` (the base class's does nothing)."""
    return any(getattr(type(m), hook, None) is not getattr(Middleware, hook) for m in middleware)


def _send_batch(redis_broker: GuardedRedisBroker, batch: list[Send]) -> int:
    """``RedisBroker.enqueue`` (no delay) for every message of ``batch``, in one round trip.
    The middleware hooks run per message as ``enqueue`` runs them, unless no middleware
    implements them."""
    before = _overrides(redis_broker.middleware, "before_enqueue")
    after = _overrides(redis_broker.middleware, "after_enqueue")
    actors: dict[str, dramatiq.Actor[Any, Any]] = {}
    enqueued: list[dramatiq.Message[Any]] = []
    by_queue: dict[str, list[tuple[str, bytes]]] = {}
    for send in batch:
        actor = actors.get(send.actor_name)
        if actor is None:
            actor = actors[send.actor_name] = redis_broker.get_actor(send.actor_name)
        # What actor.message_with_options(kwargs=...) builds, with enqueue's fresh
        # redis_message_id set at once instead of in a copy.
        redis_id = str(uuid4())
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=actor.queue_name,
            actor_name=actor.actor_name,
            args=(),
            kwargs=send.kwargs,
            options={"redis_message_id": redis_id},
        )
        if before:
            redis_broker.emit_before("enqueue", message, None)
        by_queue.setdefault(message.queue_name, []).append((redis_id, message.encode()))
        enqueued.append(message)
    redis_broker.push(by_queue)
    if after:
        for message in enqueued:
            redis_broker.emit_after("enqueue", message, None)
    return len(enqueued)


class MessageEncoder(JSONEncoder):
    """Dramatiq's JSON encoder at orjson's speed: a message is written as
    :func:`core.fastjson.compact` writes it (``json.dumps``'s JSON, but text outside ASCII
    kept as UTF-8 rather than escaped: the same document) and read by orjson, what orjson
    refuses (or would read otherwise) by Dramatiq's own decoder, which raises its
    ``DecodeError`` as before."""

    def encode(self, data: dict[str, Any]) -> bytes:
        try:
            return compact(data)
        except UnicodeEncodeError:  # a lone surrogate (an exception's text): escaped by json
            return super().encode(data)

    def decode(self, data: bytes) -> dict[str, Any]:
        decoded: dict[str, Any] = loads(data, super().decode)
        return decoded


def _initial_broker() -> dramatiq.Broker:
    # Importing the actors must not fail on configuration: the CLI reports configuration errors
    # itself, and a worker reports them (one line, non-zero exit) when its process boots.
    try:
        settings = Settings.from_env()
    except ConfigError:
        settings = Settings.from_env({})
    return make_broker(settings)


dramatiq.set_encoder(MessageEncoder())
broker: dramatiq.Broker = _initial_broker()
dramatiq.set_broker(broker)

__all__ = [
    "SEND_PIPELINE_SIZE",
    "MessageEncoder",
    "Queue",
    "TurnBusyRetry",
    "broker",
    "current_broker",
    "make_broker",
    "send_all",
    "time_limit_ms",
    "use_broker",
]
