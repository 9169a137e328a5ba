"""The guarded Redis consumer on fakeredis[lua]: every payload is checked before Dramatiq sees
it; a bad one goes to the dead letters with its reason and the rest of the batch is
delivered. Also the envelope check itself (``message_problem``), payload by payload."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import dramatiq
import fakeredis
import pytest
import redis
from dramatiq.errors import ConnectionClosed

from actors.guard import IDLE_MISSES, GuardedConsumer, GuardedRedisBroker, QueueWatch, Waited
from extraction.envelope import decode_problem, message_problem


def envelope(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "queue_name": "q",
        "actor_name": "a",
        "message_id": "m",
        "message_timestamp": 1,
        "args": [],
        "kwargs": {},
        "options": {"redis_message_id": "r", "retries": 2, "eta": 1.5, "traceback": "t"},
    }
    fields.update(overrides)
    return fields


def test_a_message_dramatiq_itself_encodes_has_no_problem() -> None:
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="q", actor_name="a", args=(1,), kwargs={"x": 2}, options={"retries": 0}
    )
    payload, problem = decode_problem(message.encode())
    assert problem is None and payload["message_id"] == message.message_id
    assert message_problem(envelope(), queue="q") is None


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ([1], "the message is a JSON list, not an object"),
        (None, "the message is a JSON null, not an object"),
        (
            {k: v for k, v in envelope().items() if k != "message_id"},
            "the message has no message_id",
        ),
        (envelope(actor_name=3), "actor_name is a int"),
        (envelope(actor_name=""), "actor_name is empty"),
        (envelope(message_timestamp=True), "message_timestamp is a bool"),
        (envelope(message_timestamp="1"), "message_timestamp is a str"),
        (envelope(kwargs=[]), "kwargs is a list"),
        (envelope(options="x"), "options is a str"),
        ({**envelope(), "extra": 1}, "unexpected field 'extra'"),
        (envelope(options={"retries": "3"}), "option retries is a str"),
        (envelope(options={"retries": -1}), "option retries is negative"),
        (envelope(options={"max_retries": 1.5}), "option max_retries is a float"),
        (envelope(options={"eta": "soon"}), "option eta is a str"),
        (envelope(options={"time_limit": False}), "option time_limit is a bool"),
        (envelope(options={"throws": "ValueError"}), "option throws cannot be given in a message"),
        (envelope(options={"pipe_target": "x"}), "option pipe_target is a str"),
    ],
)
def test_each_malformed_envelope_is_named(payload: Any, reason: str) -> None:
    assert message_problem(payload) == reason


def test_a_message_for_another_queue_is_malformed_where_it_was_fetched() -> None:
    assert message_problem(envelope(queue_name="write")) is None
    assert message_problem(envelope(queue_name="write"), queue="extract") == (
        "queue_name 'write' is not the queue it was sent to (extract)"
    )


def test_invalid_json_and_bytes_are_named() -> None:
    assert (decode_problem(b"{oops")[1] or "").startswith("not valid JSON: Expecting")
    assert (decode_problem(b"\xff\xfe")[1] or "").startswith("not valid JSON")


def test_the_consumer_dead_letters_poison_and_delivers_the_rest_of_its_batch() -> None:
    client = fakeredis.FakeRedis()
    seen: list[tuple[str, str, bytes, str]] = []
    broker = GuardedRedisBroker(
        client=client, middleware=[], on_malformed=lambda *a: seen.append(a)
    )
    good = [
        dramatiq.Message(queue_name="q", actor_name="a", args=(i,), kwargs={}, options={})
        for i in range(3)
    ]
    # The payload names a stale id: ack and nack go by the id it was fetched under.
    good[1] = good[1].copy(options={"redis_message_id": "stale"})
    raws = [b"{oops", good[0].encode(), json.dumps(envelope(options="x")).encode()]
    raws += [good[1].encode(), b"", good[2].encode()]
    ids = [str(uuid.uuid4()) for _ in raws]
    for redis_id, raw in zip(ids, raws, strict=True):
        client.hset("dramatiq:q.msgs", redis_id, raw)
        client.rpush("dramatiq:q", redis_id)
    consumer = broker.consume("q", prefetch=10, timeout=10)
    delivered = []
    for _ in range(10):
        proxy = next(consumer)
        if proxy is None:
            break
        delivered.append(proxy)
    assert [p.args for p in delivered] == [(0,), (1,), (2,)]
    assert [p.options["redis_message_id"] for p in delivered] == [ids[1], ids[3], ids[5]]
    assert [(q, rid, reason.split(":")[0]) for q, rid, _, reason in seen] == [
        ("q", ids[0], "not valid JSON"),
        ("q", ids[2], "options is a str"),
    ]
    assert set(client.zrange("dramatiq:q.XQ", 0, -1)) == {ids[0].encode(), ids[2].encode()}
    assert client.hget("dramatiq:q.XQ.msgs", ids[0]) == b"{oops"
    for proxy in delivered:
        consumer.ack(proxy)
    consumer.close()  # the deferred acks, flushed
    assert client.scard(f"dramatiq:__acks__.{broker.broker_id}.q") == 0
    assert client.hlen("dramatiq:q.msgs") == 0 and client.llen("dramatiq:q") == 0


def test_the_guarded_fetch_still_runs_dramatiqs_maintenance() -> None:
    """A dead worker's in-flight message comes back through Dramatiq's own maintenance."""
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="q", actor_name="a", args=(), kwargs={}, options={}
    )
    client.hset("dramatiq:q.msgs", "r1", message.encode())
    client.sadd("dramatiq:__acks__.dead-worker.q", "r1")
    client.zadd("dramatiq:__heartbeats__", {"dead-worker": 1})
    consumer = broker.consume("q", prefetch=1, timeout=10)
    proxy = next(consumer)
    assert proxy is not None and proxy.message_id == message.message_id
    assert proxy.options["redis_message_id"] == "r1"
    assert not client.exists("dramatiq:__acks__.dead-worker.q")


def test_poison_in_a_delay_queue_lands_in_its_canonical_queues_dead_letters() -> None:
    client = fakeredis.FakeRedis()
    seen: list[tuple[str, str, bytes, str]] = []
    broker = GuardedRedisBroker(
        client=client, middleware=[], on_malformed=lambda *a: seen.append(a)
    )
    client.hset("dramatiq:q.DQ.msgs", "r1", b"nope")
    client.rpush("dramatiq:q.DQ", "r1")
    assert next(broker.consume("q.DQ", prefetch=2, timeout=10)) is None
    assert [(q, rid) for q, rid, _, _ in seen] == [("q", "r1")]
    assert client.zrange("dramatiq:q.XQ", 0, -1) == [b"r1"]
    assert client.hget("dramatiq:q.XQ.msgs", "r1") == b"nope"


def test_the_envelope_check_knows_exactly_dramatiqs_message_fields() -> None:
    """A Dramatiq upgrade that adds or drops a message field must fail here, not reject every
    message in production."""
    import dataclasses

    from extraction.envelope import _FIELDS

    assert set(_FIELDS) == {f.name for f in dataclasses.fields(dramatiq.Message)}


def _message(n: int, queue: str = "q") -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=queue, actor_name="a", args=(n,), kwargs={}, options={})


def _counting(broker: GuardedRedisBroker) -> list[int]:
    """Wrap the broker's fetch script; the list gets one entry per fetch (its count)."""
    calls: list[int] = []
    real = broker.fetch_script

    def fetch(*, keys: Any, args: Any) -> Any:
        calls.append(int(args[2]))
        return real(keys=keys, args=args)

    broker.fetch_script = fetch  # type: ignore[assignment]
    return calls


