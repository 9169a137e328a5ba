"""The chat request sent to an OpenAI-compatible model for one turn.

Layout (deterministic: the same turn and context always give the same messages):

1. ``system``: the task, what counts as a memory, and the exact JSON output format.
2. ``user``, only when there is context: the earlier turns, marked as context that must not be
   extracted from (they were, or will be, extracted on their own).
3. ``user``, only when the scope holds memories: the current memories most related to the turn
   (at most ``EXTRACTION_RELATED_MEMORIES``), each under a short local ref (``m1``, ``m2``, ...)
   so the answer can say that a new memory replaces one (``"replaces": ["m2"]``).
4. ``user``: the turn to extract from, its messages and completion verbatim as JSON.

Recalled-memories blocks (``<memories>...</memories>``, what ``POST /v1/context`` returns) are
removed from every message first: see :mod:`schema.recall`.

The turn is the last message, and it starts with :data:`TURN_HEADER`, so a test double can key
on it (``bench/fake_llm.py`` does).

:func:`input_hash` is what a repeated turn is recognised by: a hash of the scope, the prompt
version, the model and the messages above *without* the related memories (why: see there).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schema.extraction import MAX_MEMORIES
from schema.recall import strip_messages
from sessions.turns import TurnRecord

#: Earlier turns beyond this many characters are left out, oldest first: the context helps to
#: resolve references ("she", "that city"); it is not worth a prompt that overflows the model.
MAX_CONTEXT_CHARS = 24_000

#: Changes whenever the request changes in a way that may change answers: part of
#: :func:`input_hash`, so results of an older prompt are never reused for a newer one.
PROMPT_VERSION = "2"

RELATED_HEADER = (
    "MEMORIES ALREADY STORED about this user, most related first, each with a ref. Do NOT"
    " extract them again. If the turn changes one of them (the user moved, changed job, changed"
    ' a preference), write the new memory and list the ref(s) it replaces in "replaces".'
)

CONTEXT_HEADER = (
    "CONTEXT: earlier turns of the same conversation, oldest first. They are for understanding"
    " only; do NOT extract memories from them."
)
TURN_HEADER = "TURN TO EXTRACT FROM"

SYSTEM_PROMPT = f"""\
You extract long-term memories from one turn of a conversation between a user and an AI \
assistant. A memory is a durable fact about the user or their task that would be useful in a \
future conversation: who they are, their preferences, their plans and events, their \
constraints (allergies, diet, accessibility), places, people and pets in their life, and \
anything they explicitly ask to be remembered.

Rules:
- Extract only from the turn marked "{TURN_HEADER}". Context turns are for understanding only.
- Prefer what the user states. Use the assistant's reply only to resolve what the user meant.
- Write each memory as one short, self-contained sentence in the third person about \
"the user" (for example "The user is allergic to peanuts.").
- Skip greetings, questions, small talk, requests for help and anything transient.
- Never repeat a memory. If there is nothing worth remembering, return an empty list.
- At most {MAX_MEMORIES} memories.
- When memories already stored are listed and the turn makes one of them no longer true, the \
new memory says what is true now and "replaces" lists the refs it makes obsolete (for example \
"m2"). Use only listed refs. Omit "replaces" otherwise.

Answer with a single JSON object and nothing else, in exactly this format:
{{"memories": [{{"content": "<one sentence>", "kind": "fact" | "preference" | "event" | "other", \
"replaces": ["m1"]}}]}}
kind: "fact" for stable facts, "preference" for likes and dislikes, "event" for plans, \
appointments and dates, "other" for anything else."""


@dataclass(frozen=True)
class RelatedMemory:
    """A current memory of the scope as the prompt lists it: its local ref (``m1``...)."""

    ref: str
    content: str
    kind: str


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)


def render_turn(turn: TurnRecord) -> str:
    """The turn's messages and completion, verbatim, as one JSON document, except for recalled
    ``<memories>`` blocks (our own context fed back by the application), which are removed:
    extracting them again would store copies of memories already held."""
    messages = strip_messages(turn.messages)
    return _dump(
        {"turn_index": turn.turn_index, "messages": messages, "completion": turn.completion}
    )


def _context_block(context: Sequence[TurnRecord]) -> str | None:
    rendered: list[str] = []
    budget = MAX_CONTEXT_CHARS
    # Newest first, so it is the oldest turns that fall outside the budget.
    for turn in sorted(context, key=lambda t: t.turn_index, reverse=True):
        text = f"Context turn {turn.turn_index}:\n{render_turn(turn)}"
        if len(text) > budget:
            break
        budget -= len(text)
        rendered.append(text)
    if not rendered:
        return None
    return "\n\n".join([CONTEXT_HEADER, *reversed(rendered)])


def _related_block(related: Sequence[RelatedMemory]) -> str | None:
    if not related:
        return None
    lines = [f"{m.ref}: {m.content} ({m.kind})" for m in related]
    return "\n".join([RELATED_HEADER, *lines])


def build_messages(
    turn: TurnRecord, context: Sequence[TurnRecord], related: Sequence[RelatedMemory] = ()
) -> list[dict[str, Any]]:
    """The ``messages`` of the chat completion request that extracts ``turn``."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    earlier = [t for t in context if t.turn_index < turn.turn_index]
    block = _context_block(earlier)
    if block is not None:
        messages.append({"role": "user", "content": block})
    listed = _related_block(related)
    if listed is not None:
        messages.append({"role": "user", "content": listed})
    messages.append(
        {
            "role": "user",
            "content": (
                f"{TURN_HEADER} (turn {turn.turn_index}). Extract memories from this turn"
                f" only:\n{render_turn(turn)}"
            ),
        }
    )
    return messages


def input_hash(
    scope: Sequence[object],
    provider: str,
    model: str,
    turn: TurnRecord,
    context: Sequence[TurnRecord],
) -> str:
    """SHA-256 (hex) of what identifies an extraction's input: the scope (org, agent, user),
    :data:`PROMPT_VERSION`, the provider and model, and the messages :func:`build_messages`
    sends (context turns, the turn's messages and completion, recalled blocks removed), but
    *not* the related memories.

    Why not them: they are the scope's state, and the first extraction of a turn changes that
    state (its memories are then listed for the next identical turn), so with them in the hash
    no repeated turn would ever match. Without them, a repeated turn reuses a result decided
    against the memories of its time: its memories are then found as duplicates by the memory
    service, and its ``supersedes`` name memories of the same scope, which the service marks
    only when they are still current (the pipeline sends ``stale_supersedes: skip``)."""
    material = {
        "scope": [None if part is None else str(part) for part in scope],
        "prompt_version": PROMPT_VERSION,
        "provider": provider,
        "model": model,
        "messages": build_messages(turn, context),
    }
    text = json.dumps(material, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


__all__ = [
    "CONTEXT_HEADER",
    "MAX_CONTEXT_CHARS",
    "PROMPT_VERSION",
    "RELATED_HEADER",
    "SYSTEM_PROMPT",
    "TURN_HEADER",
    "RelatedMemory",
    "build_messages",
    "input_hash",
    "render_turn",
]
