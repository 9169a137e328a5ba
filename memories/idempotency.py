"""Idempotency records in Redis: a claim is one ``SET``, a completion one short script.

A record is one small string at :func:`record_key` (a fixed-size digest of the org and the key,
so a 255-character key costs no more than a short one) holding only what the claim and the
replay decision need, in fixed binary fields:

- running: the first 128 bits of a hash of the request fingerprint (enough to tell the same
  request from another under one key), ``R``, and the random token of the request that runs
  the key (8 bytes): 25 bytes;
- done: the same fingerprint, ``D``, the memory's 16-byte UUID and :class:`KeyAnswer` (which
  response the key gives).

The commands of a POST, as ``INFO commandstats`` counts them (a script and each command it
runs):

- the claim is ``SET key running NX PX lease``: it creates the running record with the lease
  as its expiry, atomically, or finds a record there, which one ``GET`` then reads (and only
  an "in progress" answer reads the lease left, with ``PTTL``, for ``Retry-After``). The
  lease is thus kept by *Redis server time* (clock skew between web processes cannot shorten
  or stretch it), and an expired lease is gone with its record: the next request claims the
  key anew, as a new owner;
- the completion is one script that replaces the running record by the done one (``SET`` with
  the idempotency TTL) only if the record is still this request's own (``GET``): a request
  whose lease expired, and whose key another request then claimed, is refused, atomically,
  however late it arrives, and a vanished record is not recreated;
- a failure that stored nothing (validation, 5xx) frees the key with a script that deletes
  the record only if it is still this request's own (``release``), so the next attempt runs
  at once.

So a POST with a new key costs 4 Redis commands (``SET``; ``EVALSHA``, ``GET``, ``SET``), and
a replay 2 (``SET``, ``GET``). (``SET NX GET`` would read the record in the claim's own
command, but needs Redis 7; the service runs on 6.2 too.)

The response itself is not stored: a replay of a created memory is rebuilt from the Postgres row
found by the key, which is the response first given byte for byte (the row is immutable but for
``deleted_at``, which the response does not show). A record thus takes under 200 bytes of Redis
memory (``MEMORY USAGE``) for the idempotency TTL.

This record is an optimisation and the "in progress" signal, not the source of truth: the row in
Postgres (``UNIQUE(org_id, idempotency_key)`` and the live-content index) is, and the write
itself answers with the row holding the key when there is one (``create_memory``). Losing the
record (lease expiry, TTL, FLUSHALL, eviction, failover) can therefore never produce a
duplicate; it only means the next request with that key is answered from Postgres instead. Any
Redis error, an out-of-memory refusal included, is handled the same way as an unreachable Redis.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import logging
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script
from redis.connection import ConnectionInterface
from redis.exceptions import NoScriptError

log = logging.getLogger(__name__)

#: Records are strings under this prefix; records an older release wrote under other names
#: are not read (their keys are answered from Postgres, as if lost) and expire with their TTL.
KEY_PREFIX = "ibex:idem:s:"
#: After a Redis failure, requests skip Redis for this long instead of each paying a timeout.
REDIS_BACKOFF_SECONDS = 5.0

FINGERPRINT_BYTES = 16
#: A claim that finds a record which then vanishes before it is read claims again, this often.
CLAIM_ATTEMPTS = 3
RUNNING = b"R"
DONE = b"D"

# Only the current owner may complete: the record must still be this request's running record
# (its fingerprint and owner token), else another request owns the key now, or it is gone.
COMPLETE_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"""

RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class ClaimState(enum.StrEnum):
    #: This request runs the key: no record held it (never used, released, or its lease or
    #: TTL ended).
    CLAIMED = "claimed"
    RUNNING = "running"
    DONE = "done"
    CONFLICT = "conflict"
    #: Redis did not answer: proceed on Postgres alone (its unique keys still decide).
    UNAVAILABLE = "unavailable"


class KeyAnswer(enum.StrEnum):
    """What a finished key answers, besides the memory it names."""

    #: The memory created under this key: replay it, rebuilt from its row.
    CREATED = "201"
    #: 409 ``DUPLICATE_CONTENT``: a live memory with the same content existed.
    DUPLICATE = "dup"
    #: 409 ``IDEMPOTENCY_CONFLICT``: the key's row holds another request.
    CONFLICT = "key"


@dataclass(frozen=True)
class StoredAnswer:
    """A finished key's record: its answer and the memory that answer names."""

    answer: KeyAnswer
    memory_id: uuid.UUID


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    key: str
    #: The running record this request set (or would have set): fingerprint, ``R``, owner.
    running: bytes
    retry_after_ms: int = 0
    stored: StoredAnswer | None = None

    @property
    def owner(self) -> bytes:
        """The random token of the request (8 bytes)."""
        return self.running[FINGERPRINT_BYTES + 1 :]

    @property
    def owned(self) -> bool:
        """Whether this request now runs the key (and must complete or release it)."""
        return self.state is ClaimState.CLAIMED


def record_key(org_id: uuid.UUID | str, idempotency_key: str) -> str:
    """``ibex:idem:s:`` + 22 characters: a 128-bit digest of the org and the key, so records
    have one small size whatever the key's length, and keys of different orgs never meet."""
    digest = hashlib.blake2b(f"{org_id}:{idempotency_key}".encode(), digest_size=16).digest()
    return KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def compact_fingerprint(fingerprint: str) -> bytes:
    """The 16 bytes a record keeps of a request fingerprint: they only need to tell requests
    under the same key apart."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=16).digest()


def done_record(fingerprint: bytes, stored: StoredAnswer) -> bytes:
    """A finished key's record: fingerprint, ``D``, the memory id, the answer."""
    return fingerprint + DONE + stored.memory_id.bytes + stored.answer.value.encode("ascii")


