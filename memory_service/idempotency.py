"""Idempotency records in Redis: claim, complete and release, each one atomic Lua script.

A record is a small hash at :func:`record_key` (a fixed-size digest of the org and the key, so a
255-character key costs no more than a short one) holding only what the claim and the replay
decision need:

- ``fp``: the first 128 bits of a hash of the request fingerprint (enough to tell the same
  request from another under one key);
- ``state``: ``running`` or ``done``;
- ``owner``: the random token of the request that runs the key (8 bytes);
- ``lease_until``: while running, the lease deadline in milliseconds of *Redis server time*
  (``TIME`` inside the script, so clock skew between web processes cannot shorten or stretch a
  lease);
- once done, ``id`` (the memory's 16-byte UUID) and ``status`` (:class:`Answer`: which response
  the key gives).

The response itself is not stored: a replay of a created memory is rebuilt from the Postgres row
found by the key, which is the response first given byte for byte (the row is immutable but for
``deleted_at``, which the response does not show). A record thus takes under 200 bytes of Redis
memory (``MEMORY USAGE``) for the idempotency TTL.

This record is an optimisation and the "in progress" signal, not the source of truth: the row in
Postgres (``UNIQUE(org_id, idempotency_key)`` and the live-content index) is. Losing the record
(TTL, FLUSHALL, eviction, failover) can therefore never produce a duplicate; it only means the
next request with that key is answered from Postgres instead. Any Redis error, an out-of-memory
refusal included, is handled the same way as an unreachable Redis.
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

KEY_PREFIX = "ibex:idem:"
#: After a Redis failure, requests skip Redis for this long instead of each paying a timeout.
REDIS_BACKOFF_SECONDS = 5.0

# Order matters: a different fingerprint is a conflict whatever the state (conflict is checked
# before in-progress), then a finished record replays, then a live lease means in progress, and
# only an expired lease is taken over (with a new owner, so the old owner cannot complete).
CLAIM_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = string.format('%.0f', now + tonumber(ARGV[3]))
local rec = redis.call('HMGET', KEYS[1], 'fp', 'state', 'lease_until', 'status', 'id')
if not rec[1] then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'running', 'owner', ARGV[2],
             'lease_until', lease_until)
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
  return {'claimed'}
end
if rec[1] ~= ARGV[1] then
  return {'conflict'}
end
if rec[2] == 'done' then
  return {'done', rec[4] or '', rec[5] or ''}
end
local left = tonumber(rec[3] or '0') - now
if left > 0 then
  return {'running', string.format('%.0f', left)}
end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'lease_until', lease_until)
return {'takeover'}
"""

# Only the current owner may complete: a request whose lease was taken over is refused here,
# atomically, however late it arrives. A vanished record is not recreated (Postgres holds the
# truth; the next request is answered from there).
COMPLETE_LUA = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'id', ARGV[3])
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return 1
"""

# A failure that stored nothing (validation, 5xx) frees the key at once for the next attempt.
RELEASE_LUA = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'state') == 'running' then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class ClaimState(enum.StrEnum):
    CLAIMED = "claimed"
    TAKEOVER = "takeover"
    RUNNING = "running"
    DONE = "done"
    CONFLICT = "conflict"
    #: Redis did not answer: proceed on Postgres alone (its unique keys still decide).
    UNAVAILABLE = "unavailable"


class Answer(enum.StrEnum):
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

    answer: Answer
    memory_id: uuid.UUID


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    key: str
    owner: bytes
    retry_after_ms: int = 0
    stored: StoredAnswer | None = None

    @property
    def owned(self) -> bool:
        """Whether this request now runs the key (and must complete or release it)."""
        return self.state in (ClaimState.CLAIMED, ClaimState.TAKEOVER)


def record_key(org_id: uuid.UUID | str, idempotency_key: str) -> str:
    """``ibex:idem:`` + 22 characters: a 128-bit digest of the org and the key, so records
    have one small size whatever the key's length, and keys of different orgs never meet."""
    digest = hashlib.blake2b(f"{org_id}:{idempotency_key}".encode(), digest_size=16).digest()
    return KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def compact_fingerprint(fingerprint: str) -> bytes:
    """The 16 bytes a record keeps of a request fingerprint: they only need to tell requests
    under the same key apart."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=16).digest()


def _evalsha(conn: ConnectionInterface, script: Script, keys: list[str], args: list[Any]) -> Any:
    try:
        conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return conn.read_response()
    except NoScriptError:
        conn.send_command("EVAL", script.script, len(keys), *keys, *args)
        return conn.read_response()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class IdempotencyStore:
    """The three scripts over one Redis client (thread-safe; the client pools connections)."""

    def __init__(self, client: redis.Redis, *, ttl_seconds: int, lease_seconds: int) -> None:
        self.client = client
        self.ttl_seconds = ttl_seconds
        self.lease_ms = lease_seconds * 1000
        self._claim = client.register_script(CLAIM_LUA)
        self._complete = client.register_script(COMPLETE_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()

    def _eval(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` with EVALSHA on a connection of this thread's own.

        Every POST runs two scripts, and redis-py's per-command path (pool checkout and
        release, retry wrapper, instrumentation) cost more CPU than the request's own work
        with them, so the request path talks to a connection it keeps: one socket write and
        one read per script. As with the pooled client, a connection found broken (Redis
        restarted) is retried once on a fresh one; a timeout is not retried, a slow Redis must
        not hold requests. NOSCRIPT (a restarted or flushed Redis) runs the source once with
        EVAL, which caches it again.
        """
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.client.connection_pool.make_connection()
        try:
            return _evalsha(conn, script, keys, args)
        except redis.ConnectionError:
            conn.disconnect()
        return _evalsha(conn, script, keys, args)

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: redis.RedisError) -> None:
        """Any Redis error: unreachable, timed out, or refusing writes when out of memory
        (``noeviction`` at ``maxmemory``; inside a script the OOM arrives as a plain
        ResponseError). None of them can cost a guarantee, the Postgres keys decide alone."""
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
        key = record_key(org_id, idempotency_key)
        owner = secrets.token_bytes(8)
        if not self._available():
            return Claim(ClaimState.UNAVAILABLE, key, owner)
        try:
            reply = self._eval(
                self._claim,
                [key],
                [compact_fingerprint(fingerprint), owner, self.lease_ms, self.ttl_seconds],
            )
        except redis.RedisError as exc:
            self._failed(exc)
            return Claim(ClaimState.UNAVAILABLE, key, owner)
        state = ClaimState(_text(reply[0]))
        if state is ClaimState.RUNNING:
            return Claim(state, key, owner, retry_after_ms=int(_text(reply[1])))
        if state is ClaimState.DONE:
            stored = StoredAnswer(Answer(_text(reply[1])), uuid.UUID(bytes=bytes(reply[2])))
            return Claim(state, key, owner, stored=stored)
        return Claim(state, key, owner)

    def complete(self, claim: Claim, stored: StoredAnswer) -> bool:
        """Store the answer under the key; False if another request owns it now."""
        try:
            done = self._eval(
                self._complete,
                [claim.key],
                [claim.owner, stored.answer.value, stored.memory_id.bytes, self.ttl_seconds],
            )
        except redis.RedisError as exc:
            self._failed(exc)
            return False
        return bool(done)

    def release(self, claim: Claim) -> bool:
        """Drop a running claim this request owns, so the key can be used again at once."""
        try:
            return bool(self._eval(self._release, [claim.key], [claim.owner]))
        except redis.RedisError as exc:
            self._failed(exc)
            return False
