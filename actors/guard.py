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

The broker also runs fewer Redis commands per message than Dramatiq's, on Dramatiq's own data
layout (queue list, ``.msgs`` payload hash, per-worker ``__acks__`` sets, ``.XQ`` dead
letters), so ``ibex dlq``, the dead-letter mirror and requeue read it as before. Dramatiq runs
every operation through one script that refreshes the worker's heartbeat (a ZADD) each time
and pops, marks and reads a batch one message at a time. Here:

- enqueue is one HSET of the payloads and one RPUSH of the ids per queue, for a whole batch
  (:meth:`GuardedRedisBroker.push`);
- fetch is one script: one LPOP of up to the batch size (Redis 6.2), one SADD into the
  in-flight set, one HMGET of the payloads;
- ack is deferred: a worker thread only notes the id, and the queue's consumer acks every id
  noted since its last poll with one HDEL and one SREM, inside its next fetch script or in one
  round trip when it does not fetch (at the latest one back-off sleep, at most the consumer
  timeout, later; at once when the consumer closes). A worker killed in that window has its
  finished messages run again, like any message it held, after the heartbeat timeout: the
  stages are idempotent;
- a consumer whose fetch emptied its queue backs off before fetching again, and an idle one
  (:data:`IDLE_MISSES` empty polls in a row) polls with one LLEN, running the fetch script
  only when messages wait;
- a consumer with room for messages whose back-off has grown past :data:`WATCH_INTERVAL_MS`
  (it grows to the consumer timeout, a second) is woken as soon as its queue holds some: one
  thread per process asks Redis every :data:`WATCH_INTERVAL_MS` about the queues of all such
  consumers at once (one EXISTS, :class:`QueueWatch`), so a message sent to a quiet queue
  waits about that long for a consumer that is up, not up to a second; an idle consumer the
  watch saw empty skips its own LLEN. A busy queue's consumer backs off for less and is not
  watched; the back-off stays the fallback when Redis does not answer the watch;
- the heartbeat is refreshed by the consumer loop once a second per process, and each consumer
  runs Dramatiq's maintenance (requeue dead workers' messages, expire dead letters) on its
  queue every ten seconds instead of on a random 2 % of commands.

Nack, requeue (worker shutdown) and maintenance still run Dramatiq's script unchanged.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, current_millis, q_name
from dramatiq.errors import ConnectionClosed

from extraction.envelope import message_problem

log = logging.getLogger(__name__)

#: Called with (queue, redis message id, raw payload, reason) for every malformed message; the
#: queue is the canonical one (``extract`` for ``extract.DQ``), whose dead letters hold it.
MalformedHook = Callable[[str, str, bytes, str], None]

#: How often a worker process refreshes its heartbeat (ms): far below the broker's
#: ``heartbeat_timeout``, so a live worker is never taken for dead.
HEARTBEAT_INTERVAL_MS = 1_000
#: How often each consumer runs Dramatiq's maintenance on its queue (ms, give or take a fifth).
MAINTENANCE_INTERVAL_MS = 10_000
#: Empty polls in a row (about 0.2-0.3 s of back-off) after which a consumer counts as idle and
#: polls with one LLEN instead of its fetch script (two commands on an empty queue).
IDLE_MISSES = 5
#: How often a process asks whether the quiet queues its consumers wait on hold messages
#: (ms), and the back-off past which a consumer waits on the watch: about the longest a
#: message sent to a quiet queue waits for a consumer with room for it.
WATCH_INTERVAL_MS = 100

