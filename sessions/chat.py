"""A chat call recorded as its session's turn: the spooled message, and storing it.

The proxy never writes the session store on the chat path. When the answer is in, it puts one
message on the spool (:func:`spool_message` builds it): a Dramatiq message to the
``record_chat_turn`` actor on the ``chat_turns`` queue, which the worker drains with
:func:`store_chat_turn`, retried with backoff while the database is away and dead-lettered
like any message when it cannot be stored. So an outage of Postgres delays the turn, never the
answer.

Storing is safe to repeat: the turn is computed from the session's stored conversation
(:func:`sessions.conversation.plan_turn`), so a redelivered message, a retried chat call or a
late copy of an earlier call stores nothing, and two messages of one session stored at once are
settled by the store's turn check (the loser recomputes).

A spooled turn names its org when the proxy could check the token; else it carries the token's
hash, which the worker checks (the memories domain owns tokens: the worker's actor resolves
the org and passes it in).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.counters import lazy_counter
from core.errors import ImmutableTurnError, PermanentError, TransientError, TurnIndexGapError
from schema.messages import CHAT_TURNS_QUEUE
from sessions.agents import AgentResolver
from sessions.conversation import StoredTurn, answers_in, plan_turn
from sessions.store import SessionStore
from sessions.turns import TurnInput
from sessions.users import UnknownUserError

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
    #: The user named by id (``X-IBEX-User-ID``) rather than by key (``user``).
    named_user_id: uuid.UUID | None = None
    #: The conversation ends with this call: the session is completed once the turn is stored.
    end: bool = False


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
        "named_user_id": str(recording.named_user_id) if recording.named_user_id else None,
        "end": recording.end,
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


class RecordRefused(PermanentError):
    """A spooled turn that can never be stored (bad token, unknown org, deleted session)."""


class EarlierTurnPending(TransientError):
    """The turn would be stored whole although it continues a conversation: its predecessor is
    probably still on the spool. Retried (with backoff), then stored as it is."""


def org_named(message: Mapping[str, Any]) -> tuple[uuid.UUID, uuid.UUID | None] | None:
    """The org a spooled turn names (the proxy checked its token) and the user that token is
    bound to; None when it carries the token's hash instead, for the worker to check."""
    if not message.get("org_id"):
        return None
    bound = message.get("user_id")
    return uuid.UUID(str(message["org_id"])), uuid.UUID(str(bound)) if bound else None


def store_chat_turn(
    store: SessionStore,
    message: Mapping[str, Any],
    *,
    first_attempt: bool = False,
    org: tuple[uuid.UUID, uuid.UUID | None] | None = None,
) -> int | None:
    """Store a spooled turn in the session it names; the turn index it was stored as, or None
    when the session already held it (a retry, a redelivery, a late copy). ``org``: the org
    and the token's bound user, when the message carries a token's hash (else the message's
    own, :func:`org_named`). On the ``first_attempt``, a turn that would be stored whole
    although it holds earlier answers raises :class:`EarlierTurnPending` instead (see
    :mod:`sessions.conversation`)."""
    org = org or org_named(message)
    if org is None:
        raise RecordRefused("the spooled turn names no org, and its token was not checked")
    org_id, bound = org
    sessions = store
    user_id = None
    if bound is not None:
        user_id = sessions.resolve_user(org_id, user_id=bound)
    elif message.get("named_user_id"):
        try:
            user_id = sessions.resolve_user(org_id, user_id=uuid.UUID(message["named_user_id"]))
        except UnknownUserError:
            raise RecordRefused("the call's X-IBEX-User-ID names no user of the org") from None
    elif message.get("user"):
        user_id = sessions.resolve_user(org_id, external_id=str(message["user"]))
    # The proxy refuses an agent the org does not have (404); a turn it could not check (the
    # database was away) is refused here the same way, never creating a misspelt agent.
    agent_id = AgentResolver(sessions.db).find(org_id, slug=str(message["agent"]))
    if agent_id is None:
        raise RecordRefused(f"no agent {message['agent']!r} in the org")
    session, _ = sessions.open_session(
        org_id,
        agent_id=agent_id,
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
            _end(sessions, message, org_id, session.id)
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
        except (ImmutableTurnError, TurnIndexGapError):
            continue  # another turn of the session landed first: plan again on top of it
        _end(sessions, message, org_id, session.id)
        return count + 1 if result.turns_added else None
    raise TransientError(f"session {session.id} kept changing while its turn was stored")


def _end(sessions: SessionStore, message: Mapping[str, Any], org_id: uuid.UUID, sid: Any) -> None:
    """``X-IBEX-Session-End: true``: the turn is stored, the conversation is over."""
    if message.get("end"):
        sessions.complete_session(org_id, sid)


# -- the chat path's turn counter -----------------------------------------------------------

#: ``ibex_chat_turns_total`` by ``outcome``: ``spooled`` (proxy: on the spool), ``recorded``
#: (worker: stored as a new turn), ``replayed`` (worker: the session already held it),
#: ``failed`` (proxy: the spool write failed or the answer could not be read; worker: refused
#: for good). Process-wide, created on first use.
TURN_OUTCOMES = ("spooled", "recorded", "replayed", "failed")

_counter = lazy_counter("ibex_chat_turns_total", "Chat path turns by outcome.", ["outcome"])


def count_turn(outcome: str) -> None:
    assert outcome in TURN_OUTCOMES, outcome
    _counter().labels(outcome).inc()


def turns_counted(outcome: str) -> float:
    """The current value of ``ibex_chat_turns_total{outcome}`` in this process."""
    return float(_counter().labels(outcome)._value.get())
