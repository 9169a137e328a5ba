"""Context assembly: memories packed into a token budget, the standing facts first.

Token estimate (documented, the same on every backend): one token per 4 UTF-8 bytes of the
text, rounded up: ``ceil(len(text.encode("utf-8")) / 4)``. It overestimates English for the
common BPE tokenizers (about 4.5 bytes a token), so a block that fits the estimate fits the
model. The estimate is taken over the whole block as returned, so ``tokens <= max_tokens``
holds for the exact string, not for a sum of parts.

Packing (:func:`pack_parts`) walks the person's standing facts in their order, each while the
block stays within their share of the budget, then the query's hits in rank order (score, then
recency, then id: deterministic) while it stays within the budget
(:mod:`memories.search.service` chooses both). A memory that does not fit is dropped and
the walk goes on, so a shorter one further down may still get in. A memory whose words are
nearly those of one already packed (Jaccard similarity of their word sets >=
:data:`NEAR_DUPLICATE`) is not packed twice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schema.recall import CLOSE, OPEN, neutralise, strip_recalled

NEAR_DUPLICATE = 0.8
#: How many of the last user messages make the query when the request gives messages.
QUERY_MESSAGES = 3
MAX_QUERY_CHARS = 2000

_WORD = re.compile(r"[^\W_]+")


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text``: one per 4 UTF-8 bytes, rounded up."""
    return math.ceil(len(text.encode("utf-8")) / 4)


def render(lines: Sequence[str]) -> str:
    """The block for these memory texts; "" for none."""
    if not lines:
        return ""
    return "\n".join([OPEN, *(f"- {line}" for line in lines), CLOSE])


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.casefold()))


def near_duplicate(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether the Jaccard similarity of ``a`` and ``b`` is at least :data:`NEAR_DUPLICATE`.
    It is at most the smaller set's size over the larger's, so sets whose sizes are further
    apart are answered without intersecting them (the same answer: the division rounds
    monotonically)."""
    if not a or not b:
        return a == b
    small, large = (len(a), len(b)) if len(a) <= len(b) else (len(b), len(a))
    if small / large < NEAR_DUPLICATE:
        return False
    shared = len(a & b)
    return shared / (small + large - shared) >= NEAR_DUPLICATE


@dataclass(frozen=True)
class Packed:
    context: str
    #: Indexes of the packed texts, in the block's order.
    chosen: list[int]
    tokens: int
    dropped: int


def pack(contents: Sequence[str], max_tokens: int) -> Packed:
    """Pack the texts (best first) into at most ``max_tokens`` estimated tokens."""
    return pack_parts([], contents, max_tokens, standing_tokens=0)


def pack_parts(
    standing: Sequence[str],
    relevant: Sequence[str],
    max_tokens: int,
    *,
    standing_tokens: int,
) -> Packed:
    """Pack ``standing`` first, in order, each while the block stays within
    ``standing_tokens`` (the share of the budget they may take), then ``relevant`` (best
    first) while it stays within ``max_tokens``; a text whose words nearly repeat one already
    packed is left out. ``chosen`` indexes ``[*standing, *relevant]``."""
    lines: list[str] = []
    chosen: list[int] = []
    seen: list[frozenset[str]] = []
    parts = ((standing, min(standing_tokens, max_tokens)), (relevant, max_tokens))
    # The block's size in bytes as it grows (the tags, then "- line\n" per line): a line's
    # fit is known without rendering, and is checked before the near-duplicate test.
    size = len(f"{OPEN}\n{CLOSE}".encode())
    offset = 0
    for texts, budget in parts:
        for index, content in enumerate(texts):
            line = neutralise(content)
            grown = size + len(f"- {line}\n".encode())
            if not line or math.ceil(grown / 4) > budget:
                continue
            words = _words(line)
            if any(near_duplicate(words, other) for other in seen):
                continue
            lines.append(line)
            chosen.append(offset + index)
            seen.append(words)
            size = grown
        offset += len(texts)
    context = render(lines)
    return Packed(context, chosen, estimate_tokens(context), offset - len(chosen))


def fits(contents: Sequence[str], max_tokens: int) -> bool:
    """Whether the block of all of ``contents`` (each near-duplicate once) is within
    ``max_tokens``."""
    size = len(f"{OPEN}\n{CLOSE}".encode())
    seen: list[frozenset[str]] = []
    for content in contents:
        line = neutralise(content)
        words = _words(line)
        if line and not any(near_duplicate(words, other) for other in seen):
            seen.append(words)
            size += len(f"- {line}\n".encode())
            if math.ceil(size / 4) > max_tokens:
                return False  # the lines so far are already over: no need to read on
    return True


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def query_from_messages(messages: Sequence[Any]) -> str:
    """The query for a conversation: its last user messages (the last
    :data:`QUERY_MESSAGES`), newest last, without recalled blocks, at most
    :data:`MAX_QUERY_CHARS` characters (the newest kept)."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    texts = [strip_recalled(_text(m)).strip() for m in users[-QUERY_MESSAGES:]]
    query = "\n".join(t for t in texts if t)
    return query[-MAX_QUERY_CHARS:]
