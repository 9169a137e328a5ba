"""Idempotency and dedup end to end: every row of the idempotency semantics table
(docs/architecture.md) and its ten failure cases, against the real Postgres and Redis.

Fault-injection tests say in their docstring which crash point they simulate. A crash is a
``SimulatedCrash`` (a BaseException, like the SystemExit a killed worker dies with): no
``except Exception`` in the service sees it, so nothing is released or completed after it, just
as when the process dies. Postgres rolls back what was not committed.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from core.errors import DatabaseUnavailableError
from memories.idempotency import IdempotencyStore, record_key
from memories.store import CREATE_SQL, MemoryStore, create_params
from tests.integration.memory_service.helpers import (
    Tenant,
    idempotency_record,
    make_source_session,
    memory_body,
    memory_count,
    memory_ids,
)
from tests.integration.pipeline.helpers import wait_for

REPLAYED = "Idempotent-Replayed"


class SimulatedCrash(BaseException):
    """The process dies here."""


def post(http: httpx.Client, tenant_: Tenant, body: dict[str, Any], key: str | None = None):
    return http.post("/v1/memories", json=body, headers=tenant_.headers(key=key))


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def expire_lease(client: redis.Redis, org_id: uuid.UUID, key: str) -> None:
    """Simulated clock: the lease ends now (it is the running record's expiry in Redis)."""
    assert idempotency_record(client, org_id, key)["state"] == b"running"
    record = record_key(org_id, key)
    assert client.pexpire(record, 1)
    wait_for(lambda: not client.exists(record), "the lease to end", timeout=5)


# -- the semantics table, row by row ---------------------------------------------------------


def test_no_key_runs_and_content_dedup_still_applies(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db
) -> None:
    first = post(http, acme, memory_body(acme.agent_id))
    assert first.status_code == 201
    again = post(http, acme, memory_body(acme.agent_id, content="DANA is allergic to peanuts."))
    assert again.status_code == 409
    assert again.json()["error"] == {
        "code": "DUPLICATE_CONTENT",
        "message": again.json()["error"]["message"],
        "existing_id": first.json()["id"],
    }
    assert redis_client.keys("ibex:idem:*") == []
    assert memory_count(db) == 1


def test_same_key_while_running_is_409_in_progress_and_never_runs_twice(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, settings, db
) -> None:
    """Crash point: none; another request holds a live claim on the key."""
    body = memory_body(acme.agent_id)
    claims = IdempotencyStore(redis_client, ttl_seconds=60, lease_seconds=30)
    fingerprint = _fingerprint_of(body)
    assert claims.claim(acme.org_id, "k", fingerprint).owned
    response = post(http, acme, body, key="k")
    assert response.status_code == 409
    assert code(response) == "IDEMPOTENCY_IN_PROGRESS"
    assert 1 <= int(response.headers["Retry-After"]) <= 30
    assert response.json()["error"]["retry_after"] == int(response.headers["Retry-After"])
    assert memory_count(db) == 0


def test_same_key_same_body_done_replays_status_and_body(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db
) -> None:
    body = memory_body(acme.agent_id)
    first = post(http, acme, body, key="k")
    assert first.status_code == 201
    # Key order, whitespace and escapes differ; the validated body is the same.
    reordered = json.dumps(dict(reversed(list(body.items()))), indent=3, ensure_ascii=True)
    again = http.post(
        "/v1/memories",
        content=reordered.replace("Dana", "\\u0044ana"),
        headers={**acme.headers(key="k"), "Content-Type": "application/json"},
    )
    assert again.status_code == 201
    assert again.headers[REPLAYED] == "true"
    assert again.content == first.content
    assert again.headers["Location"] == first.headers["Location"]
    assert memory_count(db) == 1
    assert redis_client.ttl(record_key(acme.org_id, "k")) > 86000  # the 24 h default


def test_same_key_different_body_is_409_conflict_and_the_row_is_unchanged(
    http: httpx.Client, acme: Tenant, db
) -> None:
    first = post(http, acme, memory_body(acme.agent_id), key="k")
    other = post(http, acme, memory_body(acme.agent_id, content="Dana likes tea."), key="k")
    assert other.status_code == 409
    assert code(other) == "IDEMPOTENCY_CONFLICT"
    kind_only = post(http, acme, memory_body(acme.agent_id, kind="event"), key="k")
    assert code(kind_only) == "IDEMPOTENCY_CONFLICT"
    stored = http.get(first.headers["Location"], headers=acme.headers())
    assert stored.json() == first.json()
    assert memory_count(db) == 1


def test_conflict_is_checked_before_in_progress(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db
) -> None:
    """Crash point: none; a live claim on the key holds another body's fingerprint."""
    claims = IdempotencyStore(redis_client, ttl_seconds=60, lease_seconds=30)
    assert claims.claim(acme.org_id, "k", _fingerprint_of(memory_body(acme.agent_id))).owned
    response = post(http, acme, memory_body(acme.agent_id, content="other"), key="k")
    assert response.status_code == 409
    assert code(response) == "IDEMPOTENCY_CONFLICT"
    assert memory_count(db) == 0


def test_same_content_under_another_key_is_duplicate_content(
    http: httpx.Client, acme: Tenant, db
) -> None:
    first = post(http, acme, memory_body(acme.agent_id), key="k1")
    dup = post(
        http, acme, memory_body(acme.agent_id, content=" dana IS allergic to Peanuts."), key="k2"
    )
    assert dup.status_code == 409
    assert code(dup) == "DUPLICATE_CONTENT"
    assert dup.json()["error"]["existing_id"] == first.json()["id"]
    # The key keeps that answer: the same request replays it.
    again = post(
        http, acme, memory_body(acme.agent_id, content=" dana IS allergic to Peanuts."), key="k2"
    )
    assert (again.status_code, again.headers[REPLAYED], again.content) == (409, "true", dup.content)
    assert memory_count(db) == 1


def test_keys_and_content_are_scoped_per_org(
    http: httpx.Client, acme: Tenant, globex: Tenant, db
) -> None:
    a = post(http, acme, memory_body(acme.agent_id), key="shared-key")
    b = post(http, globex, memory_body(globex.agent_id), key="shared-key")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    assert REPLAYED not in b.headers
    assert memory_count(db) == 2


def test_another_agent_may_hold_the_same_content(
    http: httpx.Client, acme: Tenant, store, db
) -> None:
    other_agent = store.ensure_agent(acme.org_id, "other-bot")
    make_source_session(store, acme.org_id, other_agent)
    assert post(http, acme, memory_body(acme.agent_id)).status_code == 201
    assert post(http, acme, memory_body(other_agent)).status_code == 201
    assert memory_count(db) == 2


# -- the ten failure cases -------------------------------------------------------------------


def test_1_fifty_concurrent_identical_posts_make_one_row(
    http: httpx.Client, acme: Tenant, db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 threads POST the same key and body at once; the insert waits until every other
    request has been answered, so all of them overlap it. Only 201 or 409 in-progress may come
    back, the in-progress ones then replay the same id."""
    real_create = MemoryStore.create
    answered = Counter[str]()
    lock = threading.Lock()

    def held_create(self: MemoryStore, *args: Any, **kwargs: Any):
        wait_for(lambda: answered["n"] >= 49, "the other 49 requests to be answered")
        return real_create(self, *args, **kwargs)

    monkeypatch.setattr(MemoryStore, "create", held_create)
    body = memory_body(acme.agent_id)
    barrier = threading.Barrier(50)

    def attempt(_: int) -> httpx.Response:
        barrier.wait()
        response = post(http, acme, body, key="same")
        with lock:
            answered["n"] += 1
        return response

    with ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(attempt, range(50)))
    outcomes = Counter(
        (r.status_code, r.headers.get(REPLAYED), r.json().get("error", {}).get("code"))
        for r in responses
    )
    assert outcomes[(201, None, None)] == 1
    assert outcomes[(409, None, "IDEMPOTENCY_IN_PROGRESS")] == 49
    assert set(outcomes) <= {
        (201, None, None),
        (201, "true", None),
        (409, None, "IDEMPOTENCY_IN_PROGRESS"),
    }
    ids = {r.json()["id"] for r in responses if r.status_code == 201}
    for r in responses:
        if r.status_code == 409:
            retry = post(http, acme, body, key="same")
            assert (retry.status_code, retry.headers[REPLAYED]) == (201, "true")
            ids.add(retry.json()["id"])
    assert len(ids) == 1
    assert memory_count(db) == 1


def test_2_conflict_racing_keeps_the_first_body(
    http: httpx.Client, acme: Tenant, db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 threads race one key with two different bodies. The winner's body is stored once;
    the other body only ever gets 409 IDEMPOTENCY_CONFLICT."""
    real_create = MemoryStore.create
    answered = Counter[str]()
    lock = threading.Lock()

    def held_create(self: MemoryStore, *args: Any, **kwargs: Any):
        # The insert waits until every other request has been answered: all of them overlap.
        wait_for(lambda: answered["n"] >= 19, "the other 19 requests to be answered")
        return real_create(self, *args, **kwargs)

    monkeypatch.setattr(MemoryStore, "create", held_create)
    bodies = [memory_body(acme.agent_id, content=f"Body {c}") for c in "AB"]
    barrier = threading.Barrier(20)

    def attempt(i: int) -> tuple[int, httpx.Response]:
        barrier.wait()
        response = post(http, acme, bodies[i % 2], key="raced")
        with lock:
            answered["n"] += 1
        return i % 2, response

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(attempt, range(20)))
    created = [(i, r) for i, r in results if r.status_code == 201 and REPLAYED not in r.headers]
    assert len(created) == 1
    winner, first = created[0]
    for i, r in results:
        if i == winner:
            assert r.status_code in (201, 409)
            if r.status_code == 409:
                assert code(r) == "IDEMPOTENCY_IN_PROGRESS"
            else:
                assert r.json()["id"] == first.json()["id"]
        else:
            assert (r.status_code, code(r)) == (409, "IDEMPOTENCY_CONFLICT")
    assert memory_count(db) == 1
    stored = http.get(first.headers["Location"], headers=acme.headers()).json()
    assert stored["content"] == f"Body {'AB'[winner]}"


def test_4_crash_after_commit_before_redis_completion(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db, monkeypatch
) -> None:
    """Crash point: the row is committed in Postgres, the process dies before the Redis record
    is marked done. The retry is in progress during the lease; after it, the takeover finds the
    committed row and replays its id. One row."""

    def crash(*args: Any, **kwargs: Any) -> bool:
        raise SimulatedCrash

    body = memory_body(acme.agent_id)
    with monkeypatch.context() as patch:
        patch.setattr(IdempotencyStore, "complete", crash)
        with pytest.raises(SimulatedCrash):
            post(http, acme, body, key="k")
    assert memory_count(db) == 1
    (committed_id,) = memory_ids(db)
    during = post(http, acme, body, key="k")
    assert (during.status_code, code(during)) == (409, "IDEMPOTENCY_IN_PROGRESS")
    expire_lease(redis_client, acme.org_id, "k")
    after = post(http, acme, body, key="k")
    assert (after.status_code, after.headers[REPLAYED]) == (201, "true")
    assert after.json()["id"] == str(committed_id)
    assert idempotency_record(redis_client, acme.org_id, "k")["state"] == b"done"
    again = post(http, acme, body, key="k")
    assert again.content == after.content
    assert memory_count(db) == 1


def test_5_crash_after_claim_before_commit(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db, monkeypatch
) -> None:
    """Crash point: the key is claimed and the INSERT has run, the process dies before COMMIT
    (Postgres rolls it back). In progress during the lease, then exactly one row."""

    def insert_then_crash(self: MemoryStore, org_id: uuid.UUID, new: Any) -> Any:
        with self.db.atomic():  # the INSERT runs, the COMMIT never comes
            self.db.execute_sql(CREATE_SQL, create_params(org_id, new)).fetchone()
            raise SimulatedCrash

    body = memory_body(acme.agent_id)
    with monkeypatch.context() as patch:
        patch.setattr(MemoryStore, "create", insert_then_crash)
        with pytest.raises(SimulatedCrash):
            post(http, acme, body, key="k")
    assert memory_count(db) == 0
    during = post(http, acme, body, key="k")
    assert (during.status_code, code(during)) == (409, "IDEMPOTENCY_IN_PROGRESS")
    assert int(during.headers["Retry-After"]) >= 1
    assert memory_count(db) == 0
    expire_lease(redis_client, acme.org_id, "k")
    after = post(http, acme, body, key="k")
    assert after.status_code == 201
    assert REPLAYED not in after.headers
    assert memory_count(db) == 1
    assert memory_ids(db) == [uuid.UUID(after.json()["id"])]


def test_6_late_original_owner_cannot_complete_over_a_takeover(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db, monkeypatch
) -> None:
    """Crash point: the original request stalls after its claim, past its lease (a GC pause, a
    stuck socket). A retry claims the key as a new owner and commits. The original then
    wakes: its insert meets the key's row, and its completion is refused by the owner check.
    One row."""
    real_create = MemoryStore.create
    stalled, resume = threading.Event(), threading.Event()
    completions: list[tuple[str, bool]] = []
    real_complete = IdempotencyStore.complete

    def stalling_create(self: MemoryStore, *args: Any, **kwargs: Any):
        if threading.current_thread().name == "original":
            stalled.set()
            assert resume.wait(10)
        return real_create(self, *args, **kwargs)

    def spying_complete(self: IdempotencyStore, claim: Any, response: Any) -> bool:
        done = real_complete(self, claim, response)
        completions.append((threading.current_thread().name, done))
        return done

    monkeypatch.setattr(MemoryStore, "create", stalling_create)
    monkeypatch.setattr(IdempotencyStore, "complete", spying_complete)
    body = memory_body(acme.agent_id)
    results: dict[str, httpx.Response] = {}
    original = threading.Thread(
        target=lambda: results.setdefault("original", post(http, acme, body, key="k")),
        name="original",
    )
    original.start()
    assert stalled.wait(10)
    expire_lease(redis_client, acme.org_id, "k")
    retry = post(http, acme, body, key="k")
    assert retry.status_code == 201
    assert REPLAYED not in retry.headers
    resume.set()
    original.join(10)
    assert not original.is_alive(), "the original request did not finish"
    late = results["original"]
    assert (late.status_code, late.headers[REPLAYED]) == (201, "true")
    assert late.json()["id"] == retry.json()["id"]
    assert completions == [("MainThread", True), ("original", False)]
    stored = idempotency_record(redis_client, acme.org_id, "k")["id"]
    assert str(uuid.UUID(bytes=stored)) == retry.json()["id"]
    assert memory_count(db) == 1


def test_6b_late_owner_after_its_own_commit(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db, monkeypatch
) -> None:
    """Crash point: the original commits, then stalls before completing, past its lease. The
    next owner's write meets the committed row and replays it; the late completion is
    refused."""
    real_complete = IdempotencyStore.complete
    stalled, resume = threading.Event(), threading.Event()
    completions: list[tuple[str, bool]] = []

    def stalling_complete(self: IdempotencyStore, claim: Any, response: Any) -> bool:
        if threading.current_thread().name == "original":
            stalled.set()
            assert resume.wait(10)
        done = real_complete(self, claim, response)
        completions.append((threading.current_thread().name, done))
        return done

    monkeypatch.setattr(IdempotencyStore, "complete", stalling_complete)
    body = memory_body(acme.agent_id)
    results: dict[str, httpx.Response] = {}
    original = threading.Thread(
        target=lambda: results.setdefault("original", post(http, acme, body, key="k")),
        name="original",
    )
    original.start()
    assert stalled.wait(10)
    expire_lease(redis_client, acme.org_id, "k")
    retry = post(http, acme, body, key="k")
    assert (retry.status_code, retry.headers[REPLAYED]) == (201, "true")
    resume.set()
    original.join(10)
    assert not original.is_alive(), "the original request did not finish"
    assert results["original"].status_code == 201
    assert results["original"].json()["id"] == retry.json()["id"]
    assert completions == [("MainThread", True), ("original", False)]
    assert memory_count(db) == 1


def test_7_redis_flushed_between_original_and_retry(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db
) -> None:
    """Crash point: the Redis record is lost after the original answered (FLUSHALL, eviction,
    a failover). FLUSHDB on the test database stands for FLUSHALL so other suites sharing this
    Redis keep their data. The retry is answered from Postgres: the original id, no duplicate."""
    body = memory_body(acme.agent_id)
    first = post(http, acme, body, key="k")
    assert first.status_code == 201
    redis_client.flushdb()
    retry = post(http, acme, body, key="k")
    assert (retry.status_code, retry.headers[REPLAYED]) == (201, "true")
    assert retry.content == first.content
    redis_client.flushdb()
    other = post(http, acme, memory_body(acme.agent_id, content="Something else."), key="k")
    assert (other.status_code, code(other)) == (409, "IDEMPOTENCY_CONFLICT")
    assert other.json()["error"]["existing_id"] == first.json()["id"]
    assert memory_ids(db) == [uuid.UUID(first.json()["id"])]


def test_8_key_older_than_the_ttl(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db
) -> None:
    """Crash point: none; the idempotency record outlives its TTL (simulated: its expiry is
    moved to now). The key then runs as a new request, and Postgres still decides: the same
    body gets the original id back, identical content under a new key is DUPLICATE_CONTENT."""
    body = memory_body(acme.agent_id)
    first = post(http, acme, body, key="old")
    record = record_key(acme.org_id, "old")
    assert redis_client.pexpire(record, 1)
    wait_for(lambda: not redis_client.exists(record), "the record to expire", timeout=5)
    again = post(http, acme, body, key="old")
    assert (again.status_code, again.headers[REPLAYED]) == (201, "true")
    assert again.json()["id"] == first.json()["id"]
    fresh = post(http, acme, body, key="new")
    assert (fresh.status_code, code(fresh)) == (409, "DUPLICATE_CONTENT")
    assert fresh.json()["error"]["existing_id"] == first.json()["id"]
    assert memory_count(db) == 1


def test_9_two_keys_same_content_concurrently(
    http: httpx.Client, acme: Tenant, db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten keys race one content; only the unique index can settle it: one row, the others
    DUPLICATE_CONTENT naming it."""
    barrier = threading.Barrier(10)
    body = memory_body(acme.agent_id)

    def attempt(i: int) -> httpx.Response:
        barrier.wait()
        return post(http, acme, body, key=f"key-{i}")

    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(attempt, range(10)))
    created = [r for r in responses if r.status_code == 201]
    assert len(created) == 1
    winner = created[0].json()["id"]
    for r in responses:
        if r.status_code != 201:
            assert (r.status_code, code(r), r.json()["error"]["existing_id"]) == (
                409,
                "DUPLICATE_CONTENT",
                winner,
            )
    assert memory_ids(db) == [uuid.UUID(winner)]


def test_10_a_422_does_not_consume_the_key(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db
) -> None:
    invalid = post(http, acme, {"agent_id": str(acme.agent_id), "content": ""}, key="k")
    assert invalid.status_code == 422
    unknown_agent = post(http, acme, memory_body(uuid.uuid4()), key="k")  # fails after the claim
    assert unknown_agent.status_code == 422
    assert not redis_client.exists(record_key(acme.org_id, "k"))
    valid = post(http, acme, memory_body(acme.agent_id), key="k")
    assert valid.status_code == 201
    assert REPLAYED not in valid.headers
    assert memory_count(db) == 1


def test_10_a_5xx_before_commit_releases_the_key(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db, monkeypatch
) -> None:
    """Crash point: none; Postgres fails before the commit (503). The claim is released at once,
    so the retry runs now instead of waiting out the lease."""

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseUnavailableError("connection refused")

    body = memory_body(acme.agent_id)
    with monkeypatch.context() as patch:
        patch.setattr(MemoryStore, "create", unavailable)
        failed = post(http, acme, body, key="k")
    assert (failed.status_code, code(failed), failed.headers["Retry-After"]) == (
        503,
        "UNAVAILABLE",
        "1",
    )
    assert not redis_client.exists(record_key(acme.org_id, "k"))
    retry = post(http, acme, body, key="k")
    assert retry.status_code == 201
    assert REPLAYED not in retry.headers
    assert memory_count(db) == 1


def test_a_500_is_not_stored_either(
    http: httpx.Client, acme: Tenant, redis_client: redis.Redis, db, monkeypatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    body = memory_body(acme.agent_id)
    with monkeypatch.context() as patch:
        patch.setattr(MemoryStore, "create", broken)
        failed = post(http, acme, body, key="k")
    assert (failed.status_code, code(failed)) == (500, "INTERNAL_ERROR")
    assert not redis_client.exists(record_key(acme.org_id, "k"))
    assert post(http, acme, body, key="k").status_code == 201


def test_without_redis_postgres_alone_keeps_the_guarantees(
    settings, app_db, acme: Tenant, db
) -> None:
    """Crash point: Redis is down for the whole exchange. Writes go on; the unique keys in
    Postgres still replay the key and refuse duplicates; /readyz reports the outage."""
    from memory_service.app import create_app, make_redis

    dead = make_redis("redis://127.0.0.1:1/0")
    app = create_app(settings, db=app_db, redis_client=dead)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://m") as http:
        body = memory_body(acme.agent_id)
        first = post(http, acme, body, key="k")
        assert first.status_code == 201
        again = post(http, acme, body, key="k")
        assert (again.status_code, again.headers[REPLAYED]) == (201, "true")
        assert again.json()["id"] == first.json()["id"]
        dup = post(http, acme, body, key="k2")
        assert code(dup) == "DUPLICATE_CONTENT"
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["redis"].startswith("error")
    assert memory_count(db) == 1


def test_deleted_content_can_be_written_again_but_the_key_stays_bound(
    http: httpx.Client, acme: Tenant, db
) -> None:
    body = memory_body(acme.agent_id)
    first = post(http, acme, body, key="k1")
    assert http.delete(first.headers["Location"], headers=acme.headers()).status_code == 204
    second = post(http, acme, body, key="k2")
    assert second.status_code == 201
    assert second.json()["id"] != first.json()["id"]
    replay = post(http, acme, body, key="k1")  # the first key still answers with its own row
    assert replay.json()["id"] == first.json()["id"]
    assert memory_count(db) == 2


def _fingerprint_of(body: dict[str, Any]) -> str:
    from marshmallow import Schema

    from memories.canonical import canonical_request, fingerprint_digest
    from schema.memory import MemoryCreateSchema

    schema: Schema = MemoryCreateSchema()
    return fingerprint_digest(canonical_request(schema.load(body)))
