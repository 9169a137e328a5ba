"""The claim (one SET), complete and release (Lua scripts) run by fakeredis (no sockets).

Lease expiry is simulated by expiring the running record: the lease is the record's expiry,
kept by the Redis server's clock, so this is the only clock a test needs to move.
"""

from __future__ import annotations

import uuid

import fakeredis
import pytest

from memories import idempotency
from memories.idempotency import (
    ClaimState,
    IdempotencyStore,
    KeyAnswer,
    StoredAnswer,
    compact_fingerprint,
    done_record,
    record_key,
)

ORG = "11111111-1111-4111-8111-111111111111"
MEMORY = uuid.UUID("44444444-4444-4444-8444-444444444444")
CREATED = StoredAnswer(KeyAnswer.CREATED, MEMORY)


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def idem(client: fakeredis.FakeRedis) -> IdempotencyStore:
    return IdempotencyStore(client, ttl_seconds=600, lease_seconds=30)


def expire(client: fakeredis.FakeRedis, key: str = "k") -> None:
    """The lease ends: the running record expires with it."""
    assert client.pexpire(record_key(ORG, key), 1)
    client.delete(record_key(ORG, key))  # what the expiry does once the millisecond passes


def test_first_claim_runs_with_the_lease_as_the_records_expiry(idem, client) -> None:
    claim = idem.claim(ORG, "k", "fp")
    assert claim.state is ClaimState.CLAIMED and claim.owned
    record = client.get(record_key(ORG, "k"))
    assert record == compact_fingerprint("fp") + b"R" + claim.owner
    assert len(claim.owner) == 8
    assert 29_000 < client.pttl(record_key(ORG, "k")) <= 30_000


def test_same_fingerprint_while_running_is_in_progress(idem) -> None:
    idem.claim(ORG, "k", "fp")
    second = idem.claim(ORG, "k", "fp")
    assert second.state is ClaimState.RUNNING and not second.owned
    assert 29_000 < second.retry_after_ms <= 30_000


def test_conflict_is_checked_before_in_progress_and_after_done(idem) -> None:
    first = idem.claim(ORG, "k", "fp")
    assert idem.claim(ORG, "k", "other").state is ClaimState.CONFLICT
    idem.complete(first, CREATED)
    assert idem.claim(ORG, "k", "other").state is ClaimState.CONFLICT


def test_done_answers_with_the_stored_answer_and_memory(idem, client) -> None:
    first = idem.claim(ORG, "k", "fp")
    assert idem.complete(first, CREATED)
    replay = idem.claim(ORG, "k", "fp")
    assert replay.state is ClaimState.DONE and not replay.owned
    assert replay.stored == CREATED
    record = client.get(record_key(ORG, "k"))
    assert record == done_record(compact_fingerprint("fp"), CREATED)  # the owner is gone
    assert 590 < client.ttl(record_key(ORG, "k")) <= 600  # the lease became the TTL
    duplicate = StoredAnswer(KeyAnswer.DUPLICATE, uuid.uuid4())
    assert not idem.complete(first, duplicate)  # done: no completion rewrites it
    assert idem.claim(ORG, "k", "fp").stored == CREATED


@pytest.mark.parametrize("answer", list(KeyAnswer))
def test_every_answer_round_trips(idem, answer: KeyAnswer) -> None:
    first = idem.claim(ORG, "k", "fp")
    idem.complete(first, StoredAnswer(answer, MEMORY))
    assert idem.claim(ORG, "k", "fp").stored == StoredAnswer(answer, MEMORY)


def test_a_record_key_has_one_size_whatever_the_key(idem) -> None:
    short, long = record_key(ORG, "k"), record_key(ORG, "x" * 255)
    assert len(short) == len(long) == len("ibex:idem:s:") + 22
    assert short != long != record_key("22222222-2222-4222-8222-222222222222", "k")


def test_an_expired_lease_is_taken_over_and_the_old_owner_cannot_complete(idem, client) -> None:
    original = idem.claim(ORG, "k", "fp")
    expire(client)
    takeover = idem.claim(ORG, "k", "fp")
    assert takeover.state is ClaimState.CLAIMED and takeover.owned
    assert takeover.owner != original.owner
    assert idem.claim(ORG, "k", "fp").state is ClaimState.RUNNING  # the new lease is live
    late = StoredAnswer(KeyAnswer.CREATED, uuid.uuid4())
    assert not idem.complete(original, late)
    assert not idem.release(original)
    assert idem.complete(takeover, CREATED)
    assert idem.claim(ORG, "k", "fp").stored == CREATED