def test_messages_keep_dramatiqs_layout_from_enqueue_through_fetch_to_ack() -> None:
    """``ibex dlq``, the mirror and requeue read Dramatiq's keys: the queue list, the payload
    hash and the worker's in-flight set hold what Dramatiq's own script would put there."""
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    messages = [_message(n) for n in range(3)]
    broker.push({"q": [(f"r{n}", m.encode()) for n, m in enumerate(messages)]})
    assert client.lrange("dramatiq:q", 0, -1) == [b"r0", b"r1", b"r2"]
    assert client.hget("dramatiq:q.msgs", "r1") == messages[1].encode()
    consumer = broker.consume("q", prefetch=2, timeout=10)
    first, second = next(consumer), next(consumer)
    assert first is not None and second is not None
    acks = f"dramatiq:__acks__.{broker.broker_id}.q"
    assert client.smembers(acks) == {b"r0", b"r1"}
    assert client.lrange("dramatiq:q", 0, -1) == [b"r2"]
    consumer.ack(first)
    assert client.smembers(acks) == {b"r0", b"r1"}  # deferred to the next poll
    assert next(consumer) is not None  # r2, fetched together with the ack of r0
    assert client.smembers(acks) == {b"r1", b"r2"}
    assert not client.hexists("dramatiq:q.msgs", "r0") and client.hexists("dramatiq:q.msgs", "r1")
    consumer.nack(second)  # Dramatiq's own move to the dead letters
    assert client.zrange("dramatiq:q.XQ", 0, -1) == [b"r1"]
    assert client.hget("dramatiq:q.XQ.msgs", "r1") == messages[1].encode()
    assert client.smembers(acks) == {b"r2"}


