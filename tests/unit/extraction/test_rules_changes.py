"""The rules extractor's facts that change: which listed memory a new one replaces."""

from __future__ import annotations

import uuid

import pytest

from extraction.prompt import RelatedMemory
from extraction.providers import RulesProvider
from extraction.rules import extract_changes, slot_of
from sessions.turns import TurnRecord

RELATED = [
    ("m1", "The user lives in Lisbon."),
    ("m2", "The user works at Acme."),
    ("m3", "The user loves tea."),
    ("m4", "The user is allergic to peanuts."),
    ("m5", "The user's favorite color is green."),
    ("m6", "The user works as a nurse."),
]


def turn(text: str) -> TurnRecord:
    said = [{"role": "user", "content": text}]
    return TurnRecord(uuid.uuid4(), 1, said, {"role": "assistant", "content": "Noted."}, 0, 0, 0)


@pytest.mark.parametrize(
    ("said", "content", "replaces"),
    [
        ("I moved to Oslo.", "The user moved to Oslo.", ("m1",)),
        ("I live in Oslo now.", "The user lives in Oslo.", ("m1",)),
        ("I started a new job at Globex.", "The user works at Globex.", ("m2",)),
        ("I work at Globex now.", "The user works at Globex.", ("m2",)),
        ("I don't like tea anymore.", "The user dislikes tea.", ("m3",)),
        ("My favorite color is blue now.", "The user's favorite color is blue.", ("m5",)),
        ("I work as a teacher now.", "The user works as a teacher.", ("m6",)),
    ],
)
def test_a_changed_fact_replaces_the_listed_one(
    said: str, content: str, replaces: tuple[str, ...]
) -> None:
    [memory] = extract_changes(turn(said), RELATED)
    assert (memory.content, memory.replaces) == (content, replaces)


@pytest.mark.parametrize(
    "said",
    [
        "I live in Turin.",  # no word of change: maybe another person of an agent-wide scope
        "I live in Lisbon now.",  # the same value: nothing changes (a duplicate)
        "I'm allergic to shellfish now.",  # no slot: allergies add up
        "I love coffee now.",  # another object: tastes add up
    ],
)
def test_nothing_is_replaced_without_a_change_of_a_slot(said: str) -> None:
    assert all(not m.replaces for m in extract_changes(turn(said), RELATED))


def test_without_related_memories_the_memories_are_the_same() -> None:
    [memory] = extract_changes(turn("I moved to Oslo."))
    assert memory.replaces == ()


def test_slots() -> None:
    assert slot_of("The user lives in Lisbon.") == ("home", "lisbon")
    assert slot_of("The user moved to Oslo.") == ("home", "oslo")
    assert slot_of("The user dislikes tea.") == ("taste:tea", "-")
    assert slot_of("The user is a fan of jazz.") == ("taste:jazz", "+")
    assert slot_of("The user's name is Dana.") is None
    assert slot_of("The user is allergic to peanuts.") is None


def test_the_rules_provider_answers_with_refs() -> None:
    related = [RelatedMemory("m1", "The user lives in Lisbon.", "fact")]
    result = RulesProvider().extract(turn("I moved to Oslo."), [], related)
    assert [(m.content, m.replaces) for m in result.memories] == [
        ("The user moved to Oslo.", ("m1",))
    ]


def test_an_answer_names_refs_never_ids() -> None:
    from extraction.result import parse_llm_content

    answer = (
        '{"memories": [{"content": "The user lives in Oslo.", "kind": "fact",'
        ' "replaces": "m2", "supersedes": ["not-an-id"]},'
        ' {"content": "The user works at Globex.", "replaces": [3, "m1", "m1", null]}]}'
    )
    first, second = parse_llm_content(answer)
    assert (first.replaces, first.supersedes) == (("m2",), ())
    assert (second.replaces, second.supersedes) == (("m1",), ())
