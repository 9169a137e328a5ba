"""Broker configuration, the worker's boot check, and the Redis dead-letter queue (fakeredis)."""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import dramatiq
import fakeredis
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Retries, TimeLimit

from actors.broker import (
    HEARTBEAT_TIMEOUT_MS,
    Queue,
    TurnBusyRetry,
    current_broker,
    make_broker,
    time_limit_ms,
    use_broker,
)
from actors.guard import GuardedRedisBroker
from actors.middleware import WORKER_SWITCH_INTERVAL_S, PipelineRuntime, install_deps
from core.config import Settings


def settings(**env: str) -> Settings:
    return Settings.from_env(
        {"MAX_RETRIES": "4", "RETRY_MIN_BACKOFF_MS": "7", "RETRY_MAX_BACKOFF_MS": "900", **env}
    )


def test_the_redis_broker_is_configured_deliberately() -> None:
    s = settings(LLM_TIMEOUT_SECONDS="90", HTTP_TIMEOUT_SECONDS="30")
    broker = make_broker(s, client=fakeredis.FakeRedis())
    assert isinstance(broker, RedisBroker)
    assert broker.heartbeat_timeout == HEARTBEAT_TIMEOUT_MS < 60_000  # Dramatiq's default
    assert isinstance(broker, GuardedRedisBroker)
    # A live worker refreshes its heartbeat many times within the timeout; a dead one's
    # messages are requeued within a maintenance interval of the timeout.
    assert broker.heartbeat_interval * 10 <= HEARTBEAT_TIMEOUT_MS
    assert broker.maintenance_interval <= HEARTBEAT_TIMEOUT_MS / 2
    [retries] = [m for m in broker.middleware if isinstance(m, Retries)]
    assert (retries.max_retries, retries.min_backoff, retries.max_backoff) == (4, 7, 900)
    [limit] = [m for m in broker.middleware if isinstance(m, TimeLimit)]
    assert limit.time_limit == time_limit_ms(s) > 90_000  # above the slowest call's timeout


def test_busy_waits_are_not_counted_as_retries_but_errors_are() -> None:
    [retries] = [m for m in make_broker(settings(), stub=True).middleware if isinstance(m, Retries)]
    assert retries.retry_when is not None
    assert retries.retry_when(100, TurnBusyRetry("busy", delay=10))
    assert retries.retry_when(3, RuntimeError("x"))
    assert not retries.retry_when(4, RuntimeError("x"))


def test_a_worker_without_database_url_exits_with_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    install_deps(None)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        PipelineRuntime().after_process_boot(make_broker(settings(), stub=True))
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "DATABASE_URL" in err[0]


def test_a_dead_message_lands_in_the_redis_dead_letter_queue() -> None:
    """The real RedisBroker scripts on fakeredis[lua]: a permanent error is nacked at once."""
    client = fakeredis.FakeRedis()
    broker = make_broker(settings(MAX_RETRIES="0"), client=client, extra_middleware=[])
    previous = current_broker()
    import actors  # noqa: F401

    use_broker(broker)
    try:
        worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
        worker.start()
        try:
            current_broker().get_actor("extract_turn").send("nope", str(uuid.uuid4()), 1)
            deadline = time.monotonic() + 30
            while not client.zcard(f"dramatiq:{Queue.EXTRACT.value}.XQ"):
                assert time.monotonic() < deadline, _queue_state(client, worker)
                time.sleep(0.02)
        finally:
            worker.stop()
        dead_ids: Any = client.zrange(f"dramatiq:{Queue.EXTRACT.value}.XQ", 0, -1)
        assert len(dead_ids) == 1
        payload = client.hget(f"dramatiq:{Queue.EXTRACT.value}.XQ.msgs", dead_ids[0])
        assert payload is not None and b"extract_turn" in payload
    finally:
        use_broker(previous)


def _queue_state(client: Any, worker: dramatiq.Worker) -> str:
    """Where a message that was never dead-lettered is: for the failure's message."""
    queue = f"dramatiq:{Queue.EXTRACT.value}"
    consumers = {name: c.is_alive() for name, c in worker.consumers.items()}
    return (
        f"the message was never dead-lettered: queued {client.llen(queue)},"
        f" payloads {client.hlen(f'{queue}.msgs')}, delayed {client.zcard(f'{queue}.DQ')},"
        f" keys {sorted(k.decode() for k in client.keys('dramatiq:*'))},"
        f" consumers alive {consumers}, workers {len(worker.workers)}"
    )


def _queued(client: Any, queue: str) -> list[dramatiq.Message[Any]]:
    ids: Any = client.lrange(f"dramatiq:{queue}", 0, -1)
    encoded: Any = [client.hget(f"dramatiq:{queue}.msgs", i) for i in ids]
    return [dramatiq.Message.decode(e) for e in encoded]


