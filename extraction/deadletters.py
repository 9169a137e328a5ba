"""Dead letters: Dramatiq's Redis dead-letter sets and their Postgres mirror, for ``ibex dlq``.
The mirror's rows are read and changed through :mod:`extraction.deadletter_rows`; this module
knows what a dead message looks like in Redis and how to enqueue it again.

Dramatiq keeps a dead message in ``<ns>:<queue>.XQ`` (sorted set of ``redis_message_id`` by
failure time) and ``<ns>:<queue>.XQ.msgs`` (payloads) for 7 days; the worker's after_nack
middleware also mirrors every failure into ``ibex_core.dead_letters``. A letter is listed from
the mirror, and from Redis when the mirror missed it.

Replay is atomic and happens once, however many operators run it at the same moment:

1. With a mirror row, one Postgres transaction claims it (``replayed_at IS NULL``) and returns
   the turn from ``failed`` to where its persisted state says, with a fresh lease, so that even
   if this process dies before step 2, the scan sends the turn again when the lease expires.
2. A Lua script removes the old id from ``.XQ``/``.XQ.msgs`` and enqueues the message under a
   new ``redis_message_id``, keeping ``message_id``, with ``retries``, ``traceback``,
   ``requeue_timestamp`` and ``eta`` cleared and ``message_timestamp`` set to now (otherwise
   Retries or AgeLimit would dead-letter it again at once). Without a mirror row, the script
   only enqueues if its ``ZREM`` removed the old id, so a second replay is a no-op.

A message whose Redis copy was swept (the 7-day TTL) is replayed from the mirror's payload.

A letter may hold anything (a producer's bug, a hand-made payload): reading never assumes its
shape. One whose payload is not a runnable message (:func:`message_problem`) is marked
``malformed`` with the reason (:mod:`extraction.envelope`); it can be listed, shown and purged,
and replay refuses it.

Over 400 lines but one idea: a dead letter's two copies (Redis and the mirror) read, replayed
and purged together, since replay and purge must keep them in step.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import peewee
import redis

from extraction import deadletter_rows
from extraction.envelope import MALFORMED, decode_problem, message_problem, salvage
from extraction.queues import NAMESPACE, dead_key, queue_key

# KEYS: xq, xq.msgs, queue, queue.msgs  ARGV: old id, new id, payload, only-if-present flag
_MOVE = """
local removed = redis.call('zrem', KEYS[1], ARGV[1])
if removed == 0 and ARGV[4] == '1' then
    return 0
