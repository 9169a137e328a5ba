"""The chat request built for one turn."""

from __future__ import annotations

import json

from extraction.prompt import (
    CONTEXT_HEADER,
    MAX_CONTEXT_CHARS,
    SYSTEM_PROMPT,
    TURN_HEADER,
    build_messages,
)
from tests.unit.extraction.helpers import make_turn


def _turn_json(content: str) -> dict[str, object]:
    loaded = json.loads(content[content.index("{") :])
    assert isinstance(loaded, dict)
    return loaded


def test_system_prompt_then_the_turn_verbatim() -> None:
    turn = make_turn('I\'m Dana \u2014 "allergic" to peanuts 🥜', turn_index=4, completion="Ok")
    messages = build_messages(turn, [])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT
    assert '{"memories": [{"content":' in SYSTEM_PROMPT
    assert messages[-1]["content"].startswith(f"{TURN_HEADER} (turn 4)")
    rendered = _turn_json(messages[-1]["content"])
    assert rendered == {
        "turn_index": 4,
        "messages": turn.messages,
        "completion": turn.completion,
    }
    assert "🥜" in messages[-1]["content"]  # verbatim, not \\u-escaped


def test_context_turns_are_marked_and_come_before_the_turn() -> None:
    context = [make_turn(f"context {i}", turn_index=i) for i in (2, 1, 3)]
    turn = make_turn("the turn", turn_index=4)
    messages = build_messages(turn, context)
    assert [m["role"] for m in messages] == ["system", "user", "user"]
    block = messages[1]["content"]
    assert block.startswith(CONTEXT_HEADER)
    assert "do NOT extract" in block
    assert block.index("context 1") < block.index("context 2") < block.index("context 3")
    assert "the turn" not in block
    assert "context" not in messages[2]["content"]


def test_context_turns_that_are_not_earlier_are_left_out() -> None:
    turn = make_turn("the turn", turn_index=2)
    messages = build_messages(turn, [turn, make_turn("later", turn_index=3)])
    assert [m["role"] for m in messages] == ["system", "user"]


def test_oldest_context_falls_outside_the_budget_first() -> None:
    big = "x" * (MAX_CONTEXT_CHARS // 2)
    context = [make_turn(f"old {big}", turn_index=1), make_turn(f"new {big}", turn_index=2)]
    block = build_messages(make_turn("t", turn_index=3), context)[1]["content"]
    assert "new x" in block
    assert "old x" not in block


def test_deterministic() -> None:
    context = [make_turn("a", turn_index=1)]
    turn = make_turn("b", turn_index=2)
    assert build_messages(turn, context) == build_messages(turn, context)


def test_the_input_hash_is_the_digest_of_its_material_as_json_dumps_writes_it() -> None:
    """The stored input hashes stay valid: the digest is taken over the bytes json.dumps
    (sorted keys, compact, UTF-8) writes of the material, whoever writes them."""
    import hashlib
    import uuid

    from extraction.prompt import PROMPT_VERSION, input_hash

    turn = make_turn('Dana \u2014 "allergic" 🥜 \x00\ud7ff', turn_index=3, completion="Ok")
    context = [make_turn(f"context {i} é", turn_index=i) for i in (1, 2)]
    scope = (uuid.uuid4(), uuid.uuid4(), None)
    material = {
        "scope": [None if part is None else str(part) for part in scope],
        "prompt_version": PROMPT_VERSION,
        "provider": "openai",
        "model": "gpt-4o-mini",
        "messages": build_messages(turn, context),
    }
    text = json.dumps(material, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    expected = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert input_hash(scope, "openai", "gpt-4o-mini", turn, context) == expected