# Dramatiq's "fetch" (dispatch.lua) without its heartbeat, returning each id with its payload,
# in one LPOP of up to ``count`` ids (Redis 6.2), one SADD and one HMGET whatever the batch.
# Acks deferred since the last fetch ride along: HDEL + SREM of them all, before the pop.
# KEYS: namespace. ARGV: queue name, worker id, how many, then the ids to ack.
_FETCH = """
local namespace, queue_name, worker_id = KEYS[1], ARGV[1], ARGV[2]
local queue = namespace .. ":" .. queue_name
local acks = namespace .. ":__acks__." .. worker_id .. "." .. queue_name
if #ARGV > 3 then
    local done = {unpack(ARGV, 4)}
    redis.call("hdel", queue .. ".msgs", unpack(done))
    redis.call("srem", acks, unpack(done))
end
local ids = redis.call("lpop", queue, ARGV[3])
if not ids then
    return {}
end
redis.call("sadd", acks, unpack(ids))
local payloads = redis.call("hmget", queue .. ".msgs", unpack(ids))
local out = {}
for i = 1, #ids do
    table.insert(out, ids[i])
    table.insert(out, payloads[i] or "")
end
return out
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Waited(enum.Enum):
    """How a :meth:`QueueWatch.wait` ended."""

    #: A queue waited on holds messages.
    WOKEN = "woken"
    #: The wait ran out, and the watch saw the queue empty during it: no need to poll it.
    QUIET = "quiet"
    #: The wait ran out, the queue unseen (a short wait, or Redis did not answer the watch).
    SLEPT = "slept"


class _Waiter:
    __slots__ = ("event", "queue", "quiet")

    def __init__(self, queue: str) -> None:
        self.event = threading.Event()
        self.queue = queue
        self.quiet = False


class QueueWatch:
    """Wakes the consumers of one process that wait on quiet queues (see module): while any
    waits longer than ``interval_ms``, one daemon thread asks Redis every ``interval_ms``, with
    one EXISTS over their queues, whether any of them holds messages, and if so wakes them
    all (each then polls its own queue as it would have after its back-off); a wait that runs
    out while the watch saw its queue empty needs no poll of its own. Started with the first
    long wait, so a process that never consumes has no such thread; when Redis does not
    answer, the consumers sleep out their back-off and poll as before."""

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        *,
        interval_ms: int = WATCH_INTERVAL_MS,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.interval = interval_ms / 1000
        self._waiting: set[_Waiter] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def wait(self, queue_name: str, seconds: float) -> Waited:
        """Sleep up to ``seconds``, woken early once ``queue_name`` (or the queue of another
        consumer waiting here) holds messages. A wait no longer than the interval is a plain
        sleep."""
        if seconds <= self.interval:
            time.sleep(seconds)
            return Waited.SLEPT
        waiter = _Waiter(f"{self.namespace}:{queue_name}")
        with self._changed:
            self._waiting.add(waiter)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="ibex-queue-watch", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        try:
            if waiter.event.wait(seconds):
                return Waited.WOKEN
            return Waited.QUIET if waiter.quiet else Waited.SLEPT
        finally:
            with self._changed:
                self._waiting.discard(waiter)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting:
                    self._changed.wait()
            time.sleep(self.interval)
            with self._changed:
                waiting = list(self._waiting)
            if not waiting:
                continue
            try:
                found = self.client.exists(*{w.queue for w in waiting})
            except redis.RedisError:
                log.debug("queue watch: Redis did not answer; consumers back off as before")
                time.sleep(1.0)
                continue
            for waiter in waiting:
                if found:
                    waiter.event.set()
                else:
                    waiter.quiet = True


class GuardedConsumer(_RedisConsumer):
    """A Redis consumer that dead-letters what it cannot deliver instead of raising."""

    def __init__(
        self, broker: GuardedRedisBroker, queue_name: str, prefetch: int, timeout: int
    ) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        #: When this consumer next runs Dramatiq's maintenance on its queue (ms): at once.
        self.maintenance_due = 0
        #: Whether the last fetch got messages, but fewer than it asked for: the queue is empty.
        self.drained = False
        #: Whether the queue watch saw the queue empty during the last back-off.
        self.seen_empty = False

    def _fetch(self, count: int, acks: list[str]) -> list[tuple[str, bytes]]:
        broker: GuardedRedisBroker = self.broker
        now = current_millis()
        if now >= self.maintenance_due:
            self.maintenance_due = now + broker.maintenance_period()
            broker.maintain(self.queue_name)
        flat = broker.fetch_script(
            keys=[broker.namespace], args=[self.queue_name, broker.broker_id, count, *acks]
        )
        return [(_text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

    def ack(self, message: MessageProxy) -> None:
        """Deferred: the id is acked by this consumer's next fetch or poll (see module)."""
        self.broker.defer_acks(self.queue_name, [message.options["redis_message_id"]])
        self.queued_message_ids.discard(message.message_id)

    def close(self) -> None:
        """Ack what is still deferred (worker shutdown, consumer restart); on a connection
        error the ids stay deferred for the queue's next consumer. Never raises for Redis
        being away: Dramatiq's consumer thread calls this while it recovers from a connection
        error, and an error raised here would end the thread (and the queue's consumption in
        this process) for good."""
        try:
            acks = self.broker.take_acks(self.queue_name)
        except ConnectionClosed:
            return
        if not acks:
            return
        try:
            self.broker.flush_acks(self.queue_name, acks)
        except redis.ConnectionError:
            self.broker.defer_acks(self.queue_name, acks, first=True)

    def requeue(self, messages: Any) -> None:
        """Dramatiq's requeue (of the delayed messages a consumer thread held), with a lost
        connection raised as the broker's connection error, which the consumer thread's
        ``close`` expects; the messages stay in this worker's in-flight set, and the broker's
        maintenance requeues them once this worker's heartbeat is stale."""
        try:
            super().requeue(messages)  # type: ignore[no-untyped-call]
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def _may_hold_messages(self) -> bool:
        """False when an idle consumer's queue is empty: after :data:`IDLE_MISSES` empty polls
        in a row a poll is one LLEN, and the fetch script runs only when it finds messages;
        none when the queue watch saw the queue empty while the consumer waited."""
        if self.misses < IDLE_MISSES:
            return True
        if self.seen_empty:  # by the queue watch, during the back-off just slept
            self.seen_empty = False
            return False
        broker: GuardedRedisBroker = self.broker
        return bool(broker.client.llen(f"{broker.namespace}:{self.queue_name}"))

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
            self.broker.heartbeat()
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
                acks = self.broker.take_acks(self.queue_name)
                try:
                    if self.drained:
                        # The last fetch emptied the queue: back off before asking again,
                        # instead of an immediate fetch that would find nothing.
                        self.drained = False
                    elif (
                        self.outstanding_message_count < self.prefetch and self._may_hold_messages()
                    ):
                        wanted = min(
                            self.prefetch - self.outstanding_message_count,
                            self.broker._max_unpack_size(),
                        )
                        batch = self._fetch(wanted, acks)
                        acks = []
                        self.drained = 0 < len(batch) < wanted
                        self.message_cache = batch
                    if acks:
                        self.broker.flush_acks(self.queue_name, acks)
                        acks = []
                finally:
                    if acks:
                        self.broker.defer_acks(self.queue_name, acks, first=True)
                if not batch:
                    self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
                    waited = Waited.SLEPT
                    if self.outstanding_message_count < self.prefetch:
                        # Room for more and none came: woken early when some arrive.
                        waited = self.broker.watch.wait(self.queue_name, backoff_ms / 1000)
                    else:
                        time.sleep(backoff_ms / 1000)  # full: the worker threads are behind
                    self.seen_empty = waited is Waited.QUIET
                    return None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None


