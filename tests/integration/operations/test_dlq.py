"""``ibex dlq``: Dramatiq's Redis dead-letter sets and the Postgres mirror, on real Redis.

The actors run on a real RedisBroker (the test Redis) with a Worker in this process, the fake
LLM and memory service of the pipeline tests. A turn whose LLM call is rejected (a permanent
error) dead-letters; the tests then list, show, replay and purge it through the CLI.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pytest
import redis

from cli import main
from extraction.deadletters import DeadLetterStore, fresh_payload
from extraction.stages import StageDeps
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    assert_complete,
    make_session,
    pipeline_settings,
    pointer_of,
    turn_rows,
)


@contextmanager
def redis_worker(deps: StageDeps, redis_url: str) -> Iterator[dramatiq.Broker]:
    """The real actors on a RedisBroker over the test Redis, with a Worker running."""
    import actors  # noqa: F401 - declares the actors
    from actors.broker import current_broker, make_broker, use_broker
    from actors.middleware import install_deps

    previous = current_broker()
    broker = make_broker(deps.settings, client=redis.Redis.from_url(redis_url))
    use_broker(broker)
    install_deps(deps)
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=4)
    worker.start()
    try:
        yield broker
    finally:
        worker.stop()
        install_deps(None)
        use_broker(previous)
        broker.close()


def wait_for(predicate, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def env(database_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)


@pytest.fixture
def world(store: Any, db: Any, database_url: str, redis_url: str, env: None):  # type: ignore[no-untyped-def]
    settings = pipeline_settings(database_url, redis_url)
    provider = FakeProvider(memories=2)
    memory = FakeMemoryService()
    deps = StageDeps(store=store, settings=settings, provider=provider, memory=memory)
    ref = make_session(store, 3)
    provider.reject_always(ref.session_id, 2)
    client = redis.Redis.from_url(redis_url)
    letters = DeadLetterStore(db, client, lease_seconds=settings.extraction_lease_seconds)
    with redis_worker(deps, redis_url) as broker:
        broker.get_actor("scan_sessions").send()
        wait_for(lambda: len(letters.list()) == 1, "the dead letter")
        wait_for(lambda: turn_rows(db, ref.session_id)[3]["state"] == "done", "turn 3")
        wait_for(lambda: pointer_of(db, ref.session_id) == 1, "the pointer over turn 1")
        yield {
            "db": db,
            "ref": ref,
            "provider": provider,
            "memory": memory,
            "letters": letters,
            "broker": broker,
            "redis": client,
            "redis_url": redis_url,
            "database_url": database_url,
        }


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_permanent_failure_lands_in_redis_and_the_mirror_and_is_listed(world, capsys) -> None:
    db, ref, client = world["db"], world["ref"], world["redis"]
    assert client.zcard("dramatiq:extract.XQ") == 1
    assert pointer_of(db, ref.session_id) == 1  # turn 2 failed: the pointer waits below it
    code, out, _ = _cli(capsys, "dlq", "list", "--json")
    assert code == 0
    (letter,) = json.loads(out)
    assert letter["actor"] == "extract_turn" and letter["queue"] == "extract"
    assert letter["session_id"] == str(ref.session_id) and letter["turn_index"] == 2
    assert letter["exception_type"] == "LLMRejectedError"
    assert letter["in_redis"] and letter["in_mirror"]
    code, out, _ = _cli(capsys, "dlq", "list")
    assert code == 0 and "extract_turn" in out and "LLMRejectedError" in out
    code, out, _ = _cli(capsys, "dlq", "show", letter["id"])
    assert code == 0 and "Traceback" in out and '"turn_index": 2' in out
    code, out, err = _cli(capsys, "dlq", "show", "no-such-id")
    assert code == 1 and "no open dead letter" in err


def test_replay_finishes_the_turn_and_the_pointer_reaches_the_end(world, capsys) -> None:
    db, ref, provider, memory = world["db"], world["ref"], world["provider"], world["memory"]
    provider.always_fail.clear()  # the cause is fixed
    (letter,) = world["letters"].list()
    code, out, _ = _cli(capsys, "dlq", "replay", letter.ref)
    assert code == 0 and out.strip() == "replayed 1, already replayed 0, not found 0"
    wait_for(lambda: pointer_of(db, ref.session_id) == 3, "the pointer to reach the end")
    assert_complete(db, memory, [ref])
    assert world["redis"].zcard("dramatiq:extract.XQ") == 0
    assert world["letters"].list() == []
    code, out, _ = _cli(capsys, "dlq", "replay", letter.ref)  # a second replay: a no-op
    assert code == 0 and out.strip() == "replayed 0, already replayed 1, not found 0"
    assert provider.calls[(ref.session_id, 2)] == 2  # the rejected call and the replayed one


def test_concurrent_replays_send_the_message_once(world) -> None:
    provider, letters, ref = world["provider"], world["letters"], world["ref"]
    provider.always_fail.clear()
    (letter,) = letters.list()
    barrier = threading.Barrier(4)
    reports = []

    def replay() -> None:
        mine = DeadLetterStore(world["db"], redis.Redis.from_url(world["redis_url"]))
        barrier.wait()
        reports.append(mine.replay([letter.ref]))

    threads = [threading.Thread(target=replay) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a replay did not finish"
    assert sum(len(r.replayed) for r in reports) == 1
    assert sum(len(r.already) for r in reports) == 3
    wait_for(lambda: pointer_of(world["db"], ref.session_id) == 3, "the replayed turn")
    # Every queue empty and every message acked: anything sent twice has run by now.
    broker = world["broker"]
    for queue in broker.get_declared_queues():
        if not queue.endswith(".DQ"):
            broker.join(queue, timeout=20_000)
    assert provider.calls[(ref.session_id, 2)] == 2


def test_a_letter_swept_from_redis_is_replayed_from_the_mirror(world, capsys) -> None:
    client, provider, db, ref = world["redis"], world["provider"], world["db"], world["ref"]
    (letter,) = world["letters"].list()
    # What Dramatiq's maintenance does after dead_message_ttl (7 days).
    client.zrem("dramatiq:extract.XQ", letter.redis_message_id)
    client.hdel("dramatiq:extract.XQ.msgs", letter.redis_message_id)
    (swept,) = world["letters"].list()
    assert not swept.in_redis and swept.mirror_id is not None
    provider.always_fail.clear()
    code, out, _ = _cli(capsys, "dlq", "replay", "--all")
    assert code == 0 and "replayed 1," in out
    wait_for(lambda: pointer_of(db, ref.session_id) == 3, "the pointer to reach the end")


def test_a_letter_only_in_redis_is_listed_and_replayed_once(world, capsys) -> None:
    db, provider, ref, letters = world["db"], world["provider"], world["ref"], world["letters"]
    db.execute_sql("DELETE FROM ibex_core.dead_letters")  # the mirror write was lost
    (letter,) = letters.list()
    assert letter.in_redis and letter.mirror_id is None
    assert letter.actor == "extract_turn" and letter.turn_index == 2
    # The turn is still marked failed: the replayed message itself starts it afresh.
    assert turn_rows(db, ref.session_id)[2]["state"] == "failed"
    provider.always_fail.clear()
    first = letters.replay([letter.redis_message_id])
    second = letters.replay([letter.redis_message_id])
    assert (len(first.replayed), len(second.replayed), len(second.missing)) == (1, 0, 1)
    wait_for(lambda: pointer_of(db, ref.session_id) == 3, "the pointer to reach the end")


def test_dry_run_changes_nothing(world, capsys) -> None:
    code, out, _ = _cli(capsys, "dlq", "replay", "--all", "--dry-run")
    assert code == 0 and out.strip().startswith("would replay 1")
    assert len(world["letters"].list()) == 1
    assert world["redis"].zcard("dramatiq:extract.XQ") == 1


def test_replay_usage_errors(world, capsys) -> None:
    assert _cli(capsys, "dlq", "replay")[0] == 2
    code, _, err = _cli(capsys, "dlq", "replay", "nope")
    assert code == 1 and "no dead letter nope" in err


def test_purge_needs_confirmation_and_removes_both_copies(world, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    code, _, err = _cli(capsys, "dlq", "purge")
    assert code == 1 and "--yes" in err
    assert _cli(capsys, "dlq", "purge", "--older-than", "7d", "--yes")[1].strip() == (
        "purged 0 dead letters"
    )
    assert _cli(capsys, "dlq", "purge", "--older-than", "soon", "--yes")[0] == 2
    code, out, _ = _cli(capsys, "dlq", "purge", "--yes")
    assert code == 0 and out.strip() == "purged 1 dead letters"
    assert world["redis"].zcard("dramatiq:extract.XQ") == 0
    assert world["letters"].list() == []
    row = world["db"].execute_sql("SELECT purged_at FROM ibex_core.dead_letters").fetchone()
    assert row[0] is not None


def test_fresh_payload_resets_attempts_and_keeps_the_identity() -> None:
    payload = {
        "queue_name": "extract.DQ",
        "actor_name": "extract_turn",
        "message_id": "m-1",
        "message_timestamp": 1,
        "args": [],
        "kwargs": {"turn_index": 2},
        "options": {
            "retries": 20,
            "traceback": "boom",
            "eta": 5,
            "requeue_timestamp": 9,
            "redis_message_id": "old",
        },
    }
    fresh = fresh_payload(payload, "new", 1234)
    assert fresh["message_id"] == "m-1" and fresh["queue_name"] == "extract"
    assert fresh["message_timestamp"] == 1234 and fresh["kwargs"] == {"turn_index": 2}
    assert fresh["options"] == {"retries": 0, "redis_message_id": "new"}
    assert payload["options"]["retries"] == 20  # the input is not modified


# -- the console's pipeline page: the same replay and discard, behind a form -----------------


def _console(world: dict[str, Any], scopes: list[str], org: str = "") -> tuple[Any, str]:
    """A console client signed in with a new token of the letter's org (or of ``org``); its
    CSRF token."""
    import re

    import httpx

    from core.config import Settings
    from memories.tokens import TokenStore
    from memory_service.app import create_app

    settings = Settings.from_env(
        {"DATABASE_URL": world["database_url"], "REDIS_URL": world["redis_url"]}
    )
    app = create_app(settings, db=world["db"], redis_client=world["redis"], embedder=None)
    tokens = TokenStore(world["db"])
    org_id = tokens.ensure_org(org) if org else world["ref"].org_id
    token = tokens.issue(org_id=org_id, name="console", scopes=scopes)[1]
    http = httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://console.test")
    nonce = re.search(r'name="csrf" value="([^"]+)"', http.get("/console/signin").text)
    assert nonce is not None
    http.post("/console/signin", data={"csrf": nonce.group(1), "token": token})
    page = http.get("/console/pipeline")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    return http, csrf.group(1)


def test_the_console_replays_a_dead_letter_once_and_only_with_the_csrf_token(world) -> None:
    ref, letters = world["ref"], world["letters"]
    world["provider"].always_fail.clear()  # the cause is fixed
    (letter,) = letters.list()
    http, csrf = _console(world, ["memory:read", "memory:admin"])
    page = http.get("/console/pipeline").text
    assert "LLMRejectedError" in page and f'name="ref" value="{letter.ref}"' in page
    refused = http.post("/console/pipeline/replay", data={"ref": letter.ref})
    assert refused.status_code == 403 and len(letters.list()) == 1
    first = http.post("/console/pipeline/replay", data={"ref": letter.ref, "csrf": csrf})
    assert first.status_code == 200 and "replayed 1, already replayed 0" in first.text
    second = http.post("/console/pipeline/replay", data={"ref": letter.ref, "csrf": csrf})
    assert "nothing replayed" in second.text
    wait_for(lambda: pointer_of(world["db"], ref.session_id) == 3, "the replayed turn")
    assert_complete(world["db"], world["memory"], [ref])
    assert world["provider"].calls[(ref.session_id, 2)] == 2  # the rejected call and one more


def test_the_console_discards_a_dead_letter_of_its_own_org_only(world) -> None:
    letters, client = world["letters"], world["redis"]
    (letter,) = letters.list()
    other, other_csrf = _console(world, ["memory:read", "memory:admin"], org="globex")
    foreign = other.get("/console/pipeline").text
    assert "No dead letters." in foreign and "LLMRejectedError" not in foreign
    answer = other.post("/console/pipeline/discard", data={"ref": letter.ref, "csrf": other_csrf})
    assert "nothing discarded" in answer.text and len(letters.list()) == 1
    plain, _ = _console(world, ["memory:read"])
    assert plain.get("/console/pipeline").status_code == 403
    http, csrf = _console(world, ["memory:read", "memory:admin"])
    assert http.post("/console/pipeline/discard", data={"ref": letter.ref}).status_code == 403
    done = http.post("/console/pipeline/discard", data={"ref": letter.ref, "csrf": csrf})
    assert done.status_code == 200 and f"Discarded dead letter {letter.ref}" in done.text
    assert letters.list() == [] and client.zcard("dramatiq:extract.XQ") == 0


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Traces on before the world's broker is made (its middleware then traces), into memory."""
    from tests.unit.tracing.helpers import recorded_spans

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    with recorded_spans() as exporter:
        yield exporter


