"""Idempotency records in Redis: claim, complete and release, each one atomic Lua script.

A record is a hash at ``ibex:idem:<org_id>:<key>`` holding the request fingerprint, a state
(``running`` or ``done``), the owner token of the request that runs it, the lease deadline in
milliseconds of *Redis server time* (``TIME`` inside the script, so clock skew between web
processes cannot shorten or stretch a lease), and once done the status, body and Location of the
response. It lives for the idempotency TTL.

This record is an optimisation and the "in progress" signal, not the source of truth: the row in
Postgres (``UNIQUE(org_id, idempotency_key)`` and the live-content index) is. Losing the record
(TTL, FLUSHALL, eviction, failover) can therefore never produce a duplicate; it only means the
next request with that key is answered from Postgres instead.
"""

from __future__ import annotations

import enum
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
local rec = redis.call('HMGET', KEYS[1], 'fp', 'state', 'lease_until', 'status', 'body', 'location')
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
  return {'done', rec[4] or '', rec[5] or '', rec[6] or ''}
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
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'body', ARGV[3],
           'location', ARGV[4])
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
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


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: bytes
    location: str | None


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    key: str
    owner: str
    retry_after_ms: int = 0
    response: StoredResponse | None = None

    @property
    def owned(self) -> bool:
        """Whether this request now runs the key (and must complete or release it)."""
        return self.state in (ClaimState.CLAIMED, ClaimState.TAKEOVER)


def record_key(org_id: uuid.UUID | str, idempotency_key: str) -> str:
    return f"{KEY_PREFIX}{org_id}:{idempotency_key}"


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
        with self._lock:
            if self._available():
                log.warning(
                    "redis failed (%s); idempotency runs on the Postgres keys alone for %.0f s",
                    type(exc).__name__,
                    REDIS_BACKOFF_SECONDS,
                )
            self._down_until = time.monotonic() + REDIS_BACKOFF_SECONDS

    def claim(self, org_id: uuid.UUID | str, idempotency_key: str, fingerprint: str) -> Claim:
        key = record_key(org_id, idempotency_key)
        owner = secrets.token_hex(16)
        if not self._available():
            return Claim(ClaimState.UNAVAILABLE, key, owner)
        try:
            reply = self._eval(
                self._claim, [key], [fingerprint, owner, self.lease_ms, self.ttl_seconds]
            )
        except redis.RedisError as exc:
            self._failed(exc)
            return Claim(ClaimState.UNAVAILABLE, key, owner)
        state = ClaimState(_text(reply[0]))
        if state is ClaimState.RUNNING:
            return Claim(state, key, owner, retry_after_ms=int(_text(reply[1])))
        if state is ClaimState.DONE:
            status, body, location = reply[1], reply[2], _text(reply[3])
            stored = StoredResponse(
                int(_text(status)),
                body if isinstance(body, bytes) else str(body).encode("utf-8"),
                location or None,
            )
            return Claim(state, key, owner, response=stored)
        return Claim(state, key, owner)

    def complete(self, claim: Claim, response: StoredResponse) -> bool:
        """Store the response under the key; False if another request owns it now."""
        try:
            done = self._eval(
                self._complete,
                [claim.key],
                [
                    claim.owner,
                    response.status,
                    response.body,
                    response.location or "",
                    self.ttl_seconds,
                ],
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
