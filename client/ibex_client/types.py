"""The values the public clients send and return: frozen dataclasses parsed from the JSON.

Parsing is strict about the fields the API documents (a missing or mistyped one raises
:class:`~ibex_client.errors.UnexpectedResponseError`) and ignores any other field, so
a newer server's additions do not break an older client.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from ibex_client.errors import UnexpectedResponseError

T = TypeVar("T")

#: ``kind`` of a memory.
MEMORY_KINDS = ("fact", "preference", "event", "other")
#: ``status`` of a session.
SESSION_STATUSES = ("active", "completed", "abandoned", "error")


# -- parsing helpers -----------------------------------------------------------------------


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise UnexpectedResponseError(f"{what}: expected a JSON object")
    return value


def _req(data: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in data:
        raise UnexpectedResponseError(f"{what}: missing {key!r}")
    return data[key]


def _uuid(value: Any, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise UnexpectedResponseError(f"{what}: not a UUID: {value!r}") from None


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise UnexpectedResponseError(f"{what}: expected a string")
    return value


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnexpectedResponseError(f"{what}: expected an integer")
    return value


def _float(value: Any, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise UnexpectedResponseError(f"{what}: expected a number")
    return float(value)


def _time(value: Any, what: str) -> datetime:
    try:
        return datetime.fromisoformat(_str(value, what))
    except ValueError:
        raise UnexpectedResponseError(f"{what}: not an ISO 8601 time: {value!r}") from None


def _opt_time(value: Any, what: str) -> datetime | None:
    return None if value is None else _time(value, what)


def _opt_uuid(value: Any, what: str) -> uuid.UUID | None:
    return None if value is None else _uuid(value, what)


# -- memories --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemorySource:
    """Where a memory was extracted from."""

    session_id: uuid.UUID
    turn_index: int | None = None
    ordinal: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "session_id": str(self.session_id),
            "turn_index": self.turn_index,
            "ordinal": self.ordinal,
        }

    @classmethod
    def from_json(cls, value: Any) -> MemorySource:
        data = _obj(value, "source")
        turn = data.get("turn_index")
        ordinal = data.get("ordinal")
        return cls(
            session_id=_uuid(_req(data, "session_id", "source"), "source.session_id"),
            turn_index=None if turn is None else _int(turn, "source.turn_index"),
            ordinal=None if ordinal is None else _int(ordinal, "source.ordinal"),
        )


@dataclass(frozen=True)
class Memory:
    """A stored memory."""

    id: uuid.UUID
    org_id: uuid.UUID
    agent_id: uuid.UUID
    content: str
    content_hash: str
    kind: str
    source: MemorySource | None
    metadata: Mapping[str, Any]
    created_at: datetime
    #: Supersession: since when the fact holds, and what replaced it (None: current). None
    #: as well from a server that predates supersession.
    valid_from: datetime | None = None
    superseded_by: uuid.UUID | None = None
    superseded_at: datetime | None = None
    #: Whose memory it is; None: agent-wide (shared by everyone the agent talks to).
    user_id: uuid.UUID | None = None
    #: On the answer to a create: True when the service replayed an earlier request with the
    #: same idempotency key (``Idempotent-Replayed``) instead of storing anew. Not part of
    #: equality: it describes the answer, not the memory.
    replayed: bool = field(default=False, compare=False)

    @property
    def current(self) -> bool:
        """True unless a newer memory superseded this one."""
        return self.superseded_by is None

    @classmethod
    def from_json(cls, value: Any) -> Memory:
        data = _obj(value, "memory")
        source = data.get("source")
        metadata = data.get("metadata")
        return cls(
            id=_uuid(_req(data, "id", "memory"), "memory.id"),
            org_id=_uuid(_req(data, "org_id", "memory"), "memory.org_id"),
            agent_id=_uuid(_req(data, "agent_id", "memory"), "memory.agent_id"),
            content=_str(_req(data, "content", "memory"), "memory.content"),
            content_hash=_str(_req(data, "content_hash", "memory"), "memory.content_hash"),
            kind=_str(_req(data, "kind", "memory"), "memory.kind"),
            source=None if source is None else MemorySource.from_json(source),
            metadata=dict(_obj(metadata, "memory.metadata")) if metadata is not None else {},
            created_at=_time(_req(data, "created_at", "memory"), "memory.created_at"),
            valid_from=_opt_time(data.get("valid_from"), "memory.valid_from"),
            superseded_by=None
            if data.get("superseded_by") is None
            else _uuid(data["superseded_by"], "memory.superseded_by"),
            superseded_at=_opt_time(data.get("superseded_at"), "memory.superseded_at"),
            user_id=_opt_uuid(data.get("user_id"), "memory.user_id"),
        )


@dataclass(frozen=True)
class Signals:
    """The per-signal scores behind a hit's ``score``, each in [0, 1], higher is better:
    full-text rank (``text``), trigram similarity (``trigram``, 0 where the server has no
    pg_trgm), ``recency`` (1 / (1 + age in days / 30), which breaks ties) and ``semantic``
    (cosine similarity to the query, clipped to [0, 1]; None when the server had no vector
    for the query or the memory)."""

    text: float
    trigram: float
    recency: float
    semantic: float | None = None


@dataclass(frozen=True)
class SearchHit:
    """A memory that matched a search, with why: the fused ``score`` (in [0, 1], higher is
    better), its ``signals`` and the content with the matched words in ``<mark>`` tags."""

    memory: Memory
    score: float
    signals: Signals
    snippet: str

    @classmethod
    def from_json(cls, value: Any) -> SearchHit:
        data = _obj(value, "search hit")
        signals = _obj(_req(data, "signals", "search hit"), "signals")
        return cls(
            memory=Memory.from_json(data),
            score=_float(_req(data, "score", "search hit"), "score"),
            signals=Signals(
                text=_float(_req(signals, "text", "signals"), "signals.text"),
                trigram=_float(_req(signals, "trigram", "signals"), "signals.trigram"),
                recency=_float(_req(signals, "recency", "signals"), "signals.recency"),
                semantic=None
                if signals.get("semantic") is None
                else _float(signals["semantic"], "signals.semantic"),
            ),
            snippet=_str(_req(data, "snippet", "search hit"), "snippet"),
        )


@dataclass(frozen=True)
class Context:
    """Memories packed into a token budget: ``context`` is the ``<memories>`` block to put in a
    system prompt ("" when nothing fits or matches), ``memories`` the packed hits in the
    block's order, ``tokens`` its estimated size and ``dropped`` the matches left out."""

    context: str
    memories: tuple[SearchHit, ...]
    tokens: int
    dropped: int

    def __str__(self) -> str:
        return self.context

    @classmethod
    def from_json(cls, value: Any) -> Context:
        data = _obj(value, "context")
        hits = _req(data, "memories", "context")
        if not isinstance(hits, list):
            raise UnexpectedResponseError("context.memories: expected a list")
        return cls(
            context=_str(_req(data, "context", "context"), "context.context"),
            memories=tuple(SearchHit.from_json(h) for h in hits),
            tokens=_int(_req(data, "tokens", "context"), "context.tokens"),
            dropped=_int(_req(data, "dropped", "context"), "context.dropped"),
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list, and the cursor of the next one (None on the last page). Iterating
    a page yields its items (``for s in client.list_sessions(): ...``), ``len`` counts them;
    ``iter_sessions``/``iter_memories`` go on through the next pages."""

    items: tuple[T, ...]
    next_cursor: str | None

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _page(value: Any, item: Callable[[Any], T]) -> Page[T]:
    """A page answer of any list route, each item read by ``item``."""
    data = _obj(value, "page")
    items = _req(data, "items", "page")
    if not isinstance(items, list):
        raise UnexpectedResponseError("page.items: expected a list")
    cursor = data.get("next_cursor")
    return Page(
        items=tuple(item(i) for i in items),
        next_cursor=None if cursor is None else _str(cursor, "page.next_cursor"),
    )


def memory_page(value: Any) -> Page[Memory]:
    return _page(value, Memory.from_json)


def history_items(value: Any) -> tuple[Memory, ...]:
    """``GET /v1/memories/{id}/history``: the chain, oldest first."""
    items = _req(_obj(value, "memory history"), "items", "memory history")
    if not isinstance(items, list):
        raise UnexpectedResponseError("memory history.items: expected a list")
    return tuple(Memory.from_json(m) for m in items)


def search_hits(value: Any) -> tuple[SearchHit, ...]:
    items = _req(_obj(value, "search result"), "items", "search result")
    if not isinstance(items, list):
        raise UnexpectedResponseError("search result.items: expected a list")
    return tuple(SearchHit.from_json(h) for h in items)


# -- sessions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One LLM call of a conversation, to append to a session.

    ``turn_index`` (1 for the first turn) is what makes appending safe to repeat: a turn
    already stored with the same content is not stored again.
    """

    turn_index: int
    messages: Sequence[Mapping[str, Any]]
    completion: Mapping[str, Any] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: int | None = None
    is_streaming: bool = False
    is_complete: bool = True

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "turn_index": self.turn_index,
            "messages": [dict(m) for m in self.messages],
            "completion": None if self.completion is None else dict(self.completion),
            "is_streaming": self.is_streaming,
            "is_complete": self.is_complete,
        }
        for name in ("prompt_tokens", "completion_tokens", "latency_ms"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


def _opt_str(data: Mapping[str, Any], key: str, what: str) -> str | None:
    value = _req(data, key, what)
    return None if value is None else _str(value, f"{what}.{key}")


def _req_int(data: Mapping[str, Any], key: str, what: str) -> int:
    return _int(_req(data, key, what), f"{what}.{key}")


@dataclass(frozen=True)
class Progress:
    """How far extraction has got through a session's turns: ``done`` (extracted),
    ``pending`` (not yet extracted, nor failed), ``failed`` (dead-lettered: the pointer waits
    until an operator replays them) and ``pointer`` (every turn up to it is extracted)."""

    done: int
    pending: int
    failed: int
    pointer: int

    @classmethod
    def from_json(cls, value: Any) -> Progress:
        data = _obj(value, "session.progress")
        what = "session.progress"
        return cls(
            done=_req_int(data, "done", what),
            pending=_req_int(data, "pending", what),
            failed=_req_int(data, "failed", what),
            pointer=_req_int(data, "pointer", what),
        )


@dataclass(frozen=True)
class Session:
    """A conversation and how far extraction has got through it.

    ``last_extracted_turn`` is the pointer: every turn up to it is extracted. ``progress``
    counts the stored turns by extraction state (``done + pending + failed == turn_count``).
    """

    id: uuid.UUID
    org_id: uuid.UUID
    agent_id: uuid.UUID
    external_id: str | None
    status: str
    model: str | None
    provider: str | None
    turn_count: int
    last_extracted_turn: int
    prompt_tokens: int
    completion_tokens: int
    progress: Progress
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    #: Whose conversation; None: agent-wide. Set once.
    user_id: uuid.UUID | None = None

    @property
    def extracted(self) -> bool:
        """Whether every turn stored so far has been extracted."""
        return self.last_extracted_turn >= self.turn_count

    @classmethod
    def from_json(cls, value: Any) -> Session:
        data = _obj(value, "session")
        what = "session"
        return cls(
            id=_uuid(_req(data, "id", what), "session.id"),
            org_id=_uuid(_req(data, "org_id", what), "session.org_id"),
            agent_id=_uuid(_req(data, "agent_id", what), "session.agent_id"),
            external_id=_opt_str(data, "external_id", what),
            status=_str(_req(data, "status", what), "session.status"),
            model=_opt_str(data, "model", what),
            provider=_opt_str(data, "provider", what),
            turn_count=_req_int(data, "turn_count", what),
            last_extracted_turn=_req_int(data, "last_extracted_turn", what),
            prompt_tokens=_req_int(data, "prompt_tokens", what),
            completion_tokens=_req_int(data, "completion_tokens", what),
            progress=Progress.from_json(_req(data, "progress", what)),
            created_at=_time(_req(data, "created_at", what), "session.created_at"),
            updated_at=_time(_req(data, "updated_at", what), "session.updated_at"),
            completed_at=_opt_time(_req(data, "completed_at", what), "session.completed_at"),
            user_id=_opt_uuid(data.get("user_id"), "session.user_id"),
        )


@dataclass(frozen=True)
class TurnsAppended:
    """The answer to appending turns: the session after the append, and how many turns were
    stored by it (0 when every turn was already stored: a replay, nothing written)."""

    session: Session
    turns_added: int

    @property
    def replayed(self) -> bool:
        return self.turns_added == 0

    @classmethod
    def from_json(cls, value: Any) -> TurnsAppended:
        data = _obj(value, "turns appended")
        return cls(
            session=Session.from_json(_req(data, "session", "turns appended")),
            turns_added=_req_int(data, "turns_added", "turns appended"),
        )


def session_page(value: Any) -> Page[Session]:
    return _page(value, Session.from_json)


#: A turn's extraction state, as ``GET /v1/sessions/{id}/turns`` reports it.
TURN_STATES = (
    "pending",
    "extracting",
    "extracted",
    "empty",
    "waiting_for_budget",
    "failed",
    "dead_lettered",
)


@dataclass(frozen=True)
class TurnUsage:
    """What extracting a turn cost, counted once: LLM calls and tokens, embedding tokens, the
    LLM call's latency, and the cost in USD by the service's price table."""

    llm_calls: int
    input_tokens: int
    output_tokens: int
    embedding_tokens: int
    latency_ms: int
    provider: str | None
    model: str | None
    embedding_model: str | None
    cost: float

    @classmethod
    def from_json(cls, value: Any) -> TurnUsage:
        data = _obj(value, "usage")
        what = "usage"
        return cls(
            llm_calls=_req_int(data, "llm_calls", what),
            input_tokens=_req_int(data, "input_tokens", what),
            output_tokens=_req_int(data, "output_tokens", what),
            embedding_tokens=_req_int(data, "embedding_tokens", what),
            latency_ms=_req_int(data, "latency_ms", what),
            provider=_opt_str(data, "provider", what),
            model=_opt_str(data, "model", what),
            embedding_model=_opt_str(data, "embedding_model", what),
            cost=_float(_req(data, "cost", what), "usage.cost"),
        )


@dataclass(frozen=True)
class RecordedTurn:
    """A turn read back: as recorded, with its extraction ``state`` (one of
    :data:`TURN_STATES`), the failure's class when it failed (``reason``), the memories
    extracted (None: no result yet) and its ``usage`` (None until known)."""

    turn_index: int
    messages: tuple[Mapping[str, Any], ...]
    completion: Mapping[str, Any]
    state: str
    reason: str | None
    memories: int | None
    superseding: int | None
    reused: bool | None
    usage: TurnUsage | None

    @classmethod
    def from_json(cls, value: Any) -> RecordedTurn:
        data = _obj(value, "turn")
        what = "turn"
        messages = _req(data, "messages", what)
        if not isinstance(messages, list):
            raise UnexpectedResponseError("turn.messages: expected a list")
        usage = data.get("usage")
        memories, superseding, reused = (
            data.get("memories"),
            data.get("superseding"),
            data.get("reused"),
        )
        return cls(
            turn_index=_req_int(data, "turn_index", what),
            messages=tuple(_obj(m, "turn.messages[]") for m in messages),
            completion=_obj(_req(data, "completion", what), "turn.completion"),
            state=_str(_req(data, "state", what), "turn.state"),
            reason=_opt_str(data, "reason", what),
            memories=None if memories is None else _int(memories, "turn.memories"),
            superseding=None if superseding is None else _int(superseding, "turn.superseding"),
            reused=reused if isinstance(reused, bool) else None,
            usage=None if usage is None else TurnUsage.from_json(usage),
        )


def turn_page(value: Any) -> Page[RecordedTurn]:
    return _page(value, RecordedTurn.from_json)


# -- users -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """One of the org's agents: its id (what memory routes take) and its slug."""

    id: uuid.UUID
    slug: str

    @classmethod
    def from_json(cls, value: Any) -> Agent:
        data = _obj(value, "agent")
        slug = _req(data, "slug", "agent")
        if not isinstance(slug, str):
            raise UnexpectedResponseError("agent.slug is not a string")
        return cls(id=_uuid(_req(data, "id", "agent"), "agent.id"), slug=slug)


@dataclass(frozen=True)
class ForgottenUser:
    """What forgetting a user did: the user's id, and how many of their sessions and memories
    were deleted and tokens revoked."""

    user_id: uuid.UUID
    sessions: int
    memories: int
    tokens: int

    @classmethod
    def from_json(cls, value: Any) -> ForgottenUser:
        data = _obj(value, "forgotten user")
        what = "forgotten user"
        return cls(
            user_id=_uuid(_req(data, "user_id", what), "forgotten user.user_id"),
            sessions=_req_int(data, "sessions", what),
            memories=_req_int(data, "memories", what),
            tokens=_req_int(data, "tokens", what),
        )


__all__ = [
    "MEMORY_KINDS",
    "SESSION_STATUSES",
    "TURN_STATES",
    "Agent",
    "Context",
    "ForgottenUser",
    "Memory",
    "MemorySource",
    "Page",
    "Progress",
    "RecordedTurn",
    "SearchHit",
    "Session",
    "Signals",
    "Turn",
    "TurnUsage",
    "TurnsAppended",
]
