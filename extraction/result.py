"""One turn's extraction result: the value object, its persisted form, and LLM output parsing.

The persisted form (:meth:`ExtractionResult.to_json`) is what the first successful extraction of
a turn stores and every later delivery reuses, so a memory's ordinal (its position in
``memories``) and its wording never change after that. :func:`parse_llm_content` is the only
place raw model text becomes memories.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidMessageError, LLMUnavailableError
from schema import describe_errors, load
from schema.extraction import ExtractionResultSchema

_SCHEMA = ExtractionResultSchema()

# A whole answer wrapped in a Markdown fence: ```json ... ``` or ``` ... ```.
_FENCE = re.compile(r"^```[ \t]*[A-Za-z0-9_+-]*[ \t]*\r?\n?(?P<body>.*?)\r?\n?[ \t]*```$", re.S)


@dataclass(frozen=True)
class ExtractedMemory:
    """One memory: stripped content and one of ``fact | preference | event | other``.

    ``replaces``: the prompt's local refs (``m1``...) the answer said it replaces; never
    persisted (a ref means something only in the prompt it came with). ``supersedes``: the
    memory ids they were resolved to (:meth:`resolved`), persisted with the result."""

    content: str
    kind: str
    replaces: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()
    #: ``{"model", "vector"}``: the vector the extract stage computed, persisted with it.
    embedding: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"content": self.content, "kind": self.kind}
        if self.supersedes:  # absent otherwise: results stored before stay byte-identical
            data["supersedes"] = list(self.supersedes)
        if self.embedding is not None:
            data["embedding"] = self.embedding
        return data

    def resolved(self, ids: tuple[str, ...]) -> ExtractedMemory:
        return ExtractedMemory(self.content, self.kind, (), ids, self.embedding)


@dataclass(frozen=True)
class ExtractionResult:
    """The memories of one turn, in ordinal order, with what producing them cost."""

    memories: tuple[ExtractedMemory, ...]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    provider: str = ""
    model: str = ""

    def to_json(self) -> dict[str, Any]:
        """The canonical persisted form: ``{"memories": [{"content", "kind"}, ...]}``."""
        return {"memories": [m.to_json() for m in self.memories]}

    @classmethod
    def from_json(cls, data: Any) -> ExtractionResult:
        """Rebuild a result from :meth:`to_json` output, validating it on the way.

        Nothing is reordered or removed: the stored list is the truth the ordinals refer to.
        Invalid stored data raises :class:`~core.errors.InvalidMessageError`.
        """
        loaded = load(_SCHEMA, data, what="extraction result")
        return cls(memories=tuple(_memories(loaded["memories"])))


def _memories(items: Iterable[dict[str, Any]]) -> list[ExtractedMemory]:
    return [
        ExtractedMemory(
            content=item["content"],
            kind=item["kind"],
            replaces=tuple(item.get("replaces") or ()),
            supersedes=tuple(dict.fromkeys(str(i) for i in item.get("supersedes") or ())),
            embedding=item.get("embedding"),
        )
        for item in items
    ]


def strip_code_fence(text: str) -> str:
    """``text`` without surrounding whitespace and without one surrounding Markdown fence."""
    stripped = text.strip()
    match = _FENCE.match(stripped)
    return match.group("body").strip() if match else stripped


def dedupe(memories: Iterable[ExtractedMemory]) -> list[ExtractedMemory]:
    """Drop memories whose exact content appeared earlier in the list; keep order."""
    seen: set[str] = set()
    out: list[ExtractedMemory] = []
    for memory in memories:
        if memory.content not in seen:
            seen.add(memory.content)
            out.append(memory)
    return out


def parse_llm_content(text: str) -> list[ExtractedMemory]:
    """The memories in an LLM's answer, validated, stripped, de-duplicated, in order.

    Raises :class:`~core.errors.LLMUnavailableError` for anything that is not the expected
    JSON object: a model answering garbage is a transient failure to retry (a bounded number
    of times), never "no memories". The error names what was wrong, not the text itself, so
    conversation content does not end up in logs.
    """
    if not isinstance(text, str):
        raise LLMUnavailableError(f"unparseable LLM output: content is {type(text).__name__}")
    body = strip_code_fence(text)
    if not body:
        raise LLMUnavailableError("unparseable LLM output: empty content")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise LLMUnavailableError(
            f"unparseable LLM output: not JSON ({exc.__class__.__name__} at"
            f" {getattr(exc, 'pos', '?')} of {len(body)} characters)"
        ) from exc
    if not isinstance(data, dict):
        raise LLMUnavailableError(
            f"unparseable LLM output: expected a JSON object, got {type(data).__name__}"
        )
    memories = data.get("memories")
    if isinstance(memories, list):
        # Ids are never taken from a model (only refs, in "replaces"), nor vectors: a stray
        # "supersedes" or "embedding" is ignored rather than validated, so it cannot make the
        # answer invalid either.
        data = {
            **data,
            "memories": [
                {k: v for k, v in m.items() if k not in ("supersedes", "embedding")}
                if isinstance(m, dict)
                else m
                for m in memories
            ],
        }
    try:
        loaded = load(_SCHEMA, data, what="LLM output")
    except InvalidMessageError as exc:
        raise LLMUnavailableError(
            f"unparseable LLM output: {describe_errors(exc.messages)}"
        ) from exc
    # Ids are never taken from a model: only refs, resolved against what the prompt listed.
    answered = [
        ExtractedMemory(m.content, m.kind, m.replaces) for m in _memories(loaded["memories"])
    ]
    return dedupe(answered)


__all__ = [
    "ExtractedMemory",
    "ExtractionResult",
    "dedupe",
    "parse_llm_content",
    "strip_code_fence",
]
