"""What a message costs on real Redis (``INFO commandstats``, commands run inside scripts
included): the broker's enqueue, fetch and ack with their exact command counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import dramatiq
import redis

from actors.guard import GuardedRedisBroker


def _stats(client: Any) -> Counter[str]:
    info = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()})


def _message(n: int) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name="q", actor_name="a", args=(n,), kwargs={}, options={})


def test_a_batch_costs_one_enqueue_and_one_fetch_and_each_message_one_ack(redis_url: str) -> None:
    """Three messages sent together: HSET + RPUSH to send them, EVALSHA + LPOP + SADD + HMGET
    to fetch them, one HDEL + SREM to ack them all at the consumer's next poll: 8 commands,
    no heartbeat on any of them."""
    client = redis.Redis.from_url(redis_url)
    # Intervals longer than the test: the heartbeat and maintenance run on the first poll only.
    broker = GuardedRedisBroker(
        client=client, middleware=[], heartbeat_interval=60_000, maintenance_interval=60_000
    )
    consumer = broker.consume("q", prefetch=8, timeout=10)
    assert next(consumer) is None  # the first poll: heartbeat, maintenance, script loaded
    before = _stats(client)
    broker.push({"q": [(f"r{n}", _message(n).encode()) for n in range(3)]})
    proxies = [next(consumer) for _ in range(3)]
    for proxy in proxies:
        assert proxy is not None
        consumer.ack(proxy)
    assert next(consumer) is None  # the queue was drained: no fetch, the acks flushed
    spent = _stats(client) - before
    spent.pop("info", None)
    assert dict(spent) == {
        "hset": 1,
        "rpush": 1,
        "evalsha": 1,
        "lpop": 1,
        "sadd": 1,
        "hmget": 1,
        "hdel": 1,
        "srem": 1,
    }
    assert [p.args for p in proxies if p is not None] == [(0,), (1,), (2,)]
    assert client.hlen("dramatiq:q.msgs") == 0
    assert client.scard(f"dramatiq:__acks__.{broker.broker_id}.q") == 0
