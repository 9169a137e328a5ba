"""Validation of import lines, without a database."""

from __future__ import annotations

import json

import pytest

from core.errors import InvalidMessageError
from schema.imports import MAX_DEPTH
from sessions.importer import parse_line


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


def _session_with_content(content: object) -> bytes:
    record = {
        "org": "acme",
        "agent": "bot",
        "session": "s",
        "turns": [
            {
                "messages": [{"role": "user", "content": content}],
                "completion": {"role": "assistant", "content": "ok"},
            }
        ],
    }
    return json.dumps(record).encode()


def _nested(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


# The line object, turns, the turn, messages and the message are 5 levels above the content.
def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_is_not() -> None:
    record = parse_line(_session_with_content(_nested(MAX_DEPTH - 5)))
    assert record["turns"][0]["messages"][0]["content"] == _nested(MAX_DEPTH - 5)
    with pytest.raises(InvalidMessageError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_line(_session_with_content(_nested(MAX_DEPTH - 4)))


def test_a_very_deep_line_is_refused_without_recursing() -> None:
    text = b'{"org": "acme", "turns": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(InvalidMessageError, match="nested deeper than"):
        parse_line(text)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    content = '[{"quoted": "\\"[[[' + "[" * 500 + "{" * 500
    record = parse_line(_session_with_content(content))
    assert record["turns"][0]["messages"][0]["content"] == content


def test_allowed_characters_survive() -> None:
    content = "tab\there\r\nline, emoji \U0001f600, accents é, BOM \ufeff inside"
    record = parse_line(_session_with_content(content))
    assert record["turns"][0]["messages"][0]["content"] == content


def test_a_byte_order_mark_is_allowed_on_the_first_line_only() -> None:
    line = "\ufeff".encode() + _session_with_content("x")
    assert parse_line(line, first=True)["session"] == "s"
    with pytest.raises(InvalidMessageError, match="malformed JSON"):
        parse_line(line)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"org": "acme\xc3"}', "not valid UTF-8: byte 0xc3 at byte offset 13"),
        (b'{"org": "\xed\xa0\x80"}', "not valid UTF-8: byte 0xed at byte offset 9"),
        (
            b'{"org": "acme", "agent": "bot", "session": "a\\u0000b", "turns": []}',
            "session: contains a NUL character (U+0000)",
        ),
        (
            b'{"org": "acme", "agent": "bot", "session": "s\\u001b[31m", "turns": []}',
            "session: contains a control character (U+001B)",
        ),
        (
            _session_with_content("x").replace(b'"x"', b'"a \\udfff b"'),
            "turns[0].messages[0].content: contains a lone surrogate (U+DFFF)",
        ),
        (
            _session_with_content("x").replace(b'"role"', b'"\\u0001k": 1, "role"', 1),
            "turns[0].messages[0]: a key contains a control character (U+0001)",
        ),
        (b'{"org": "acme", "x": "a\x00b"}', "malformed JSON: Invalid control character"),
        (b'{"org": "acme", "x": NaN}', "NaN is not a JSON number"),
        (b'{"org": "acme", "x": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"org": "acme", "x": 1e999}', "number out of range: 1e999"),
        (b'{"org": "acme", "x": ' + b"9" * 5000 + b"}", "malformed JSON: Exceeds the limit"),
        (
            _session_with_content("x").replace(b'"ok"}', b'"ok"}, "prompt_tokens": 2147483648'),
            "turns[0].prompt_tokens: Must be greater than or equal to 0 and less than or equal"
            " to 2147483647",
        ),
    ],
)
def test_bad_bytes_and_characters_are_refused_with_where(raw: bytes, fragment: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        parse_line(raw)
    assert fragment in str(info.value)
