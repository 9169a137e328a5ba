"""``extraction.queues`` reads the keys a real RedisBroker writes (on fakeredis): a message
sent now is ``ready``, one sent with a delay is ``delayed``, and nothing else is counted."""

from __future__ import annotations

import dramatiq
import fakeredis
from dramatiq.brokers.redis import RedisBroker

from extraction.queues import dead_key, queue_counts
from schema.messages import Queue


def test_counts_follow_the_broker_key_layout() -> None:
    client = fakeredis.FakeRedis()
    broker = RedisBroker(client=client, middleware=[])

    @dramatiq.actor(actor_name="probe", queue_name=Queue.EXTRACT.value, broker=broker)
    def probe(n: int) -> None:  # pragma: no cover - never run: only sent
        del n

    probe.send(1)
    probe.send(2)
    probe.send_with_options(args=(3,), delay=60_000)
    client.zadd(dead_key(Queue.WRITE.value), {"dead-1": 1.0})

    counts = queue_counts(client, [q.value for q in Queue])
    assert counts[Queue.EXTRACT.value] == {"ready": 2, "delayed": 1, "dead_redis": 0}
    assert counts[Queue.WRITE.value] == {"ready": 0, "delayed": 0, "dead_redis": 1}
    assert counts[Queue.SCAN.value] == {"ready": 0, "delayed": 0, "dead_redis": 0}
    assert sorted(counts) == sorted(q.value for q in Queue)