def test_the_heartbeat_is_refreshed_once_an_interval_even_when_nothing_can_be_fetched() -> None:
    """A worker whose threads are all busy fetches nothing, but its consumer loop still beats:
    it must not be taken for dead while it works."""
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[], heartbeat_interval=60_000)
    broker.push({"q": [("r0", _message(0).encode()), ("r1", _message(1).encode())]})
    consumer = broker.consume("q", prefetch=1, timeout=10)
    fetches = _counting(broker)
    assert next(consumer) is not None
    beat = client.zscore("dramatiq:__heartbeats__", broker.broker_id)
    assert beat is not None and fetches == [1]
    client.zadd("dramatiq:__heartbeats__", {broker.broker_id: 1})
    assert next(consumer) is None  # prefetch full: no fetch, and the interval has not passed
    assert client.zscore("dramatiq:__heartbeats__", broker.broker_id) == 1
    broker.heartbeat_interval = 0
    assert next(consumer) is None
    assert fetches == [1]
    after = client.zscore("dramatiq:__heartbeats__", broker.broker_id)
    assert after is not None and after >= beat


def test_a_fetch_that_empties_the_queue_is_not_followed_by_an_immediate_one() -> None:
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    broker.push({"q": [("r0", _message(0).encode())]})
    consumer = broker.consume("q", prefetch=4, timeout=10)
    fetches = _counting(broker)
    assert next(consumer) is not None
    assert next(consumer) is None  # the queue was drained: back off, no fetch
    assert fetches == [4]
    broker.push({"q": [("r1", _message(1).encode())]})
    proxy = next(consumer)
    assert proxy is not None and proxy.args == (1,)
    assert fetches == [4, 3]


def test_an_idle_consumer_polls_with_llen_and_fetches_only_when_messages_wait() -> None:
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    consumer = broker.consume("q", prefetch=2, timeout=10)
    fetches = _counting(broker)
    for _ in range(IDLE_MISSES + 3):
        assert next(consumer) is None
    assert len(fetches) == IDLE_MISSES  # then idle: no fetch script on an empty queue
    broker.push({"q": [("r0", _message(0).encode())]})
    proxy = next(consumer)
    assert proxy is not None and proxy.args == (0,)
    assert len(fetches) == IDLE_MISSES + 1


def test_a_consumer_in_a_long_back_off_is_woken_when_its_queue_gets_a_message() -> None:
    """A consumer idle long enough to back off for seconds picks up a message sent meanwhile
    within the watch's interval, not at the end of its back-off; nothing sent, it sleeps it
    out (here: a 3 s back-off, a message sent 0.2 s into it)."""
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    consumer = broker.consume("q", prefetch=2, timeout=3000)
    assert isinstance(consumer, GuardedConsumer)
    consumer.misses = 20  # idle for long: the back-off is the timeout, 1.5-3 s
    sender = threading.Timer(0.2, lambda: broker.push({"q": [("r0", _message(0).encode())]}))
    started = time.monotonic()
    sender.start()
    assert next(consumer) is None
    woken_after = time.monotonic() - started
    proxy = next(consumer)
    assert proxy is not None and proxy.args == (0,)
    assert woken_after < 1.2, woken_after  # the back-off would have been 1.5 s at least
    sender.join()


class _Unreachable:
    """A Redis client whose server does not answer."""

    def exists(self, *keys: str) -> int:
        raise redis.ConnectionError("Connection refused")


