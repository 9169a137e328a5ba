"""Recalled memories are never extracted again: <memories> blocks leave a turn's messages
before the LLM prompt is built and before the rules extractor reads them."""

from __future__ import annotations

import json

from extraction.prompt import build_messages
from extraction.rules import extract_rules
from memories.search.context import pack
from schema.recall import strip_message, strip_recalled
from tests.unit.extraction.helpers import make_turn

RECALLED = pack(["The user is allergic to peanuts.", "The user lives in Lisbon."], 400).context


def test_the_block_from_context_assembly_is_removed_whole() -> None:
    assert RECALLED.startswith("<memories>")
    text = f"Remember this:\n{RECALLED}\nI'm vegetarian."
    assert strip_recalled(text) == "Remember this:\n\nI'm vegetarian."
    # Several blocks, any case, and one cut off by truncation (to the end of the text).
    assert strip_recalled("a<MEMORIES>x</Memories>b<memories>y</memories>c") == "abc"
    assert strip_recalled("keep <memories>\n- cut off") == "keep "
    assert strip_recalled("no block, <b>html</b> stays") == "no block, <b>html</b> stays"


def test_messages_of_every_shape() -> None:
    parts = {
        "role": "user",
        "content": [
            {"type": "text", "text": f"{RECALLED}Hi"},
            {"type": "image_url", "image_url": {"url": "x"}},
        ],
    }
    assert strip_message(parts)["content"] == [
        {"type": "text", "text": "Hi"},
        {"type": "image_url", "image_url": {"url": "x"}},
    ]
    plain = {"role": "user", "content": "nothing recalled"}
    assert strip_message(plain) is plain
    assert strip_message("not a message") == "not a message"


def test_the_llm_prompt_never_contains_recalled_memories() -> None:
    history = [
        {"role": "system", "content": f"You are helpful.\n{RECALLED}"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
    ]
    earlier = make_turn(f"{RECALLED}\nMy sister is called Ana.", turn_index=1)
    turn = make_turn(f"{RECALLED}\nI just adopted a dog.", turn_index=2, history=history)
    messages = build_messages(turn, [earlier])
    prompt = json.dumps(messages[1:])  # the system prompt's own example mentions peanuts
    assert "Lisbon" not in prompt and "peanuts" not in prompt and "memories>" not in prompt
    assert "I just adopted a dog." in messages[-1]["content"]
    assert "My sister is called Ana." in messages[1]["content"]
    # The stored turn itself is untouched (checkpoints are immutable).
    assert RECALLED in turn.messages[-1]["content"]


def test_the_rules_extractor_ignores_recalled_memories() -> None:
    recalled = pack(["I am allergic to peanuts.", "I live in Lisbon."], 400).context
    turn = make_turn(f"{recalled}\nI live in Porto.")
    contents = [m.content for m in extract_rules(turn)]
    assert any("Porto" in c for c in contents), contents
    assert not any("Lisbon" in c or "peanut" in c for c in contents), contents
    # Without the block the same text would have given those memories: the test can fail.
    bare = make_turn("I am allergic to peanuts. I live in Lisbon.")
    assert any("peanut" in m.content for m in extract_rules(bare))
