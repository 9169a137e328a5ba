"""Result parsing: code fences, validation, de-duplication, and the persisted form."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InvalidMessageError, LLMUnavailableError
from extraction.result import ExtractedMemory, ExtractionResult, parse_llm_content
from schema.extraction import KINDS, MAX_CONTENT_CHARS, MAX_MEMORIES

BODY = {"memories": [{"content": "The user is Dana.", "kind": "fact"}]}
DANA = [ExtractedMemory("The user is Dana.", "fact")]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(BODY),
        "  \n" + json.dumps(BODY) + "\n\t ",
        "```json\n" + json.dumps(BODY) + "\n```",
        "```JSON\n" + json.dumps(BODY, indent=2) + "\n```\n",
        "```\n" + json.dumps(BODY) + "\n```",
        "```" + json.dumps(BODY) + "```",
        "\n  ```json\r\n" + json.dumps(BODY) + "\r\n```  ",
    ],
    ids=["plain", "whitespace", "json-fence", "upper-fence", "bare-fence", "one-line", "crlf"],
)
def test_parse_accepts_plain_and_fenced_json(text: str) -> None:
    assert parse_llm_content(text) == DANA


def test_parse_strips_dedupes_and_keeps_order() -> None:
    text = json.dumps(
        {
            "memories": [
                {"content": "  B first  ", "kind": "preference"},
                {"content": "A second", "kind": "event"},
                {"content": "B first", "kind": "fact"},  # same content after strip: dropped
                {"content": "a second", "kind": "fact"},  # differs in case: kept
            ]
        }
    )
    assert parse_llm_content(text) == [
        ExtractedMemory("B first", "preference"),
        ExtractedMemory("A second", "event"),
        ExtractedMemory("a second", "fact"),
    ]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("fact", "fact"),
        ("Preference", "preference"),
        (" EVENT ", "event"),
        ("other", "other"),
        ("habit", "other"),
        ("", "other"),
        (None, "other"),
    ],
)
def test_kind_is_normalized_and_unknown_kinds_become_other(kind: object, expected: str) -> None:
    text = json.dumps({"memories": [{"content": "x", "kind": kind}]})
    assert parse_llm_content(text) == [ExtractedMemory("x", expected)]


def test_missing_kind_is_other_and_unknown_keys_are_dropped() -> None:
    text = json.dumps({"memories": [{"content": "x", "confidence": 0.9}], "note": "hi"})
    assert parse_llm_content(text) == [ExtractedMemory("x", "other")]


def test_empty_memories_is_a_valid_empty_result() -> None:
    assert parse_llm_content('{"memories": []}') == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "Sure! Here are the memories.",
        "```json\nnot json\n```",
        '{"memories": [',
        "[]",
        '"memories"',
        "{}",
        '{"memories": null}',
        '{"memories": "The user is Dana."}',
        '{"memories": [{"kind": "fact"}]}',
        '{"memories": [{"content": "   "}]}',
        '{"memories": [{"content": 42}]}',
        '{"memories": [{"content": "x", "kind": 3}]}',
        '{"memories": ["The user is Dana."]}',
        json.dumps({"memories": [{"content": "x" * (MAX_CONTENT_CHARS + 1)}]}),
        json.dumps({"memories": [{"content": f"m{i}"} for i in range(MAX_MEMORIES + 1)]}),
    ],
)
def test_unusable_output_is_a_transient_error_never_no_memories(text: str) -> None:
    with pytest.raises(LLMUnavailableError, match=r"^unparseable LLM output: "):
        parse_llm_content(text)


def test_limits_are_inclusive() -> None:
    text = json.dumps(
        {"memories": [{"content": f"{i}" + "x" * (MAX_CONTENT_CHARS - 3)} for i in range(50)]}
    )
    assert len(parse_llm_content(text)) == MAX_MEMORIES


def test_parse_error_does_not_quote_the_conversation() -> None:
    with pytest.raises(LLMUnavailableError) as caught:
        parse_llm_content("My SSN is 123-45-6789, remember it")
    assert "123-45-6789" not in str(caught.value)


def test_to_json_is_the_canonical_persisted_form() -> None:
    result = ExtractionResult(
        memories=(ExtractedMemory("a", "fact"), ExtractedMemory("b", "event")),
        prompt_tokens=10,
        completion_tokens=5,
        provider="openai",
        model="m",
    )
    assert result.to_json() == {
        "memories": [{"content": "a", "kind": "fact"}, {"content": "b", "kind": "event"}]
    }
    assert ExtractionResult.from_json(result.to_json()).memories == result.memories


def test_from_json_keeps_duplicates_and_order_of_the_stored_list() -> None:
    stored = {"memories": [{"content": "b", "kind": "fact"}, {"content": "b", "kind": "fact"}]}
    assert [m.content for m in ExtractionResult.from_json(stored).memories] == ["b", "b"]


@pytest.mark.parametrize("data", [None, [], {}, {"memories": [{"content": ""}]}])
def test_from_json_rejects_invalid_stored_data(data: object) -> None:
    with pytest.raises(InvalidMessageError):
        ExtractionResult.from_json(data)


_content = st.text(min_size=1, max_size=200).map(str.strip).filter(bool)
_memory = st.builds(ExtractedMemory, content=_content, kind=st.sampled_from(KINDS))


@given(memories=st.lists(_memory, max_size=MAX_MEMORIES))
def test_to_json_from_json_round_trips(memories: list[ExtractedMemory]) -> None:
    result = ExtractionResult(memories=tuple(memories), provider="rules", model="rules-v1")
    data = result.to_json()
    assert json.loads(json.dumps(data)) == data
    again = ExtractionResult.from_json(json.loads(json.dumps(data)))
    assert again.memories == result.memories
    assert again.to_json() == data


@given(memories=st.lists(_memory, max_size=MAX_MEMORIES))
def test_parse_of_serialized_result_is_the_deduplicated_result(
    memories: list[ExtractedMemory],
) -> None:
    text = json.dumps(ExtractionResult(memories=tuple(memories)).to_json())
    expected: list[ExtractedMemory] = []
    for memory in memories:
        if memory.content not in {m.content for m in expected}:
            expected.append(memory)
    assert parse_llm_content(f"```json\n{text}\n```") == expected