def test_the_queue_watch_wakes_only_for_the_queues_waited_on_and_survives_redis_errors() -> None:
    client = fakeredis.FakeRedis()
    watch = QueueWatch(client, "dramatiq", interval_ms=50)
    client.rpush("dramatiq:other", "x")  # a queue nobody here waits on
    started = time.monotonic()
    assert watch.wait("q", 0.3) is Waited.QUIET  # seen empty: no poll needed
    assert time.monotonic() - started >= 0.29
    client.rpush("dramatiq:q", "x")
    assert watch.wait("q", 0.04) is Waited.SLEPT  # a short back-off (a busy queue's): a sleep
    assert watch.wait("q", 5.0) is Waited.WOKEN
    broken = QueueWatch(_Unreachable(), "dramatiq", interval_ms=50)  # type: ignore[arg-type]
    started = time.monotonic()
    assert broken.wait("q", 0.3) is Waited.SLEPT  # no answer: slept out, the queue unseen
    assert time.monotonic() - started >= 0.29


def test_an_idle_consumer_the_watch_saw_empty_skips_its_own_poll() -> None:
    """The watch answered for the queue during the back-off: no LLEN after it; a back-off
    the watch did not see (Redis away, or a short one) is followed by the consumer's own."""
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    broker.watch = QueueWatch(client, "dramatiq", interval_ms=50)
    consumer = broker.consume("q", prefetch=2, timeout=300)
    assert isinstance(consumer, GuardedConsumer)
    polls: list[str] = []
    real_llen = client.llen

    def llen(key: str) -> int:
        polls.append(key)
        return int(real_llen(key))

    client.llen = llen  # type: ignore[method-assign]
    consumer.misses = 20  # idle: back-offs of 150-300 ms, watched
    assert next(consumer) is None  # its own poll (nothing watched yet), then a watched wait
    assert polls == ["dramatiq:q"] and consumer.seen_empty
    assert next(consumer) is None
    assert polls == ["dramatiq:q"]
    broker.watch = QueueWatch(_Unreachable(), "dramatiq")  # type: ignore[arg-type]
    assert next(consumer) is None and not consumer.seen_empty
    assert next(consumer) is None
    assert polls == ["dramatiq:q", "dramatiq:q"]


def test_maintenance_runs_on_the_first_fetch_then_once_an_interval() -> None:
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[], maintenance_interval=60_000)
    runs: list[str] = []
    broker.maintain = runs.append  # type: ignore[method-assign]
    consumer = broker.consume("q.DQ", prefetch=2, timeout=10)
    for _ in range(3):
        assert next(consumer) is None
    assert runs == ["q.DQ"]
    assert isinstance(consumer, GuardedConsumer)
    consumer.maintenance_due = 0
    consumer.misses = 0
    assert next(consumer) is None
    assert runs == ["q.DQ", "q.DQ"]
    assert 48_000 <= broker.maintenance_period() <= 72_000


def test_an_ack_after_a_requeue_drops_the_payload_and_the_late_copy_is_skipped() -> None:
    """A worker taken for dead (its in-flight ids requeued) that then finishes a message: its
    ack removes the payload, and the requeued id, fetched without one, is dropped from
    in-flight instead of running the finished message again."""
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    broker.push({"q": [("r0", _message(0).encode())]})
    slow = broker.consume("q", prefetch=1, timeout=10)
    proxy = next(slow)
    assert proxy is not None
    # The maintenance of another worker: the in-flight id back on the queue.
    client.delete(f"dramatiq:__acks__.{broker.broker_id}.q")
    client.rpush("dramatiq:q", "r0")
    slow.ack(proxy)
    slow.close()
    other = GuardedRedisBroker(client=client, middleware=[])
    assert next(other.consume("q", prefetch=1, timeout=10)) is None
    assert client.llen("dramatiq:q") == 0 and client.hlen("dramatiq:q.msgs") == 0
    assert client.scard(f"dramatiq:__acks__.{other.broker_id}.q") == 0


