"""Recording a chat call as a session's turn: the spooled message, and storing it.

The proxy never writes the session store on the chat path. When the answer is in, it puts one
message on the spool: a Dramatiq message to the ``record_chat_turn`` actor on the
``chat_turns`` queue (:class:`DramatiqSpool`), which the Redis broker writes with one
command. The worker drains it with :func:`store_chat_turn`, retried with backoff while the
database is away and dead-lettered like any message when it cannot be stored. So an outage
of Postgres delays the turn, never the answer.

Storing is safe to repeat: the turn is computed from the session's stored conversation
(:func:`proxy.conversation.plan_turn`), so a redelivered message, a retried chat call or a late
copy of an earlier call stores nothing, and two messages of one session stored at once are
settled by the store's turn check (the loser recomputes).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import peewee

from core.errors import ImmutableTurnError, PermanentError, TransientError, TurnGapError
from memory_service.auth import AuthError, Principal, require_scope, resolve_org
from memory_service.tokens.store import TokenStore
from models.store import SessionStore, TurnInput
from proxy.conversation import StoredTurn, answers_in, plan_turn
from schema.messages import CHAT_TURNS_QUEUE

log = logging.getLogger(__name__)

SPOOL_QUEUE = CHAT_TURNS_QUEUE
SPOOL_ACTOR = "record_chat_turn"
#: How often storing recomputes the turn when another message of the session won the race.
STORE_ATTEMPTS = 5


@dataclass(frozen=True)
class Recording:
    """Who a call is recorded for: the org when the proxy could authenticate the token, else
    the token's hash (and the org header) for the worker to check."""

    agent: str
    external_id: str
    user: str | None
    org_id: uuid.UUID | None
    token_hash: str | None
    org_header: str | None
    #: A user-bound token's user: it is the session's user, whatever ``user`` says.
    user_id: uuid.UUID | None = None


def spool_message(
    recording: Recording,
    *,
    request_hash: str,
    model: str | None,
    messages: list[Any],
    completion: dict[str, Any],
    prompt_tokens: int,
    completion_tokens: int,
    latency_ms: int,
    is_streaming: bool,
    is_complete: bool,
) -> dict[str, Any]:
    """The spooled turn: plain JSON, everything the worker needs and never the token itself."""
    return {
        "version": 1,
        "org_id": str(recording.org_id) if recording.org_id else None,
        "token_hash": recording.token_hash,
        "org_header": recording.org_header,
        "agent": recording.agent,
        "external_id": recording.external_id,
        "user": recording.user,
        "user_id": str(recording.user_id) if recording.user_id else None,
        "model": model,
        "request_hash": request_hash,
        "messages": messages,
        "completion": completion,
        "prompt_tokens": max(0, int(prompt_tokens)),
        "completion_tokens": max(0, int(completion_tokens)),
        "latency_ms": max(0, int(latency_ms)),
        "is_streaming": bool(is_streaming),
        "is_complete": bool(is_complete),
    }


class Spool(Protocol):
    def put(self, message: dict[str, Any]) -> None: ...


class DramatiqSpool:
    """Enqueue on the worker's Redis broker (same namespace and queue layout) without
    importing the worker: one ``EVALSHA`` of Dramatiq's enqueue script per turn."""

    def __init__(self, redis_url: str, *, timeout_seconds: float = 1.0) -> None:
        import redis
        from dramatiq.brokers.redis import RedisBroker

        client = redis.Redis.from_url(
            redis_url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds
        )
        self.client = client
        self.broker = RedisBroker(client=client, middleware=[])
        self.broker.declare_queue(SPOOL_QUEUE)

    def put(self, message: dict[str, Any]) -> None:
        import dramatiq

        self.broker.enqueue(
            dramatiq.Message(
                queue_name=SPOOL_QUEUE,
                actor_name=SPOOL_ACTOR,
                args=(message,),
                kwargs={},
                options={},
            )
        )

    def close(self) -> None:
        self.broker.close()
        self.client.close()


