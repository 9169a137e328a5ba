"""One builder per API call: the request and how its answer is read, for both public clients.

Each builder returns a :class:`~ibex_client._base.Call`; the sync and async clients
only send it. Everything that must be the same on every attempt (the body bytes, the
idempotency key) is fixed here, once per call.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import httpx

from ibex_client._base import IDEMPOTENCY_HEADER, REPLAYED_HEADER, Call, canonical_body
from ibex_client.errors import UnexpectedResponseError
from ibex_client.types import (
    Agent,
    Context,
    ForgottenUser,
    Memory,
    MemorySource,
    Page,
    RecordedTurn,
    SearchHit,
    Session,
    Turn,
    TurnsAppended,
    history_items,
    memory_page,
    search_hits,
    session_page,
    turn_page,
)

Id = uuid.UUID | str


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError):
        raise UnexpectedResponseError(
            f"{response.status_code} answer is not JSON: {response.text[:200]!r}"
        ) from None


def _id(value: Id, what: str) -> str:
    """A UUID in canonical form; also keeps a path segment from being anything but an id."""
    try:
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
    except ValueError:
        raise ValueError(f"{what} must be a UUID, not {value!r}") from None


def _params(**values: object) -> dict[str, str]:
    return {k: str(v) for k, v in values.items() if v is not None}


def _key(idempotency_key: str | None) -> dict[str, str]:
    # Generated once per call, so every retry of this call carries the same key.
    return {IDEMPOTENCY_HEADER: idempotency_key or str(uuid.uuid4())}


@dataclass(frozen=True)
class Who:
    """Whose data a call is about: a user by the application's key (``user``) or id
    (``user_id``); for reads also whether the agent-wide memories come along
    (``include_shared``, the server's default: yes) or every user's (``all_users``, scope
    memory:admin). All None: the server's defaults (no user: agent-wide only)."""

    user: str | None = None
    user_id: Id | None = None
    include_shared: bool | None = None
    all_users: bool | None = None

    def fields(self) -> dict[str, Any]:
        """As JSON body fields (only those given)."""
        if self.user is not None and self.user_id is not None:
            raise ValueError("give user or user_id, not both")
        out: dict[str, Any] = {}
        if self.user is not None:
            out["user"] = self.user
        if self.user_id is not None:
            out["user_id"] = _id(self.user_id, "user_id")
        if self.include_shared is not None:
            out["include_shared"] = self.include_shared
        if self.all_users is not None:
            out["all_users"] = self.all_users
        return out

    def params(self) -> dict[str, str]:
        """As query parameters (booleans as ``true``/``false``)."""
        return {
            k: (("true" if v else "false") if isinstance(v, bool) else str(v))
            for k, v in self.fields().items()
        }


NOBODY = Who()


def _session(response: httpx.Response) -> Session:
    return Session.from_json(_json(response))


def _deleted(response: httpx.Response) -> bool:
    return True


def _gone() -> bool:
    return False


def _agent(agent: str | None, agent_id: Id | None) -> dict[str, Any]:
    """The body's agent: by slug (``agent``) or by id, exactly one."""
    if (agent is None) == (agent_id is None):
        raise ValueError("give exactly one of agent (a slug) and agent_id")
    if agent is not None:
        return {"agent": agent}
    assert agent_id is not None
    return {"agent_id": _id(agent_id, "agent_id")}


# -- sessions --------------------------------------------------------------------------------


def create_session(
    agent: str | None,
    agent_id: Id | None,
    external_id: str | None,
    model: str | None,
    provider: str | None,
    create_agent: bool = False,
    who: Who = NOBODY,
) -> Call[Session]:
    body = _agent(agent, agent_id)
    if create_agent:
        if agent is None:
            raise ValueError("create_agent needs agent (a slug)")
        body["create_agent"] = True
    for name, value in (("external_id", external_id), ("model", model), ("provider", provider)):
        if value is not None:
            body[name] = value
    body.update(who.fields())
    # The external id is what makes a repeat find the session the first attempt opened; without
    # one, every request that reaches the server opens a new session, so only a request that
    # never reached it may be sent again.
    return Call(
        "POST",
        "/v1/sessions",
        _session,
        body=canonical_body(body),
        repeatable=external_id is not None,
    )


def append_turns(session_id: Id, turns: Sequence[Turn]) -> Call[TurnsAppended]:
    if not turns:
        raise ValueError("give at least one turn")
    body = {"turns": [t.as_json() for t in turns]}
    return Call(
        "POST",
        f"/v1/sessions/{_id(session_id, 'session_id')}/turns",
        lambda r: TurnsAppended.from_json(_json(r)),
        body=canonical_body(body),
    )


def change_status(session_id: Id, action: str) -> Call[Session]:
    return Call("POST", f"/v1/sessions/{_id(session_id, 'session_id')}/{action}", _session)


def get_session(session_id: Id) -> Call[Session]:
    return Call("GET", f"/v1/sessions/{_id(session_id, 'session_id')}", _session)


def list_sessions(
    agent_id: Id | None,
    external_id: str | None,
    status: str | None,
    limit: int | None,
    cursor: str | None,
) -> Call[Page[Session]]:
    params = _params(
        agent_id=None if agent_id is None else _id(agent_id, "agent_id"),
        external_id=external_id,
        status=status,
        limit=limit,
        cursor=cursor,
    )
    return Call("GET", "/v1/sessions", lambda r: session_page(_json(r)), params=params)


def list_turns(session_id: Id, limit: int | None, cursor: str | None) -> Call[Page[RecordedTurn]]:
    return Call(
        "GET",
        f"/v1/sessions/{_id(session_id, 'session_id')}/turns",
        lambda r: turn_page(_json(r)),
        params=_params(limit=limit, cursor=cursor),
    )


def delete_session(session_id: Id) -> Call[bool]:
    return Call("DELETE", f"/v1/sessions/{_id(session_id, 'session_id')}", _deleted, on_404=_gone)


# -- memories --------------------------------------------------------------------------------


def create_memory(
    agent_id: Id,
    content: str,
    kind: str,
    source: MemorySource | None,
    metadata: Mapping[str, Any] | None,
    idempotency_key: str | None,
    supersedes: Sequence[Id] | None = None,
    who: Who = NOBODY,
) -> Call[Memory]:
    body: dict[str, Any] = {
        "agent_id": _id(agent_id, "agent_id"),
        "content": content,
        "kind": kind,
        "source": None if source is None else source.as_json(),
        "metadata": dict(metadata or {}),
        **who.fields(),
    }
    if supersedes:  # only when given: the body (and its fingerprint) is otherwise unchanged
        body["supersedes"] = [_id(i, "supersedes") for i in supersedes]
    return Call(
        "POST",
        "/v1/memories",
        _created,
        body=canonical_body(body),
        headers=_key(idempotency_key),
    )


def _created(response: httpx.Response) -> Memory:
    memory = Memory.from_json(_json(response))
    return replace(memory, replayed=response.headers.get(REPLAYED_HEADER) == "true")


def get_memory(memory_id: Id, who: Who = NOBODY) -> Call[Memory]:
    return Call(
        "GET",
        f"/v1/memories/{_id(memory_id, 'memory_id')}",
        lambda r: Memory.from_json(_json(r)),
        params=who.params(),
    )


def list_memories(
    agent_id: Id | None,
    session_id: Id | None,
    limit: int | None,
    cursor: str | None,
    include_superseded: bool = False,
    who: Who = NOBODY,
) -> Call[Page[Memory]]:
    params = _params(
        agent_id=None if agent_id is None else _id(agent_id, "agent_id"),
        session_id=None if session_id is None else _id(session_id, "session_id"),
        limit=limit,
        cursor=cursor,
        include_superseded="true" if include_superseded else None,
    )
    params.update(who.params())
    return Call("GET", "/v1/memories", lambda r: memory_page(_json(r)), params=params)


def memory_history(memory_id: Id, who: Who = NOBODY) -> Call[tuple[Memory, ...]]:
    return Call(
        "GET",
        f"/v1/memories/{_id(memory_id, 'memory_id')}/history",
        lambda r: history_items(_json(r)),
        params=who.params(),
    )


def delete_memory(memory_id: Id, who: Who = NOBODY) -> Call[bool]:
    return Call(
        "DELETE",
        f"/v1/memories/{_id(memory_id, 'memory_id')}",
        _deleted,
        on_404=_gone,
        params=who.params(),
    )


# -- read path -------------------------------------------------------------------------------


def search(
    query: str,
    agent_id: Id | None,
    session_id: Id | None,
    kinds: Sequence[str] | None,
    limit: int | None,
    include_superseded: bool = False,
    agent: str | None = None,
    who: Who = NOBODY,
    min_score: float | None = None,
) -> Call[tuple[SearchHit, ...]]:
    body: dict[str, Any] = {"query": query, **_agent(agent, agent_id)}
    if include_superseded:
        body["include_superseded"] = True
    if min_score is not None:
        body["min_score"] = min_score
    body.update(who.fields())
    if session_id is not None:
        body["session_id"] = _id(session_id, "session_id")
    if kinds is not None:
        body["kinds"] = list(kinds)
    if limit is not None:
        body["limit"] = limit
    return Call(
        "POST", "/v1/memories/search", lambda r: search_hits(_json(r)), body=canonical_body(body)
    )


def context(
    agent_id: Id | None,
    query: str | None,
    messages: Sequence[Mapping[str, Any]] | None,
    session_id: Id | None,
    kinds: Sequence[str] | None,
    max_tokens: int | None,
    include_superseded: bool = False,
    agent: str | None = None,
    who: Who = NOBODY,
) -> Call[Context]:
    if (query is None) == (messages is None):
        raise ValueError("give exactly one of query and messages")
    body = _agent(agent, agent_id)
    if include_superseded:
        body["include_superseded"] = True
    body.update(who.fields())
    if query is not None:
        body["query"] = query
    else:
        assert messages is not None
        body["messages"] = [dict(m) for m in messages]
    if session_id is not None:
        body["session_id"] = _id(session_id, "session_id")
    if kinds is not None:
        body["kinds"] = list(kinds)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return Call(
        "POST", "/v1/context", lambda r: Context.from_json(_json(r)), body=canonical_body(body)
    )


# -- users -----------------------------------------------------------------------------------


def get_agent(agent: str | Id) -> Call[Agent]:
    """``GET /v1/agents/{agent}``: the org's agent by slug or id."""
    name = str(agent)
    if not name:
        raise ValueError("name the agent")
    return Call("GET", f"/v1/agents/{quote(name, safe='')}", lambda r: Agent.from_json(_json(r)))


def forget_user(user: str | Id) -> Call[ForgottenUser | None]:
    """``DELETE /v1/users/{user}``: by the application's key or by id. None on 404 (no such
    user, including when an earlier attempt of this call forgot them)."""
    key = str(user)
    if not key:
        raise ValueError("name the user to forget")
    return Call(
        "DELETE",
        f"/v1/users/{quote(key, safe='')}",
        lambda r: ForgottenUser.from_json(_json(r)),
        on_404=lambda: None,
    )