def test_acks_wait_for_the_next_poll_and_survive_a_failed_flush() -> None:
    """An ack is deferred to the consumer's next fetch or poll, where all deferred acks go in
    one HDEL and one SREM; when Redis does not answer they stay deferred for the next try (or
    the queue's next consumer), and closing the consumer flushes them."""
    client = fakeredis.FakeRedis()
    broker = GuardedRedisBroker(client=client, middleware=[])
    broker.push({"q": [(f"r{n}", _message(n).encode()) for n in range(3)]})
    consumer = broker.consume("q", prefetch=2, timeout=10)
    first, second = next(consumer), next(consumer)
    assert first is not None and second is not None
    acks = f"dramatiq:__acks__.{broker.broker_id}.q"
    consumer.ack(first)
    consumer.ack(second)
    assert client.scard(acks) == 2 and client.hlen("dramatiq:q.msgs") == 3
    third = next(consumer)  # r2 fetched, r0 and r1 acked by the same script
    assert third is not None and third.options["redis_message_id"] == "r2"
    assert client.smembers(acks) == {b"r2"}
    assert client.hkeys("dramatiq:q.msgs") == [b"r2"]
    consumer.ack(third)

    def refuse(*_: Any, **__: Any) -> Any:
        raise redis.ConnectionError("down")

    real_pipeline = client.pipeline
    client.pipeline = refuse  # type: ignore[method-assign]
    with pytest.raises(ConnectionClosed):
        next(consumer)  # the queue was drained: no fetch, only the flush, which fails
    consumer.close()  # fails too
    assert client.smembers(acks) == {b"r2"}
    client.pipeline = real_pipeline  # type: ignore[method-assign]
    broker.consume("q", prefetch=2, timeout=10).close()  # the queue's next consumer
    assert client.scard(acks) == 0 and client.hlen("dramatiq:q.msgs") == 0
    assert broker.take_acks("q") == []


def test_closing_and_requeueing_while_redis_is_away_raise_only_the_brokers_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Crash point: Redis goes away before a freshly booted worker process has asked it for
    the script unpack limit. Dramatiq's consumer thread then closes its consumer (which takes
    the deferred acks, needing that limit) and requeues its delayed messages; anything but
    the broker's connection error raised there ends the thread for good. Both raise at most
    ``ConnectionClosed``, and the deferred acks stay for the queue's next consumer."""
    monkeypatch.setattr(GuardedRedisBroker, "_max_unpack_size_val", None)
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    broker = GuardedRedisBroker(client=client, middleware=[])
    broker.push({"q": [("r0", _message(0).encode())]})
    consumer = broker.consume("q", prefetch=2, timeout=10)
    # The first fetch asks for the limit: forget it again, as in a process that never asked.
    proxy = next(consumer)
    assert proxy is not None
    monkeypatch.setattr(GuardedRedisBroker, "_max_unpack_size_val", None)
    consumer.ack(proxy)
    server.connected = False
    consumer.close()  # no error: the ack stays deferred
    with pytest.raises(ConnectionClosed):
        consumer.requeue([proxy])
    with pytest.raises(ConnectionClosed):
        broker.take_acks("q")
    server.connected = True
    broker.consume("q", prefetch=2, timeout=10).close()  # the queue's next consumer acks it
    assert client.hlen("dramatiq:q.msgs") == 0
    assert client.scard(f"dramatiq:__acks__.{broker.broker_id}.q") == 0


@pytest.mark.timeout(30)
def test_a_worker_that_boots_while_redis_is_away_consumes_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Crash point: the worker process starts (no unpack limit known yet) and Redis is down
    when its consumer threads first poll. Every consumer thread must survive the connection
    errors and consume again once Redis answers: a message sent afterwards runs."""
    import threading
    import time

    monkeypatch.setattr(GuardedRedisBroker, "_max_unpack_size_val", None)
    monkeypatch.setattr("dramatiq.worker.CONSUMER_RESTART_DELAY_SECS", 0.1)
    server = fakeredis.FakeServer()
    server.connected = False
    broker = GuardedRedisBroker(client=fakeredis.FakeRedis(server=server), middleware=[])
    ran = threading.Event()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="probe")
    def probe() -> None:
        ran.set()

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        time.sleep(0.5)  # every consumer thread has met the refused connection
        server.connected = True
        probe.send()
        assert ran.wait(10), "the message sent after Redis came back never ran"
        assert all(thread.is_alive() for thread in worker.consumers.values())
    finally:
        worker.stop(timeout=2000)
