"""The chat request sent to an OpenAI-compatible model for one turn.

Layout (deterministic: the same turn and context always give the same messages):

1. ``system``: the task, what counts as a memory, and the exact JSON output format.
2. ``user``, only when there is context: the earlier turns, marked as context that must not be
   extracted from (they were, or will be, extracted on their own).
3. ``user``: the turn to extract from, its messages and completion verbatim as JSON.

Recalled-memories blocks (``<memories>...</memories>``, what ``POST /v1/context`` returns) are
removed from every message first: see :mod:`schema.recall`.

The turn is the last message, and it starts with :data:`TURN_HEADER`, so a test double can key
on it (``bench/fake_llm.py`` does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from models.store import Turn
from schema.extraction import MAX_MEMORIES
from schema.recall import strip_messages

#: Earlier turns beyond this many characters are left out, oldest first: the context helps to
#: resolve references ("she", "that city"); it is not worth a prompt that overflows the model.
MAX_CONTEXT_CHARS = 24_000

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

Answer with a single JSON object and nothing else, in exactly this format:
{{"memories": [{{"content": "<one sentence>", "kind": "fact" | "preference" | "event" | "other"}}]}}
kind: "fact" for stable facts, "preference" for likes and dislikes, "event" for plans, \
appointments and dates, "other" for anything else."""


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)


def render_turn(turn: Turn) -> str:
    """The turn's messages and completion, verbatim, as one JSON document, except for recalled
    ``<memories>`` blocks (our own context fed back by the application), which are removed:
    extracting them again would store copies of memories already held."""
    messages = strip_messages(turn.messages)
    return _dump(
        {"turn_index": turn.turn_index, "messages": messages, "completion": turn.completion}
    )


def _context_block(context: Sequence[Turn]) -> str | None:
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


def build_messages(turn: Turn, context: Sequence[Turn]) -> list[dict[str, Any]]:
    """The ``messages`` of the chat completion request that extracts ``turn``."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    earlier = [t for t in context if t.turn_index < turn.turn_index]
    block = _context_block(earlier)
    if block is not None:
        messages.append({"role": "user", "content": block})
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


__all__ = [
    "CONTEXT_HEADER",
    "MAX_CONTEXT_CHARS",
    "SYSTEM_PROMPT",
    "TURN_HEADER",
    "build_messages",
    "render_turn",
]