class RecordRefused(PermanentError):
    """A spooled turn that can never be stored (bad token, unknown org, deleted session)."""


def _principal(db: peewee.Database, token_hash: str) -> Principal:
    row = TokenStore(db).lookup(token_hash)
    if row is None or row.revoked_at is not None:
        raise RecordRefused("the call's X-IBEX-Token is unknown or revoked")
    return Principal(row.id, row.org_id, frozenset(row.scopes), row.is_service, row.user_id)


def org_of(db: peewee.Database, message: Mapping[str, Any]) -> tuple[uuid.UUID, uuid.UUID | None]:
    """The org a spooled turn is for (named by the proxy, or from the token it carries), and
    the user its token is bound to, if any."""
    if message.get("org_id"):
        bound = message.get("user_id")
        return uuid.UUID(str(message["org_id"])), uuid.UUID(str(bound)) if bound else None
    token_hash = message.get("token_hash")
    if not token_hash:
        raise RecordRefused("the spooled turn names neither an org nor a token")
    principal = _principal(db, str(token_hash))
    try:
        require_scope(principal, "sessions:write")
        return resolve_org(principal, message.get("org_header")), principal.user_id
    except AuthError as exc:
        raise RecordRefused(exc.message) from None


class EarlierTurnPending(TransientError):
    """The turn would be stored whole although it continues a conversation: its predecessor is
    probably still on the spool. Retried (with backoff), then stored as it is."""


def store_chat_turn(
    store: SessionStore, message: Mapping[str, Any], *, first_attempt: bool = False
) -> int | None:
    """Store a spooled turn in the session it names; the turn index it was stored as, or None
    when the session already held it (a retry, a redelivery, a late copy). On the
    ``first_attempt``, a turn that would be stored whole although it holds earlier answers
    raises :class:`EarlierTurnPending` instead (see :mod:`proxy.conversation`)."""
    org_id, bound = org_of(store.db, message)
    sessions = store
    user_id = None
    if bound is not None:
        user_id = sessions.resolve_user(org_id, user_id=bound)
    elif message.get("user"):
        user_id = sessions.resolve_user(org_id, external_id=str(message["user"]))
    session, _ = sessions.open_session(
        org_id,
        agent_slug=str(message["agent"]),
        external_id=str(message["external_id"]),
        model=message.get("model"),
        user_id=user_id,
        # A user-bound token records in its user's sessions only (an agent-wide session of
        # the same external id is not claimable by it).
        claim_shared=bound is None,
    )
    if session.deleted_at is not None:
        raise RecordRefused(f"session {session.id} is deleted")
    for _attempt in range(STORE_ATTEMPTS):
        count = sessions.get_session(org_id, session.id).turn_count
        stored = sessions.read_turns(org_id, session.id, 1, count) if count else []
        plan = plan_turn(
            [StoredTurn(t.messages, t.completion) for t in stored], message["messages"]
        )
        if plan.messages is None:
            return None
        if plan.whole and first_attempt and answers_in(plan.messages):
            raise EarlierTurnPending(
                f"session {session.id}: the call continues a conversation the session does"
                " not hold yet; waiting for its earlier turn"
            )
        turn = TurnInput(
            messages=plan.messages,
            completion=dict(message["completion"]),
            prompt_tokens=int(message["prompt_tokens"]),
            completion_tokens=int(message["completion_tokens"]),
            latency_ms=int(message["latency_ms"]),
            is_streaming=bool(message["is_streaming"]),
            is_complete=bool(message["is_complete"]),
        )
        try:
            result = sessions.append_turns_at(org_id, session.id, count + 1, [turn])
        except (ImmutableTurnError, TurnGapError):
            continue  # another turn of the session landed first: plan again on top of it
        return count + 1 if result.turns_added else None
    raise TransientError(f"session {session.id} kept changing while its turn was stored")
