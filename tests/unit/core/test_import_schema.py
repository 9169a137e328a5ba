"""Validation of import lines, without a database."""

from __future__ import annotations

import pytest

from core.errors import InvalidMessageError
from models.importer import parse_line


def test_a_minimal_line_gets_defaults() -> None:
    record = parse_line('{"org": "acme", "agent": "bot", "session": "s", "turns": []}')
    assert record["status"] == "completed" and record["turns"] == []


def test_messages_are_kept_verbatim_with_extra_keys() -> None:
    record = parse_line(
        '{"org": "acme", "agent": "bot", "session": "s", "turns": [{"messages":'
        ' [{"role": "tool", "content": null, "tool_call_id": "c1"}],'
        ' "completion": {"role": "assistant", "content": [{"type": "text", "text": "x"}]}}]}'
    )
    turn = record["turns"][0]
    assert turn["messages"] == [{"role": "tool", "content": None, "tool_call_id": "c1"}]
    assert turn["prompt_tokens"] == 0 and turn["is_streaming"] is False


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"org": "acme"', "malformed JSON"),
        ('"just a string"', "must be a JSON object"),
        ('{"org": "acme", "agent": "bot", "session": "s"}', "turns: Missing data"),
        ('{"org": "ac me", "agent": "bot", "session": "s", "turns": []}', "org: must be"),
        ('{"org": "acme", "agent": "bot", "session": "", "turns": []}', "session: Length"),
        ('{"org": "acme", "agent": "bot", "session": "s", "turns": [], "x": 1}', "x: Unknown"),
        (
            '{"org": "acme", "agent": "bot", "session": "s", "turns": [{"messages": [],'
            ' "completion": {"role": "assistant", "content": "x"}}]}',
            "turns[0].messages: Shorter than minimum",
        ),
        (
            '{"org": "acme", "agent": "bot", "session": "s", "turns": [{"messages":'
            ' [{"role": "user", "content": "x"}], "completion": {"role": "assistant",'
            ' "content": "x"}, "latency_ms": -1}]}',
            "turns[0].latency_ms: Must be greater than or equal to 0",
        ),
        (
            '{"org": "acme", "agent": "bot", "session": "s", "turns": [{"messages":'
            ' [{"role": "user", "content": "x"}], "completion": {"role": "assistant",'
            ' "content": "x"}, "prompt_tokens": "12"}]}',
            "turns[0].prompt_tokens: Not a valid integer",
        ),
    ],
)
def test_bad_lines_name_the_field(text: str, fragment: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        parse_line(text)
    assert fragment in str(info.value)
