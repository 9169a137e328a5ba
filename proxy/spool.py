"""The spool the proxy puts a recorded call on: the worker's Redis broker, one command.

The message itself (what it holds, how the worker stores it) is :mod:`sessions.chat`'s.
"""

from __future__ import annotations

from typing import Any, Protocol

from core import tracing
from sessions.chat import SPOOL_ACTOR, SPOOL_QUEUE


class Spool(Protocol):
    def put(self, message: dict[str, Any]) -> None: ...


class DramatiqSpool:
    """Enqueue on the worker's Redis broker (same namespace and queue layout) without
    importing the worker: one ``EVALSHA`` of Dramatiq's enqueue script per turn."""

    def __init__(self, redis_url: str, *, timeout_seconds: float = 1.0) -> None:
        import redis
        from dramatiq.brokers.redis import RedisBroker

        client = redis.Redis.from_url(
            redis_url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds
        )
        self.client = client
        self.broker = RedisBroker(client=client, middleware=[])
        self.broker.declare_queue(SPOOL_QUEUE)

    def put(self, message: dict[str, Any]) -> None:
        import dramatiq

        self.broker.enqueue(
            dramatiq.Message(
                queue_name=SPOOL_QUEUE,
                actor_name=SPOOL_ACTOR,
                args=(message,),
                kwargs={},
                # The chat request's trace context: the worker's span of this turn joins it.
                options=tracing.inject({}),
            )
        )

    def close(self) -> None:
        self.broker.close()
        self.client.close()
