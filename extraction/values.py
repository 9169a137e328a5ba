"""The value types of the per-turn state: what the stores return and the stages pass around.

No I/O here: :mod:`extraction.turns` and :mod:`extraction.scan_queries` build these from rows,
the stages decide on them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sessions.turns import TurnRecord

UUIDLike = uuid.UUID | str


def uuid_text(value: UUIDLike) -> str:
    """``value`` as a canonical UUID string (ValueError when it is not a UUID)."""
    return str(as_uuid(value))


def as_uuid(value: UUIDLike) -> uuid.UUID:
    """``value`` as a UUID, itself when it is one (ValueError when it is not a UUID)."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


@dataclass(frozen=True)
class TurnRef:
    """The identity of one turn: what every turn-level message carries."""

    org_id: uuid.UUID
    session_id: uuid.UUID
    turn_index: int

    @classmethod
    def of(cls, org_id: UUIDLike, session_id: UUIDLike, turn_index: int) -> TurnRef:
        return cls(as_uuid(org_id), as_uuid(session_id), int(turn_index))

    def as_message(self) -> dict[str, Any]:
        return {
            "org_id": str(self.org_id),
            "session_id": str(self.session_id),
            "turn_index": self.turn_index,
        }


@dataclass(frozen=True)
class Candidate:
    """A session with unextracted turns: identities and progress only."""

    org_id: uuid.UUID
    agent_id: uuid.UUID
    session_id: uuid.UUID
    last_extracted_turn: int
    turn_count: int


@dataclass(frozen=True)
class StoredMemory:
    content: str
    kind: str
    #: Ids of the memories this one replaces, resolved from the answer's refs before the
    #: result was persisted (empty for most memories, and for results stored before).
    supersedes: tuple[str, ...] = ()
    #: The memory's vector, computed in the extract stage and persisted with the result:
    #: ``{"model": ..., "vector": [...]}``; None for a result extracted without an embedder
    #: (or during its outage), and for results stored before.
    embedding: dict[str, Any] | None = None


@dataclass(frozen=True)
class PersistedResult:
    """The first validated result of a turn, exactly as stored: ordinals index ``memories``."""

    memories: tuple[StoredMemory, ...]
    provider: str | None
    model: str | None
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def from_row(
        cls,
        result: Any,
        provider: str | None,
        model: str | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> PersistedResult:
        data = result if isinstance(result, dict) else json.loads(result)
        memories = tuple(
            StoredMemory(
                str(m["content"]),
                str(m["kind"]),
                tuple(str(i) for i in m.get("supersedes", ())),
                m.get("embedding"),
            )
            for m in data["memories"]
        )
        return cls(memories, provider, model, int(prompt_tokens), int(completion_tokens))


@dataclass(frozen=True)
class LlmAnswer:
    """A validated LLM answer for a turn, in its persisted form, not yet stored."""

    result: dict[str, Any]
    provider: str | None
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    #: What the LLM input hashed to (``extraction.prompt.input_hash``), stored with the result.
    input_hash: str | None = None
    #: The result is another turn's, persisted for the same input hash: no LLM call was made.
    reused: bool = False
    #: How long the LLM call took (0: none was made), and the tokens the embedding request
    #: for the answer's memories cost (0: none made, or an embedder that reports none).
    latency_ms: int = 0
    embedding_tokens: int = 0
    embedding_model: str | None = None


# -- what begin_extract found ----------------------------------------------------------------


@dataclass(frozen=True)
class AlreadyDone:
    """The turn is done (or below the pointer): nothing left to do for it."""


@dataclass(frozen=True)
class Busy:
    """Another delivery holds a live LLM claim; wait ``retry_after`` seconds."""

    retry_after: float


@dataclass(frozen=True)
class Persisted:
    """A result is stored: no LLM call; write the slots not yet written."""

    result: PersistedResult
    written: frozenset[int]
    #: This call stored the result (and the turn's usage row); False: found stored.
    stored_now: bool = False
    #: The budget threshold (80, 100) this result made its org cross, if any.
    budget_crossed: int | None = None


@dataclass(frozen=True)
class OverBudget:
    """The org's token budget is spent: no LLM call; the turn waits (``waiting_for_budget``)
    and the scan sends it again when its short lease ends."""


@dataclass(frozen=True)
class Claimed:
    """This delivery holds the LLM claim and may call the LLM (attempt number ``attempt``)."""

    token: uuid.UUID
    attempt: int
    #: The turn and up to ``context_turns`` turns before it, read in the claim's transaction.
    turns: tuple[TurnRecord, ...] = ()
    #: The scope's current memories most related to the turn, best first, read in the same
    #: transaction: (memory id, content, kind).
    related: tuple[tuple[str, str, str], ...] = ()
    #: The session's agent and user: the scope of the input hash.
    agent_id: uuid.UUID | None = None
    user_id: uuid.UUID | None = None


@dataclass(frozen=True)
class GaveUp:
    """The turn used up its attempts; ``last_error`` says why the last one failed."""

    attempts: int
    last_error: str | None


BeginOutcome = AlreadyDone | Busy | Persisted | Claimed | GaveUp | OverBudget


@dataclass(frozen=True)
class SlotView:
    """What ``write_memory`` needs about its slot, read in one transaction."""

    state: str
    agent_id: uuid.UUID
    result: PersistedResult | None
    recorded: bool
    #: The session's user, whom the memory is about (None: agent-wide).
    user_id: uuid.UUID | None = None


@dataclass(frozen=True)
class PointerOutcome:
    """The effect of :meth:`extraction.turns.TurnStore.complete_turn`."""

    completed: bool  # every slot was recorded and the turn is now done
    newly_done: bool  # this call moved the turn to done
    pointer_before: int
    pointer_after: int


@dataclass(frozen=True)
class TurnStatus:
    """A turn row, for inspection (CLI, tests)."""

    state: str
    attempts: int
    llm_calls: int
    memory_count: int | None
    slots: int
    last_error: str | None
    lease_live: bool
    claim_live: bool


__all__ = [
    "AlreadyDone",
    "BeginOutcome",
    "Busy",
    "Candidate",
    "Claimed",
    "GaveUp",
    "LlmAnswer",
    "OverBudget",
    "Persisted",
    "PersistedResult",
    "PointerOutcome",
    "SlotView",
    "StoredMemory",
    "TurnRef",
    "TurnStatus",
    "UUIDLike",
    "as_uuid",
    "uuid_text",
]