end
redis.call('hdel', KEYS[2], ARGV[1])
redis.call('hset', KEYS[4], ARGV[2], ARGV[3])
redis.call('rpush', KEYS[3], ARGV[2])
return 1
"""


@dataclass(frozen=True)
class DeadLetter:
    """One dead message, as an operator sees it."""

    redis_message_id: str
    message_id: str
    queue: str
    actor: str
    payload: dict[str, Any]
    failed_at: dt.datetime
    attempts: int
    exception_type: str | None = None
    exception_message: str | None = None
    traceback: str | None = None
    mirror_id: int | None = None
    in_redis: bool = False
    org_id: str | None = None
    session_id: str | None = None
    turn_index: int | None = None
    ordinal: int | None = None
    #: Why the payload is not a runnable message (it cannot be replayed), or None.
    malformed: str | None = None

    @property
    def ref(self) -> str:
        """The short id operators type: the mirror id, else the Redis message id."""
        return str(self.mirror_id) if self.mirror_id is not None else self.redis_message_id

    @property
    def slot(self) -> str:
        parts = [self.org_id or "-", self.session_id or "-"]
        if self.turn_index is not None:
            parts.append(str(self.turn_index))
        if self.ordinal is not None:
            parts.append(str(self.ordinal))
        return "/".join(parts)

    def as_json(self, *, full: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.ref,
            "redis_message_id": self.redis_message_id,
            "message_id": self.message_id,
            "queue": self.queue,
            "actor": self.actor,
            "org_id": self.org_id,
            "session_id": self.session_id,
            "turn_index": self.turn_index,
            "ordinal": self.ordinal,
            "failed_at": self.failed_at.isoformat(),
            "attempts": self.attempts,
            "exception_type": self.exception_type,
            "exception_message": self.exception_message,
            "in_redis": self.in_redis,
            "in_mirror": self.mirror_id is not None,
            "malformed": self.malformed,
        }
        if full:
            out["payload"] = self.payload
            out["traceback"] = self.traceback
        return out


@dataclass
class ReplayReport:
    replayed: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    #: (ref, reason) of malformed letters, which are never sent again.
    refused: list[tuple[str, str]] = field(default_factory=list)

    def summary(self, *, dry_run: bool = False) -> str:
        verb = "would replay" if dry_run else "replayed"
        text = (
            f"{verb} {len(self.replayed)}, already replayed {len(self.already)},"
            f" not found {len(self.missing)}"
        )
        return text + (f", refused {len(self.refused)} malformed" if self.refused else "")


def _identity(payload: Any) -> dict[str, Any]:
    """The slot identity carried in a pipeline message's kwargs (or positional args); None for
    whatever a malformed payload does not carry."""
    names = ("org_id", "session_id", "turn_index", "ordinal")
    payload = payload if isinstance(payload, dict) else {}
    given_kwargs, given_args = payload.get("kwargs"), payload.get("args")
    kwargs = dict(given_kwargs) if isinstance(given_kwargs, dict) else {}
    args = given_args if isinstance(given_args, list) else []
    for name, value in zip(names, args, strict=False):
        kwargs.setdefault(name, value)
    out: dict[str, Any] = {}
    for name in names:
        value = kwargs.get(name)
        if name in ("turn_index", "ordinal"):
            out[name] = value if isinstance(value, int) and not isinstance(value, bool) else None
        else:
            out[name] = str(value) if isinstance(value, str) and value else None
    return out


def canonical_queue(name: str) -> str:
    return name[:-3] if name.endswith(".DQ") else name


def fresh_payload(payload: dict[str, Any], new_redis_id: str, now_ms: int) -> dict[str, Any]:
    """The message as it should be enqueued again: same message_id, attempts forgotten; its
    other options (the trace context among them: the replay joins its trace) kept."""
    options = dict(payload.get("options") or {})
    for key in ("traceback", "requeue_timestamp", "eta"):
        options.pop(key, None)
    options["retries"] = 0
    options["redis_message_id"] = new_redis_id
    fresh = dict(payload)
    fresh["options"] = options
    fresh["queue_name"] = canonical_queue(str(payload.get("queue_name", "default")))
    fresh["message_timestamp"] = now_ms
    return fresh


class DeadLetterStore:
    """List, show, replay and purge dead letters across Redis and the Postgres mirror."""

    def __init__(
        self,
        db: peewee.Database,
        client: redis.Redis,
        *,
        namespace: str = NAMESPACE,
        lease_seconds: int = 300,
    ) -> None:
        self.db = db
        self.redis = client
        self.namespace = namespace
        self.lease_seconds = lease_seconds
        self._move = client.register_script(_MOVE)

    # -- keys ------------------------------------------------------------------------------

    def _xq(self, queue: str) -> str:
        return dead_key(queue, self.namespace)

    def redis_queues(self) -> list[str]:
        """Queues that have a dead-letter set in Redis."""
        prefix, suffix = f"{self.namespace}:", ".XQ"
        names = set()
        for key in self.redis.scan_iter(match=f"{prefix}*{suffix}", count=500):
            text = key.decode() if isinstance(key, bytes) else key
            names.add(text[len(prefix) : -len(suffix)])
        return sorted(names)

    # -- reading ---------------------------------------------------------------------------

    def _from_mirror(self, row: tuple[Any, ...], in_redis: bool) -> DeadLetter:
        (
            mid,
            rid,
            msg_id,
            queue,
            actor,
            payload,
            failed_at,
            attempts,
            etype,
            emsg,
            tb,
            org,
            session,
            turn,
            ordinal,
        ) = row
        if isinstance(payload, str):
            payload, _ = decode_problem(payload)
        malformed = emsg or MALFORMED if etype == MALFORMED else message_problem(payload)
        return DeadLetter(
            redis_message_id=rid,
            message_id=msg_id,
            queue=queue,
            actor=actor,
            payload=payload,
            failed_at=failed_at,
            attempts=attempts,
            exception_type=etype,
            exception_message=emsg,
            traceback=tb,
            mirror_id=mid,
            in_redis=in_redis,
            org_id=str(org) if org else None,
            session_id=str(session) if session else None,
            turn_index=turn,
            ordinal=ordinal,
            malformed=malformed,
        )

    def _from_redis(self, queue: str, redis_id: str, score: float, raw: bytes) -> DeadLetter:
        decoded, malformed = decode_problem(raw)
        if malformed is not None:
            # Whatever it holds, show it as it is: the fields are read only where they are
            # of the right type.
            fields, payload, message_id, actor = salvage(decoded, raw)
            return DeadLetter(
                redis_message_id=redis_id,
                message_id=message_id if isinstance(message_id, str) else "",
                queue=queue,
                actor=actor if isinstance(actor, str) else "",
                payload=payload,
                failed_at=dt.datetime.fromtimestamp(score / 1000, tz=dt.UTC),
                attempts=1,
                exception_type=MALFORMED,
                exception_message=malformed,
                in_redis=True,
                malformed=malformed,
                **_identity(fields),
            )
        payload = decoded
        options = payload["options"]
        tb = options.get("traceback")
        last_line = tb.strip().splitlines()[-1] if isinstance(tb, str) and tb.strip() else None
        etype, _, emsg = (last_line or "").partition(": ")
        return DeadLetter(
            redis_message_id=redis_id,
            message_id=payload["message_id"],
            queue=queue,
            actor=payload["actor_name"],
            payload=payload,
            failed_at=dt.datetime.fromtimestamp(score / 1000, tz=dt.UTC),
            attempts=int(options.get("retries") or 0) + 1,
            exception_type=etype or None,
            exception_message=emsg or None,
            traceback=tb,
            in_redis=True,
            **_identity(payload),
        )

    def _redis_entries(self, queue: str) -> list[tuple[str, float, bytes]]:
        ids: Any = self.redis.zrange(self._xq(queue), 0, -1, withscores=True)
        if not ids:
            return []
        keys = [i.decode() if isinstance(i, bytes) else i for i, _ in ids]
        payloads: Any = self.redis.hmget(self._xq(queue) + ".msgs", keys)
        return [
            (key, score, raw)
            for key, (_, score), raw in zip(keys, ids, payloads, strict=True)
            if raw is not None
        ]

    def list(self, *, queue: str | None = None, actor: str | None = None) -> list[DeadLetter]:
        """Open dead letters (not replayed, not purged), oldest first."""
        letters: dict[str, DeadLetter] = {}
        redis_ids: dict[str, tuple[str, float, bytes]] = {}
        for q in self.redis_queues():
            for key, score, raw in self._redis_entries(q):
                redis_ids[key] = (q, score, raw)
        for row in deadletter_rows.open_rows(self.db):
            letter = self._from_mirror(row, in_redis=row[1] in redis_ids)
            letters[letter.redis_message_id] = letter
        for key, (q, score, raw) in redis_ids.items():
            if key not in letters:
                letters[key] = self._from_redis(q, key, score, raw)
        out = [
            letter
            for letter in letters.values()
            if (queue is None or letter.queue == queue) and (actor is None or letter.actor == actor)
        ]
        out.sort(key=lambda letter: (letter.failed_at, letter.ref))
        return out

    def get(self, ref: str) -> DeadLetter | None:
        """A letter by mirror id, Redis message id or message id."""
        for letter in self.list():
            if ref in (letter.ref, letter.redis_message_id, letter.message_id):
                return letter
        return None

    # -- replay ----------------------------------------------------------------------------

    def replay(
        self,
        refs: Iterable[str],
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> ReplayReport:
        report = ReplayReport()
        open_letters = {letter.ref: letter for letter in self.list()}
        by_any: dict[str, DeadLetter] = {}
        for letter in open_letters.values():
            for key in (letter.ref, letter.redis_message_id, letter.message_id):
                by_any.setdefault(key, letter)
        for done, ref in enumerate(refs, start=1):
            found = by_any.get(ref)
            if found is None:
                (report.already if self._was_replayed(ref) else report.missing).append(ref)
            elif found.malformed is not None:
                report.refused.append((found.ref, found.malformed))
            elif dry_run or self._replay_one(found):
                report.replayed.append(found.ref)
            else:
                report.already.append(found.ref)
            if progress is not None:
                progress(done)
        return report

    def _was_replayed(self, ref: str) -> bool:
        return deadletter_rows.was_replayed(self.db, ref)

    def _replay_one(self, letter: DeadLetter) -> bool:
        new_id = str(uuid.uuid4())
        if letter.mirror_id is not None and not self._claim(letter, new_id):
            return False
        raw: Any = self.redis.hget(self._xq(letter.queue) + ".msgs", letter.redis_message_id)
        payload = letter.payload
        if raw is not None:
            decoded, problem = decode_problem(raw)
            payload = decoded if problem is None else payload
        fresh = fresh_payload(payload, new_id, int(time.time() * 1000))
        queue = fresh["queue_name"]
        moved = self._move(
            keys=[
                self._xq(letter.queue),
                self._xq(letter.queue) + ".msgs",
                queue_key(queue, self.namespace),
                queue_key(queue, self.namespace) + ".msgs",
            ],
            args=[
                letter.redis_message_id,
                new_id,
                json.dumps(fresh, separators=(",", ":")),
                "0" if letter.mirror_id is not None else "1",
            ],
        )
        return bool(moved)

    def _claim(self, letter: DeadLetter, new_id: str) -> bool:
        """Mark the mirror row replayed and un-fail its turn, in one transaction."""
        assert letter.mirror_id is not None
        return deadletter_rows.claim_replay(
            self.db,
            letter.mirror_id,
            new_id,
            org_id=letter.org_id,
            session_id=letter.session_id,
            turn_index=letter.turn_index,
            lease_seconds=self.lease_seconds,
        )

    # -- purge -----------------------------------------------------------------------------

    def purge(self, *, queue: str | None = None, older_than: dt.timedelta | None = None) -> int:
        """Delete open dead letters (Redis and mirror); return how many were purged."""
        cutoff = dt.datetime.now(dt.UTC) - older_than if older_than else None
        purged = 0
        for letter in self.list(queue=queue):
            if cutoff is not None and letter.failed_at > cutoff:
                continue
            self._purge_one(letter)
            purged += 1
        return purged

    def discard(self, ref: str) -> bool:
        """Delete one open dead letter (Redis and mirror), by any of its ids; False when there
        is no open letter by that id (already replayed or discarded)."""
        letter = self.get(ref)
        if letter is None:
            return False
        self._purge_one(letter)
        return True

    def _purge_one(self, letter: DeadLetter) -> None:
        pipe = self.redis.pipeline()
        pipe.zrem(self._xq(letter.queue), letter.redis_message_id)
        pipe.hdel(self._xq(letter.queue) + ".msgs", letter.redis_message_id)
        pipe.execute()
        if letter.mirror_id is not None:
            deadletter_rows.mark_purged(self.db, letter.mirror_id)
