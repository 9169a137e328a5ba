"""What one chat call adds to a session: the messages new since the stored conversation.

A chat request carries the whole conversation so far. The session's turns store only what is
new: turn n holds the request's messages after the conversation stored through turn n - 1
(its turns' messages, each followed by its completion). So storage and the extractor's
context grow with the conversation, not with its square. No I/O here.

The rules (:func:`plan_turn`), on messages compared without recalled ``<memories>`` blocks
(injection adds one to the system prompt, so the same conversation is sent with different
blocks) and without keys whose value is empty:

- A request that is a prefix of the stored conversation was already recorded: the same request
  retried (its answer may differ: the first stored one stays), or a late copy of an earlier
  call. Nothing is stored.
- A request that extends the stored conversation is stored as its new messages.
- Any other request (an earlier message edited, a conversation restarted) is stored whole as
  the next turn.

Turns of one session can reach the worker out of order (the client sent its next call before
the previous turn was stored). A request stored whole that holds earlier answers may be such
a call: the worker stores it only on a retry (:func:`answers_in`), so the earlier turn has
landed by then and the call extends it.

The stored conversation is rebuilt from the turns by the same rule the writer used: a turn
whose first message is the conversation's first message (the system prompt, or the first
user message) was stored whole and restarts the conversation; any other turn continues it. A
new-messages list that would start with the conversation's first message is stored whole, so
the writer and the reader never disagree on a turn they both made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schema.recall import strip_recalled
from sessions.turns import content_digest

#: The message keys that say what a message is; everything else (``refusal: null``, provider
#: extras) is ignored when messages are compared.
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "function_call")


def request_hash(body: Mapping[str, Any]) -> str:
    """The retry identity of a chat call: the hash of the whole request body."""
    return content_digest(dict(body))


def _text(content: Any) -> Any:
    if isinstance(content, str):
        return strip_recalled(content).strip()
    if isinstance(content, list):
        parts = [p for p in content if p not in (None, "")]
        if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
            return strip_recalled("\n".join(str(p.get("text", "")) for p in parts)).strip()
        return parts
    return content


def comparable(message: Any) -> Any:
    """``message`` as compared: its identifying keys with a value, text without recalled
    blocks. A message that is not an object is compared as it is."""
    if not isinstance(message, dict):
        return message
    out: dict[str, Any] = {}
    for key in _MESSAGE_KEYS:
        value = message.get(key)
        if key == "content":
            value = _text(value)
        if value not in (None, "", [], {}):
            out[key] = value
    return content_digest(out)


def assistant_message(message: Mapping[str, Any] | None) -> dict[str, Any]:
    """The completion to store: the answer's assistant message without empty keys."""
    if not message:
        return {"role": "assistant", "content": ""}
    out = {k: v for k, v in message.items() if v not in (None, [], {})}
    out.setdefault("role", "assistant")
    out.setdefault("content", "")
    return out


@dataclass(frozen=True)
class StoredTurn:
    messages: Sequence[Any]
    completion: Any


def conversation_of(turns: Sequence[StoredTurn]) -> list[Any]:
    """The conversation stored through the last of ``turns`` (in order, from turn 1), as
    comparable messages."""
    conversation: list[Any] = []
    for turn in turns:
        messages = [comparable(m) for m in turn.messages]
        if not conversation or (messages and messages[0] == conversation[0]):
            conversation = messages
        else:
            conversation = conversation + messages
        conversation.append(comparable(turn.completion))
    return conversation


@dataclass(frozen=True)
class Plan:
    """What to store for a request: nothing (``messages`` None: already recorded), or the
    messages of the next turn."""

    messages: list[Any] | None
    #: The request is stored whole: it did not extend the stored conversation.
    whole: bool = False

    @property
    def recorded(self) -> bool:
        return self.messages is None


def plan_turn(turns: Sequence[StoredTurn], request_messages: Sequence[Any]) -> Plan:
    """What a chat call with ``request_messages`` adds to a session holding ``turns``."""
    stored = conversation_of(turns)
    incoming = [comparable(m) for m in request_messages]
    if not stored:
        return Plan(list(request_messages), whole=True)
    if len(incoming) <= len(stored) and incoming == stored[: len(incoming)]:
        return Plan(None)
    if incoming[: len(stored)] == stored:
        new = list(request_messages[len(stored) :])
        if comparable(new[0]) != stored[0]:
            return Plan(new)
    return Plan(list(request_messages), whole=True)


def answers_in(messages: Sequence[Any]) -> bool:
    """Whether ``messages`` hold an earlier answer (an assistant message): a conversation
    already under way."""
    return any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
