"""The Redis broker's consumer, guarded against messages the worker cannot run.

Dramatiq's Redis consumer fetches a batch of payloads and decodes them one at a time; a
payload that is not a message raises out of the consumer. The consumer thread then restarts
and forgets the rest of its batch, whose ids stay in this worker's in-flight set, so they run
only when this worker is gone; the poison itself is never acked and comes back to do it
again. A payload that decodes but whose options have the wrong type (``retries`` a string,
``options`` not an object, a ``queue_name`` that is not the queue's) gets further: it kills a
worker thread inside Dramatiq's middleware or is never acked.

:class:`GuardedRedisBroker` fetches each message together with its Redis id, checks every
payload before Dramatiq sees it, and moves a bad one to the queue's dead letters at once
(Dramatiq's own ``nack`` move, so it is kept ``dead_message_ttl`` like any other), with the
reason handed to ``on_malformed`` (the worker mirrors it into Postgres). The rest of the batch
is delivered as usual. Unknown actors and arguments that do not bind are left to the worker
and the pipeline middleware, which fail them through the ordinary ``nack`` path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, current_millis, q_name
from dramatiq.errors import ConnectionClosed

from actors.envelope import message_problem

log = logging.getLogger(__name__)

#: Called with (queue, redis message id, raw payload, reason) for every malformed message; the
#: queue is the canonical one (``extract`` for ``extract.DQ``), whose dead letters hold it.
MalformedHook = Callable[[str, str, bytes, str], None]

# Dramatiq's "fetch" (dispatch.lua) returning each id with its payload. KEYS: namespace.
# ARGV: queue name, worker id, timestamp, how many.
_FETCH = """
local namespace, queue_name, worker_id = KEYS[1], ARGV[1], ARGV[2]
redis.call("zadd", namespace .. ":__heartbeats__", ARGV[3], worker_id)
local queue = namespace .. ":" .. queue_name
local acks = namespace .. ":__acks__." .. worker_id .. "." .. queue_name
local out = {}
for i = 1, tonumber(ARGV[4]) do
    local id = redis.call("lpop", queue)
    if not id then
        break
    end
    redis.call("sadd", acks, id)
    table.insert(out, id)
    table.insert(out, redis.call("hget", queue .. ".msgs", id) or "")
end
return out
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class GuardedConsumer(_RedisConsumer):
    """A Redis consumer that dead-letters what it cannot deliver instead of raising."""

    def _fetch(self, count: int) -> list[tuple[str, bytes]]:
        broker: GuardedRedisBroker = self.broker
        count = min(count, broker._max_unpack_size())
        if broker._should_do_maintenance("fetch"):
            # Dramatiq's own maintenance (requeue dead workers' messages, expire dead
            # letters), run through its script by a fetch of nothing.
            broker.scripts["dispatch"](
                keys=[broker.namespace],
                args=[
                    "fetch",
                    current_millis(),
                    self.queue_name,
                    broker.broker_id,
                    broker.heartbeat_timeout,
                    broker.dead_message_ttl,
                    1,
                    broker._max_unpack_size(),
                    0,
                ],
            )
        flat = broker.fetch_script(
            keys=[broker.namespace],
            args=[self.queue_name, broker.broker_id, current_millis(), count],
        )
        return [(_text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

    def _decode(self, redis_id: str, data: bytes) -> dramatiq.Message[Any] | None:
        """The message, or None after dead-lettering a payload the worker cannot run."""
        if not data:
            # The id was queued without a payload (nothing to run): drop it from in-flight.
            log.warning("queue %s: message %s has no payload; dropped", self.queue_name, redis_id)
            self.broker.do_ack(self.queue_name, redis_id)
            return None
        try:
            fields = dramatiq.get_encoder().decode(data)
        except Exception as exc:
            # Dramatiq's encoder wraps the parser's error, which says where the text breaks.
            cause = getattr(exc, "error", None) or exc
            self._dead_letter(redis_id, data, f"not valid JSON: {cause}")
            return None
        problem = message_problem(fields, queue=self.queue_name)
        if problem is None:
            try:
                fields["args"] = tuple(fields["args"])
                message: dramatiq.Message[Any] = dramatiq.Message(**fields)
            except Exception as exc:
                problem = f"not a message: {exc}"
        if problem is not None:
            self._dead_letter(redis_id, data, problem)
            return None
        # Ack and nack go by this id: the one the message was fetched under, whatever the
        # payload claims.
        message.options["redis_message_id"] = redis_id
        return message

    def _dead_letter(self, redis_id: str, data: bytes, reason: str) -> None:
        log.error(
            "queue %s: malformed message %s dead-lettered: %s", self.queue_name, redis_id, reason
        )
        self.broker.do_nack(self.queue_name, redis_id)
        hook = self.broker.on_malformed
        if hook is not None:
            try:
                # A delay queue's dead letters live in its canonical queue's set.
                hook(q_name(self.queue_name), redis_id, data, reason)
            except Exception:
                log.exception("could not record malformed message %s", redis_id)

    def __next__(self) -> MessageProxy | None:
        try:
            while True:
                if self.message_cache:
                    redis_id, data = self.message_cache.pop(0)
                    message = self._decode(redis_id, data)
                    if message is None:
                        continue
                    self.misses = 0
                    self.queued_message_ids.add(message.message_id)
                    return MessageProxy(message)
                batch: list[tuple[str, bytes]] = []
                if self.outstanding_message_count < self.prefetch:
                    batch = self._fetch(self.prefetch - self.outstanding_message_count)
                    self.message_cache = batch
                if not batch:
                    self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
                    time.sleep(backoff_ms / 1000)
                    return None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None


class GuardedRedisBroker(RedisBroker):
    """A :class:`RedisBroker` whose consumers dead-letter malformed messages (see module)."""

    def __init__(self, *, on_malformed: MalformedHook | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_malformed = on_malformed
        self.fetch_script = self.client.register_script(_FETCH)

    @property
    def consumer_class(self) -> type[GuardedConsumer]:
        return GuardedConsumer


__all__ = ["GuardedConsumer", "GuardedRedisBroker", "MalformedHook"]