@pytest.mark.parametrize("source", ["redis", "mirror"])
def test_a_replay_joins_the_trace_of_the_dead_lettered_message(traced, world, capsys, source):  # type: ignore[no-untyped-def]
    db, ref, client = world["db"], world["ref"], world["redis"]

    def extracts() -> list[Any]:
        return [
            s
            for s in traced.get_finished_spans()
            if s.name == "extract_turn process" and s.attributes["ibex.turn_index"] == 2
        ]

    [failed] = extracts()
    assert failed.attributes["error.type"] == "LLMRejectedError"
    (letter,) = world["letters"].list()
    if source == "mirror":  # swept from Redis: the payload the mirror stored is replayed
        client.zrem("dramatiq:extract.XQ", letter.redis_message_id)
        client.hdel("dramatiq:extract.XQ.msgs", letter.redis_message_id)
    world["provider"].always_fail.clear()
    code, out, _ = _cli(capsys, "dlq", "replay", "--all")
    assert code == 0 and "replayed 1," in out
    wait_for(lambda: pointer_of(db, ref.session_id) == 3, "the pointer to reach the end")
    wait_for(lambda: len(extracts()) == 2, "the replay's span")
    replayed = next(s for s in extracts() if s is not failed)
    assert replayed.context.trace_id == failed.context.trace_id
    assert replayed.parent.span_id == failed.parent.span_id  # the turn's root, as before
    assert replayed.attributes["ibex.retries"] == 0  # a replay starts its attempts afresh