def test_send_all_pipelines_redis_enqueues_exactly_as_the_broker_enqueues_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batched round trips, same messages as the broker's own enqueue: one fresh
    redis_message_id each, the order kept, every batch (including a partial last one) sent."""
    import actors  # noqa: F401
    from actors.broker import send_all
    from extraction.stages import Send
    from schema.messages import ActorName

    client = fakeredis.FakeRedis()
    broker = make_broker(settings(), client=client, extra_middleware=[])
    previous = current_broker()
    use_broker(broker)
    pipelines: list[int] = []
    real_pipeline = client.pipeline

    def counting_pipeline(*a: Any, **kw: Any) -> Any:
        pipelines.append(1)
        return real_pipeline(*a, **kw)

    monkeypatch.setattr(client, "pipeline", counting_pipeline)
    monkeypatch.setattr(sys.modules["actors.broker"], "SEND_PIPELINE_SIZE", 3)
    try:
        org, session = str(uuid.uuid4()), str(uuid.uuid4())
        sends = [
            Send(ActorName.EXTRACT, {"org_id": org, "session_id": session, "turn_index": t})
            for t in range(1, 8)
        ]
        assert send_all(sends) == 7
        assert len(pipelines) == 3  # 3 + 3 + 1
        piped = _queued(client, Queue.EXTRACT.value)
        # The reference: the broker's own one-at-a-time enqueue of the same messages.
        client.flushdb()
        for s in sends:
            current_broker().get_actor(s.actor_name).send_with_options(kwargs=s.kwargs)
        plain = _queued(client, Queue.EXTRACT.value)
    finally:
        use_broker(previous)
    assert [m.kwargs for m in piped] == [s.kwargs for s in sends]

    def shape(m: dramatiq.Message[Any]) -> tuple[Any, ...]:
        return (m.queue_name, m.actor_name, m.args, m.kwargs, sorted(m.options))

    assert [shape(m) for m in piped] == [shape(m) for m in plain]
    redis_ids = {m.options["redis_message_id"] for m in piped}
    assert len(redis_ids) == 7 and len({m.message_id for m in piped}) == 7


class _EnqueueLog(dramatiq.Middleware):
    """Records the enqueue hooks as the broker calls them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(("before", message.options["redis_message_id"]))

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(("after", message.options["redis_message_id"]))


def test_send_all_stores_a_batch_over_two_queues_in_one_round_trip() -> None:
    """Per queue one HSET of the payloads and one RPUSH of the ids, in one pipeline, no script
    and no heartbeat; every message stored and queued in order on its own queue, and the
    enqueue hooks called per message when a middleware implements them."""
    import actors  # noqa: F401
    from actors.broker import send_all
    from extraction.stages import Send
    from schema.messages import ActorName

    client = fakeredis.FakeRedis()
    log = _EnqueueLog()
    broker = make_broker(settings(), client=client, extra_middleware=[log])
    previous = current_broker()
    use_broker(broker)
    commands: list[str] = []
    real_pipeline = client.pipeline

    def recording_pipeline(*a: Any, **kw: Any) -> Any:
        pipe = real_pipeline(*a, **kw)
        real_execute = pipe.execute

        def execute(*ea: Any, **ekw: Any) -> Any:
            commands.extend(str(c[0][0]).upper() for c in pipe.command_stack)
            commands.append("MULTI/EXEC" if pipe.transaction else "PIPELINE")
            return real_execute(*ea, **ekw)

        pipe.execute = execute
        return pipe

    client.pipeline = recording_pipeline  # type: ignore[method-assign]
    try:
        org, session = str(uuid.uuid4()), str(uuid.uuid4())
        ref = {"org_id": org, "session_id": session, "turn_index": 1}
        sends = [Send(ActorName.WRITE, {**ref, "ordinal": o}) for o in range(3)]
        sends.insert(1, Send(ActorName.POINTER, ref))
        sends.append(Send(ActorName.POINTER, {**ref, "turn_index": 2}))
        assert send_all(sends) == 5
        writes = _queued(client, Queue.WRITE.value)
        pointers = _queued(client, Queue.POINTER.value)
    finally:
        use_broker(previous)
    assert [m.kwargs for m in writes] == [s.kwargs for s in sends if s.actor_name == "write_memory"]
    assert [m.kwargs for m in pointers] == [
        s.kwargs for s in sends if s.actor_name == "advance_pointer"
    ]
    assert [m.actor_name for m in pointers] == ["advance_pointer"] * 2
    # Per queue: one HSET and one RPUSH, payloads before ids, in one round trip.
    assert commands == ["HSET", "RPUSH", "HSET", "RPUSH", "PIPELINE"]
    ids = [m.options["redis_message_id"] for m in writes + pointers]
    assert sorted(i for kind, i in log.calls if kind == "before") == sorted(ids)
    assert sorted(i for kind, i in log.calls if kind == "after") == sorted(ids)


def test_send_all_on_a_stub_broker_sends_one_at_a_time() -> None:
    import actors  # noqa: F401
    from actors.broker import send_all
    from extraction.stages import Send
    from schema.messages import ActorName

    stub = make_broker(settings(), stub=True, extra_middleware=[])
    previous = current_broker()
    use_broker(stub)
    try:
        org, session = str(uuid.uuid4()), str(uuid.uuid4())
        sent = send_all(
            Send(ActorName.EXTRACT, {"org_id": org, "session_id": session, "turn_index": t})
            for t in (1, 2)
        )
        assert sent == 2
        assert stub.queues[Queue.EXTRACT.value].qsize() == 2
    finally:
        use_broker(previous)


def test_a_worker_process_boot_shortens_the_thread_switch_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set before anything else at boot, so even a worker that then exits on its
    configuration has set it; recorded instead of applied to the test process."""
    applied: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", applied.append)
    install_deps(None)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(SystemExit):
        PipelineRuntime().after_process_boot(make_broker(settings(), stub=True))
    assert applied == [WORKER_SWITCH_INTERVAL_S]
    assert WORKER_SWITCH_INTERVAL_S < 0.005  # Python's default