def _send(conn: ConnectionInterface, *args: Any) -> Any:
    conn.send_command(*args)
    return conn.read_response()


def _evalsha(conn: ConnectionInterface, script: Script, keys: list[str], args: list[Any]) -> Any:
    try:
        return _send(conn, "EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return _send(conn, "EVAL", script.script, len(keys), *keys, *args)


class IdempotencyStore:
    """The claim, completion and release over one Redis client (thread-safe)."""

    def __init__(self, client: redis.Redis, *, ttl_seconds: int, lease_seconds: int) -> None:
        self.client = client
        self.ttl_seconds = ttl_seconds
        self.lease_ms = lease_seconds * 1000
        self._complete = client.register_script(COMPLETE_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()

    def _run(self, command: Any, *args: Any) -> Any:
        """``command(connection, *args)`` on a Redis connection of this thread's own.

        redis-py's per-command path (pool checkout and release, retry wrapper,
        instrumentation) costs more CPU than the request's own use of Redis, so the request
        path talks to a connection it keeps: one socket write and one read per command. As
        with the pooled client, a connection found broken (Redis restarted) is retried once on
        a fresh one; a timeout is not retried, a slow Redis must not hold requests.
        """
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.client.connection_pool.make_connection()
        try:
            return command(conn, *args)
        except redis.ConnectionError:
            conn.disconnect()
        return command(conn, *args)

    def _eval(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """``script`` with EVALSHA; NOSCRIPT (a restarted or flushed Redis) runs the source
        once with EVAL, which caches it again."""
        return self._run(_evalsha, script, keys, args)

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: redis.RedisError) -> None:
        """Any Redis error: unreachable, timed out, or refusing writes when out of memory
        (``noeviction`` at ``maxmemory``). None of them can cost a guarantee, the Postgres
        keys decide alone."""
        reason = type(exc).__name__
        if isinstance(exc, redis.exceptions.OutOfMemoryError) or "OOM" in str(exc):
            reason = "out of memory"
        with self._lock:
            if self._available():
                log.warning(
                    "redis failed (%s); idempotency runs on the Postgres keys alone for %.0f s",
                    reason,
                    REDIS_BACKOFF_SECONDS,
                )
            self._down_until = time.monotonic() + REDIS_BACKOFF_SECONDS

    def claim(self, org_id: uuid.UUID | str, idempotency_key: str, fingerprint: str) -> Claim:
        """Run the key, or say why not. The order of the answers: a different fingerprint is
        a conflict whatever the state (conflict is checked before in-progress), then a
        finished record replays, then a running one (its lease is live: an expired one is
        gone) is in progress."""
        key = record_key(org_id, idempotency_key)
        compact = compact_fingerprint(fingerprint)
        running = compact + RUNNING + secrets.token_bytes(8)
        if not self._available():
            return Claim(ClaimState.UNAVAILABLE, key, running)
        try:
            for _ in range(CLAIM_ATTEMPTS):
                if self._run(_send, "SET", key, running, "NX", "PX", self.lease_ms) is not None:
                    return Claim(ClaimState.CLAIMED, key, running)
                found = self._run(_send, "GET", key)
                if found is not None:
                    break
                # The record ended between the two commands (its lease or TTL): claim again.
            else:
                return Claim(ClaimState.UNAVAILABLE, key, running)
            record = bytes(found)
            if record[:FINGERPRINT_BYTES] != compact:
                return Claim(ClaimState.CONFLICT, key, running)
            state = record[FINGERPRINT_BYTES : FINGERPRINT_BYTES + 1]
            if state == DONE:
                return Claim(ClaimState.DONE, key, running, stored=_stored(record))
            if state != RUNNING:  # not a record of ours: Postgres decides alone
                log.warning("unreadable idempotency record at %s", key)
                return Claim(ClaimState.UNAVAILABLE, key, running)
            left = int(self._run(_send, "PTTL", key))  # -2: it expired since
        except redis.RedisError as exc:
            self._failed(exc)
            return Claim(ClaimState.UNAVAILABLE, key, running)
        return Claim(ClaimState.RUNNING, key, running, retry_after_ms=max(left, 0))

    def complete(self, claim: Claim, stored: StoredAnswer) -> bool:
        """Store the answer under the key; False if another request owns it now, or the
        record is gone."""
        done = done_record(claim.running[:FINGERPRINT_BYTES], stored)
        try:
            completed = self._eval(
                self._complete, [claim.key], [claim.running, done, self.ttl_seconds]
            )
        except redis.RedisError as exc:
            self._failed(exc)
            return False
        return bool(completed)

    def release(self, claim: Claim) -> bool:
        """Drop a running claim this request owns, so the key can be used again at once."""
        try:
            return bool(self._eval(self._release, [claim.key], [claim.running]))
        except redis.RedisError as exc:
            self._failed(exc)
            return False


def _stored(record: bytes) -> StoredAnswer:
    start = FINGERPRINT_BYTES + 1
    memory_id = uuid.UUID(bytes=record[start : start + 16])
    return StoredAnswer(KeyAnswer(record[start + 16 :].decode("ascii")), memory_id)