def test_an_in_progress_answer_right_as_the_lease_ends_retries_soon(idem, client) -> None:
    idem.claim(ORG, "k", "fp")
    client.persist(record_key(ORG, "k"))  # PTTL then says -1: no lease left to report
    assert idem.claim(ORG, "k", "fp").retry_after_ms == 0


def test_a_record_of_another_shape_leaves_the_decision_to_postgres(idem, client) -> None:
    client.set(record_key(ORG, "k"), compact_fingerprint("fp") + b"?")
    claim = idem.claim(ORG, "k", "fp")
    assert claim.state is ClaimState.UNAVAILABLE and not claim.owned
    assert idem.claim(ORG, "other", "fp").state is ClaimState.CLAIMED  # no back-off


def test_a_record_that_ends_between_the_set_and_its_read_is_claimed_again(
    idem, client, monkeypatch
) -> None:
    first = idem.claim(ORG, "k", "fp")
    send = idempotency._send

    def lease_ends_first(conn, *args):  # type: ignore[no-untyped-def]
        if args[0] == "GET":
            client.delete(record_key(ORG, "k"))
        return send(conn, *args)

    monkeypatch.setattr(idempotency, "_send", lease_ends_first)
    second = idem.claim(ORG, "k", "fp")
    assert second.state is ClaimState.CLAIMED and second.owner != first.owner


def test_release_frees_the_key_only_for_its_owner(idem, client) -> None:
    claim = idem.claim(ORG, "k", "fp")
    stranger = idem.claim(ORG, "k", "fp")
    assert not idem.release(stranger)
    assert idem.release(claim)
    assert not client.exists(record_key(ORG, "k"))
    assert idem.claim(ORG, "k", "other").state is ClaimState.CLAIMED


def test_a_done_record_is_never_released(idem, client) -> None:
    claim = idem.claim(ORG, "k", "fp")
    idem.complete(claim, CREATED)
    assert not idem.release(claim)
    assert client.exists(record_key(ORG, "k"))


def test_completion_does_not_recreate_a_lost_record(idem, client) -> None:
    claim = idem.claim(ORG, "k", "fp")
    client.flushall()
    assert not idem.complete(claim, CREATED)
    assert not client.exists(record_key(ORG, "k"))


def test_keys_are_scoped_per_org(idem) -> None:
    assert idem.claim(ORG, "k", "fp").state is ClaimState.CLAIMED
    assert idem.claim("22222222-2222-4222-8222-222222222222", "k", "fp").owned


def test_redis_failure_is_reported_as_unavailable_and_skipped_for_a_while() -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    client = fakeredis.FakeRedis(server=server)
    idem = IdempotencyStore(client, ttl_seconds=60, lease_seconds=5)
    first = idem.claim(ORG, "k", "fp")
    server.connected = True
    second = idem.claim(ORG, "k", "fp")
    assert (first.state, second.state) == (ClaimState.UNAVAILABLE, ClaimState.UNAVAILABLE)
    assert not first.owned
    assert not client.exists(record_key(ORG, "k"))  # the second request did not use Redis


def test_a_broken_connection_is_retried_once_on_a_fresh_one(idem, client) -> None:
    assert idem.claim(ORG, "a", "fp").state is ClaimState.CLAIMED

    class GoneSocket:  # the server went away under the kept connection
        def sendall(self, data: bytes) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def shutdown(self, how: int) -> None:
            pass

        def close(self) -> None:
            pass

    idem._local.conn._sock = GoneSocket()
    assert idem.claim(ORG, "b", "fp").state is ClaimState.CLAIMED


def test_a_flushed_script_cache_is_refilled(idem, client) -> None:
    assert idem.claim(ORG, "a", "fp").state is ClaimState.CLAIMED
    client.script_flush()
    assert idem.claim(ORG, "b", "fp").state is ClaimState.CLAIMED
    assert idem.claim(ORG, "b", "fp").state is ClaimState.RUNNING
