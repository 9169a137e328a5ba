"""The sessions API's payloads: what they accept and the field they name when they refuse."""

from __future__ import annotations

import json
from typing import Any

import pytest
from marshmallow import ValidationError

from schema.imports import MAX_DEPTH, parse_session_line
from schema.sessions import SessionCreateSchema, TurnsAppendSchema


def turn(i: int, content: Any = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "turn_index": i,
        "messages": [{"role": "user", "content": content, "name": "dana"}],
        "completion": {"role": "assistant", "content": "hi"},
        **extra,
    }


def test_a_turn_loads_as_an_import_turn_does() -> None:
    """Extra message keys pass through and the defaults are the importer's, so both ways in
    hash the same content."""
    loaded = TurnsAppendSchema().load({"turns": [turn(3), turn(4)]})["turns"]
    import_turn = {k: v for k, v in turn(0).items() if k != "turn_index"}
    line = parse_session_line(
        json.dumps({"org": "a", "agent": "b", "session": "c", "turns": [import_turn] * 2})
    )
    for ours, theirs in zip(loaded, line["turns"], strict=True):
        assert {k: v for k, v in ours.items() if k not in ("turn_index", "is_complete")} == theirs
    assert [t["turn_index"] for t in loaded] == [3, 4]
    assert all(t["is_complete"] is True for t in loaded)


def nested(levels: int) -> Any:
    value: Any = "deep"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("turns", "where"),
    [
        ([turn(1), turn(3)], {1: {"turn_index"}}),
        ([turn(2), turn(1)], {1: {"turn_index"}}),
        ([turn(1, "nul \x00")], {0: {"_schema"}}),
        ([turn(1, "lone \ud800")], {0: {"_schema"}}),
        # messages list 1, message 2, content from 3: a turn at level 3 of an import line.
        ([turn(1, nested(MAX_DEPTH - 4))], {0: {"_schema"}}),
        ([turn(1, is_complete="yes")], {0: {"is_complete"}}),
        ([turn(1, turn_index=True)], {0: {"turn_index"}}),
    ],
)
def test_bad_turns_are_named(turns: list[dict[str, Any]], where: dict[int, set[str]]) -> None:
    with pytest.raises(ValidationError) as info:
        TurnsAppendSchema().load({"turns": turns})
    errors = info.value.messages["turns"]  # type: ignore[index,call-overload]
    assert {i: set(e) for i, e in errors.items()} == where


def test_nesting_up_to_the_import_limit_is_accepted() -> None:
    TurnsAppendSchema().load({"turns": [turn(1, nested(MAX_DEPTH - 5))]})


@pytest.mark.parametrize(
    "body",
    [{}, {"agent": "a", "agent_id": "0b4f6a3e-8c51-4c1e-9a57-2f0d6c1b7e90"}, {"agent": "A B"}],
)
def test_exactly_one_agent(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        SessionCreateSchema().load(body)
    assert "agent" in info.value.messages
