"""Dramatiq's Redis key layout, and the queue counts ``ibex status`` and the backlog gauges show.

A queue ``q`` of namespace ``ns`` is the list ``ns:q`` (ready message ids) with its payloads in
``ns:q.msgs``; delayed messages (retries waiting their backoff) are ``ns:q.DQ``; dead ones are
the sorted set ``ns:q.XQ`` (by failure time) with payloads in ``ns:q.XQ.msgs``. Only this
module and :mod:`extraction.deadletters` read those keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Dramatiq's default key namespace (the RedisBroker's ``namespace``).
NAMESPACE = "dramatiq"


def queue_key(queue: str, namespace: str = NAMESPACE) -> str:
    """The list of ready message ids of ``queue`` (their payloads: ``+ ".msgs"``)."""
    return f"{namespace}:{queue}"


def delayed_key(queue: str, namespace: str = NAMESPACE) -> str:
    """The list of ready ids of ``queue``'s delay queue (retries waiting their backoff)."""
    return f"{namespace}:{queue}.DQ"


def dead_key(queue: str, namespace: str = NAMESPACE) -> str:
    """The dead-letter sorted set of ``queue`` (its payloads: ``+ ".msgs"``)."""
    return f"{namespace}:{queue}.XQ"


def queue_counts(
    client: Any, queues: Iterable[str], namespace: str = NAMESPACE
) -> dict[str, dict[str, int]]:
    """Per queue: ``ready`` and ``delayed`` messages and ``dead_redis`` (dead letters Redis
    still holds). Raises ``redis.RedisError`` when Redis does not answer."""
    counts: dict[str, dict[str, int]] = {}
    for name in sorted(set(queues)):
        counts[name] = {
            "ready": int(client.llen(queue_key(name, namespace))),
            "delayed": int(client.llen(delayed_key(name, namespace))),
            "dead_redis": int(client.zcard(dead_key(name, namespace))),
        }
    return counts


__all__ = ["NAMESPACE", "dead_key", "delayed_key", "queue_counts", "queue_key"]