class GuardedRedisBroker(RedisBroker):
    """A :class:`RedisBroker` whose consumers dead-letter malformed messages (see module), and
    whose hot paths run only the Redis commands they need (see module)."""

    def __init__(
        self,
        *,
        on_malformed: MalformedHook | None = None,
        heartbeat_interval: int = HEARTBEAT_INTERVAL_MS,
        maintenance_interval: int = MAINTENANCE_INTERVAL_MS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self.on_malformed = on_malformed
        self.heartbeat_interval = heartbeat_interval
        self.maintenance_interval = maintenance_interval
        self.fetch_script = self.client.register_script(_FETCH)
        self.watch = QueueWatch(self.client, self.namespace)
        self._beat_at = 0
        self._acks: dict[str, list[str]] = {}
        self._acks_lock = threading.Lock()

    @property
    def consumer_class(self) -> type[GuardedConsumer]:
        return GuardedConsumer

    def heartbeat(self) -> None:
        """Tell Redis this process is alive (one ZADD), at most once a ``heartbeat_interval``.
        Every consumer thread calls it on each turn of its loop, which comes round at least
        once a consumer timeout however busy the worker threads are."""
        now = current_millis()
        if now - self._beat_at < self.heartbeat_interval:
            return
        self._beat_at = now
        self.client.zadd(f"{self.namespace}:__heartbeats__", {self.broker_id: now})

    def _max_unpack_size(self) -> int:
        """Dramatiq's limit on arguments a script may unpack, asked of Redis once per process;
        a lost connection is raised as the broker's connection error (a consumer thread's
        ``close`` needs the limit, and must not die of Redis being away when it is first
        asked: a worker process that boots while Redis restarts)."""
        try:
            return int(super()._max_unpack_size())  # type: ignore[no-untyped-call]
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def maintenance_period(self) -> int:
        """Milliseconds until a consumer's next maintenance: the interval, give or take a
        fifth, so that the consumers of many processes do not run it in step."""
        spread = self.maintenance_interval // 5
        return self.maintenance_interval + random.randint(-spread, spread)

    def maintain(self, queue_name: str) -> None:
        """Dramatiq's own maintenance of ``queue_name`` (requeue the in-flight messages of
        workers whose heartbeat is older than ``heartbeat_timeout``, drop dead letters older
        than ``dead_message_ttl``), run through its script by a fetch of nothing."""
        self.scripts["dispatch"](
            keys=[self.namespace],
            args=[
                "fetch",
                current_millis(),
                queue_name,
                self.broker_id,
                self.heartbeat_timeout,
                self.dead_message_ttl,
                1,
                self._max_unpack_size(),
                0,
            ],
        )

    def push(self, batches: Mapping[str, Sequence[tuple[str, bytes]]]) -> None:
        """Enqueue ``(redis message id, payload)`` pairs on their queues in one round trip:
        per queue one HSET of the payloads, then one RPUSH of the ids (so an id is never
        visible before its payload)."""
        with self.client.pipeline(transaction=False) as pipe:
            for queue_name, entries in batches.items():
                if not entries:
                    continue
                key = f"{self.namespace}:{queue_name}"
                pipe.hset(f"{key}.msgs", mapping=dict(entries))
                pipe.rpush(key, *(redis_id for redis_id, _ in entries))
            pipe.execute()

    def do_enqueue(self, queue_name: str, message_id: str, data: bytes) -> None:
        """Dramatiq's ``enqueue`` without the heartbeat: HSET + RPUSH (see :meth:`push`)."""
        self.push({queue_name: [(message_id, data)]})

    def defer_acks(self, queue_name: str, redis_ids: list[str], *, first: bool = False) -> None:
        """Keep ``redis_ids`` (done messages of ``queue_name``) to ack with the queue's next
        fetch or poll; ``first`` puts them back ahead of the others after a failed flush."""
        with self._acks_lock:
            pending = self._acks.setdefault(queue_name, [])
            if first:
                pending[:0] = redis_ids
            else:
                pending.extend(redis_ids)

    def take_acks(self, queue_name: str) -> list[str]:
        """The deferred acks of ``queue_name`` (at most a script's unpack size), now owned by
        the caller, who acks them or defers them again."""
        limit = self._max_unpack_size()
        with self._acks_lock:
            pending = self._acks.get(queue_name)
            if not pending:
                return []
            taken, self._acks[queue_name] = pending[:limit], pending[limit:]
            return taken

    def flush_acks(self, queue_name: str, redis_ids: list[str]) -> None:
        """Ack ``redis_ids`` now: one HDEL of their payloads, then one SREM from this worker's
        in-flight set, in one round trip. Unlike Dramatiq's script the payload goes even when
        an id was no longer in flight (the broker requeued it, taking this worker for dead):
        the message is done, and a copy fetched later without its payload is dropped by the
        consumer (one with its payload already fetched runs as before)."""
        key = f"{self.namespace}:{queue_name}"
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hdel(f"{key}.msgs", *redis_ids)
            pipe.srem(f"{self.namespace}:__acks__.{self.broker_id}.{queue_name}", *redis_ids)
            pipe.execute()

    def do_ack(self, queue_name: str, message_id: str) -> None:
        """Dramatiq's ``ack`` at once, without the heartbeat (:meth:`flush_acks` of one id)."""
        self.flush_acks(queue_name, [message_id])


__all__ = [
    "HEARTBEAT_INTERVAL_MS",
    "IDLE_MISSES",
    "MAINTENANCE_INTERVAL_MS",
    "WATCH_INTERVAL_MS",
    "GuardedConsumer",
    "GuardedRedisBroker",
    "MalformedHook",
    "QueueWatch",
    "Waited",
]
