"""Turn builders shared by the extraction unit tests."""

from __future__ import annotations

import uuid
from typing import Any

from sessions.turns import TurnRecord

SESSION = uuid.UUID("00000000-0000-4000-8000-000000000001")


def make_turn(
    *user_texts: str,
    turn_index: int = 1,
    history: list[dict[str, Any]] | None = None,
    completion: str = "Noted!",
) -> TurnRecord:
    """A turn whose new user messages are ``user_texts``, after an optional ``history``."""
    messages = [*(history or []), *({"role": "user", "content": t} for t in user_texts)]
    return TurnRecord(
        session_id=SESSION,
        turn_index=turn_index,
        messages=messages,
        completion={"role": "assistant", "content": completion},
        prompt_tokens=0,
        completion_tokens=0,
        latency_ms=0,
    )
