"""The recalled-memories block: how ``POST /v1/context`` delimits memories it hands back, and
how the extractor recognises and removes such blocks from a turn before extraction.

An application that puts our context into its prompts sends it back to us inside the turns it
records; extracting it again would store paraphrased copies of memories we already hold. So
the block is delimited by :data:`OPEN` and :data:`CLOSE`, a memory's own text can never
contain either (:func:`neutralise`), and :func:`strip_recalled` removes every block (and an
unterminated one, cut off by truncation, up to the end of the text).
"""

from __future__ import annotations

import re
from typing import Any

OPEN = "<memories>"
CLOSE = "</memories>"

_BLOCK = re.compile(r"<memories>.*?(?:</memories>|\Z)", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"</?\s*memories\s*>", re.IGNORECASE)


def strip_recalled(text: str) -> str:
    """``text`` without any recalled-memories block."""
    if "<" not in text:
        return text
    return _BLOCK.sub("", text)


def neutralise(text: str) -> str:
    """A memory's text made safe to put inside a block: one line, no block tags."""
    return " ".join(_TAG.sub(" ", text).split())


def strip_message(message: Any) -> Any:
    """A chat message with recalled blocks removed from its text (string or text parts);
    anything else about the message, and any message of another shape, is kept as is."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, str):
        stripped = strip_recalled(content)
        return message if stripped == content else {**message, "content": stripped}
    if isinstance(content, list):
        parts = [
            {**part, "text": strip_recalled(part["text"])}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
        return message if parts == content else {**message, "content": parts}
    return message


def strip_messages(messages: Any) -> Any:
    """Every message of a list through :func:`strip_message`; a non-list is returned as is."""
    if not isinstance(messages, list):
        return messages
    return [strip_message(m) for m in messages]
