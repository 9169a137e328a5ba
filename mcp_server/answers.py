"""What the tools answer: typed results (the SDK publishes their schemas), made from the
client's values, and the client's errors as tool errors carrying the API's code."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from ibex_client import ApiError, Memory, SearchHit


class MemoryOut(BaseModel):
    """A stored memory."""

    id: str
    agent_id: str
    content: str
    kind: str
    source_session_id: str | None = Field(description="The conversation it came from, if any.")
    metadata: dict[str, Any]
    created_at: str


class SignalsOut(BaseModel):
    """Why a memory matched, each in [0, 1], higher is better."""

    text: float = Field(description="Full-text rank.")
    trigram: float = Field(description="Trigram similarity (names, typos); 0 without pg_trgm.")
    recency: float = Field(description="1 / (1 + age in days / 30); breaks ties.")
    semantic: float | None = Field(
        default=None,
        description="Cosine similarity of meaning (embeddings); null without a vector or an"
        " embedder for this search.",
    )


class Hit(BaseModel):
    """A memory that matched, with why."""

    memory: MemoryOut
    score: float = Field(description="The fused score in [0, 1], higher is better.")
    signals: SignalsOut
    snippet: str = Field(description="The content with the matched words in <mark> tags.")


class Remembered(BaseModel):
    memory: MemoryOut
    already_known: bool = Field(
        description="True when the agent already had this content: the memory that holds it."
    )


class Recalled(BaseModel):
    hits: list[Hit] = Field(description="Best first.")


class PackedContext(BaseModel):
    context: str = Field(description="The <memories> block for a system prompt ('' if none).")
    memories: list[Hit] = Field(description="The packed memories, in the block's order.")
    tokens: int = Field(description="Estimated size of the block, never over max_tokens.")
    dropped: int = Field(description="Matching memories left out for the budget.")


class ForgottenOut(BaseModel):
    memory_id: str
    forgotten: bool


class MemoryPage(BaseModel):
    memories: list[MemoryOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(
        description="Pass as cursor for the next page; None at the end."
    )


def memory_out(m: Memory) -> MemoryOut:
    return MemoryOut(
        id=str(m.id),
        agent_id=str(m.agent_id),
        content=m.content,
        kind=m.kind,
        source_session_id=None if m.source is None else str(m.source.session_id),
        metadata=dict(m.metadata),
        created_at=m.created_at.isoformat(),
    )


def hit_out(h: SearchHit) -> Hit:
    return Hit(
        memory=memory_out(h.memory),
        score=h.score,
        signals=SignalsOut(
            text=h.signals.text,
            trigram=h.signals.trigram,
            recency=h.signals.recency,
            semantic=h.signals.semantic,
        ),
        snippet=h.snippet,
    )


def api_error(exc: ApiError) -> ToolError:
    """The API's refusal as a tool error: code, message, and the fields of a 422."""
    text = f"{exc.code or exc.status}: {exc.message or 'the memory service refused the call'}"
    if exc.fields:
        text += " (" + "; ".join(f"{k}: {_flat(v)}" for k, v in sorted(exc.fields.items())) + ")"
    return ToolError(text)


def _flat(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(_flat(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_flat(v)}" for k, v in value.items())
    return str(value)


def argument_error(name: str, message: str) -> ToolError:
    return ToolError(f"INVALID_ARGUMENT: {name}: {message}")
