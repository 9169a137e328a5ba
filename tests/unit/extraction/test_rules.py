"""The rules extractor over a table of sentences, and what it must leave alone."""

from __future__ import annotations

from typing import Any

import pytest

from extraction.rules import extract_rules, extract_text, new_user_texts
from tests.unit.extraction.helpers import make_turn

F, P, E = "fact", "preference", "event"

CASES: list[tuple[str, list[tuple[str, str]]]] = [
    # names
    (
        "Hi, I'm Dana and I'm allergic to peanuts.",
        [("The user's name is Dana.", F), ("The user is allergic to peanuts.", F)],
    ),
    ("my name is dana", [("The user's name is Dana.", F)]),
    ("My name is Dana Scully.", [("The user's name is Dana Scully.", F)]),
    ("Call me Dee.", [("The user's name is Dee.", F)]),
    ("I am Dana", [("The user's name is Dana.", F)]),
    ("Im Dana", [("The user's name is Dana.", F)]),
    ("I'M DANA!", [("The user's name is Dana.", F)]),
    ("Thanks! I'm Bob, btw.", [("The user's name is Bob.", F)]),
    ("I\u2019m Zoë.", [("The user's name is Zoë.", F)]),
    # allergies and diet
    (
        "I'm allergic to shellfish and penicillin!",
        [("The user is allergic to shellfish and penicillin.", F)],
    ),
    ("I am severely allergic to bee stings", [("The user is allergic to bee stings.", F)]),
    ("im allergic to cats", [("The user is allergic to cats.", F)]),
    ("I have a peanut allergy.", [("The user has a peanut allergy.", F)]),
    ("I'm vegan.", [("The user is vegan.", F)]),
    ("I'm lactose intolerant", [("The user is lactose intolerant.", F)]),
    ("I'm French.", [("The user is French.", F)]),
    # preferences
    ("I love hiking in the mountains.", [("The user loves hiking in the mountains.", P)]),
    ("I really like my morning coffee!", [("The user likes their morning coffee.", P)]),
    ("I prefer tea over coffee.", [("The user prefers tea over coffee.", P)]),
    ("i enjoy sci-fi novels", [("The user enjoys sci-fi novels.", P)]),
    ("I hate cilantro.", [("The user hates cilantro.", P)]),
    ("I dislike crowded places", [("The user dislikes crowded places.", P)]),
    ("I don't like horror movies.", [("The user dislikes horror movies.", P)]),
    ("I can't stand loud music", [("The user can't stand loud music.", P)]),
    ("My favorite color is blue.", [("The user's favorite color is blue.", P)]),
    (
        "My favourite foods are sushi and ramen",
        [("The user's favorite foods are sushi and ramen.", P)],
    ),
    ("I'm a big fan of jazz.", [("The user is a big fan of jazz.", P)]),
    # places
    ("I live in Berlin.", [("The user lives in Berlin.", F)]),
    ("I live in St. Louis with my wife.", [("The user lives in St. Louis with their wife.", F)]),
    ("I'm from Toronto, Canada.", [("The user is from Toronto, Canada.", F)]),
    ("By the way, I work for the city council.", [("The user works for the city council.", F)]),
    ("I work at Google.", [("The user works at Google.", F)]),
    ("I moved to Lisbon last year.", [("The user moved to Lisbon last year.", F)]),
    ("I just moved to Denver", [("The user moved to Denver.", F)]),
    # plans and events
    ("I'm going to Paris next week.", [("The user is going to Paris next week.", E)]),
    ("I plan to run a marathon in October.", [("The user plans to run a marathon in October.", E)]),
    (
        "I'm planning to visit Japan next spring.",
        [("The user is planning to visit Japan next spring.", E)],
    ),
    ("My birthday is March 3rd.", [("The user's birthday is March 3rd.", E)]),
    (
        "I have a dentist appointment on Friday.",
        [("The user has a dentist appointment on Friday.", E)],
    ),
    ("I'm getting married in June.", [("The user is getting married in June.", E)]),
    ("I'm in London this week.", [("The user is in London this week.", E)]),
    ("I'll be in Tokyo next month.", [("The user will be in Tokyo next month.", E)]),
    ("I have an exam on Monday.", [("The user has an exam on Monday.", E)]),
    (
        "I have a flight to NYC tomorrow morning.",
        [("The user has a flight to NYC tomorrow morning.", E)],
    ),
    # remember that
    ("Remember that my sister's name is Ana.", [("The user's sister's name is Ana.", F)]),
    ("Please remember that the wifi password is hunter2", [("The wifi password is hunter2.", F)]),
    ("Remember that I always sit by the window.", [("The user always sits by the window.", F)]),
    ("Remember: I'm allergic to latex.", [("The user is allergic to latex.", F)]),
    (
        "remember that I never drink coffee after 2pm",
        [("The user never drinks coffee after 2pm.", F)],
    ),
    (
        "Don't forget that I have to leave early on Fridays",
        [("The user has to leave early on Fridays.", F)],
    ),
    ("Remember that Sam is my brother.", [("Sam is the user's brother.", F)]),
    # roles and life
    ("I am a nurse.", [("The user is a nurse.", F)]),
    (
        "I'm an architect at a small firm in Lyon.",
        [("The user is an architect at a small firm in Lyon.", F)],
    ),
    ("I work as a data scientist.", [("The user works as a data scientist.", F)]),
    ("I have a dog named Rex.", [("The user has a dog named Rex.", F)]),
    ("I've got a cat called Miso", [("The user has a cat named Miso.", F)]),
    ("My dog's name is Biscuit.", [("The user has a dog named Biscuit.", F)]),
    ("I have two kids.", [("The user has two kids.", F)]),
    ("I'm 34 years old.", [("The user is 34 years old.", F)]),
    # several sentences, in order, no duplicates
    (
        "I'm Dana. I love tea! I love tea. Do you like tea? I live in Oslo",
        [
            ("The user's name is Dana.", F),
            ("The user loves tea.", P),
            ("The user lives in Oslo.", F),
        ],
    ),
    ("I love tea but I hate coffee", [("The user loves tea.", P), ("The user hates coffee.", P)]),
    (
        "Hello!\nI'm allergic to nuts\nI live in Rome",
        [("The user is allergic to nuts.", F), ("The user lives in Rome.", F)],
    ),
]

NOTHING = [
    "Do you know if I'm allergic to peanuts?",
    "What should I eat if I love spicy food?",
    "Am I allergic to peanuts?",
    "I'm not allergic to anything.",
    "I don't live in Paris.",
    "I used to live in Rome.",
    "If I lived in Rome I would love it.",
    "I'm sorry.",
    "I'm happy.",
    "I'm a bit tired.",
    "I'm going to ask you something.",
    "I like it.",
    "I love you.",
    "I like your answer.",
    "I have a question about my taxes.",
    "I have an error in my code on line 5.",
    "I'm in trouble.",
    "I'm getting an error.",
    "I'm having trouble with my printer.",
    "I want to learn Python.",
    "I'm trying to fix a bug in my code.",
    "call me later",
    "Can you help me with my resume",
    "Thanks, that's great!",
    "",
    "   ",
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0][:40] for c in CASES])
def test_sentence_table(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(m.content, m.kind) for m in extract_text(text)] == expected


@pytest.mark.parametrize("text", NOTHING)
def test_no_memory_from_questions_negations_and_small_talk(text: str) -> None:
    assert extract_text(text) == []


@pytest.mark.parametrize("text,_", CASES[:20])
def test_every_memory_is_one_sentence_with_one_period(text: str, _: object) -> None:
    for memory in extract_text(text):
        assert memory.content.endswith(".")
        assert not memory.content.endswith("..")
        assert memory.content[0].isupper()
        assert memory.content == memory.content.strip()


def test_only_user_messages_are_read_not_the_completion() -> None:
    turn = make_turn("What's the weather like?", completion="I'm Claude and I love rain.")
    assert extract_rules(turn) == []


def test_assistant_messages_in_the_history_are_ignored() -> None:
    history = [{"role": "assistant", "content": "I'm Dana's assistant. I live in Paris."}]
    assert extract_rules(make_turn("Thanks.", history=history)) == []


def test_earlier_user_messages_belong_to_earlier_turns() -> None:
    history = [
        {"role": "system", "content": "I am a helpful bot."},
        {"role": "user", "content": "I'm Dana."},
        {"role": "assistant", "content": "Hi Dana!"},
    ]
    turn = make_turn("I love tea.", history=history, turn_index=2)
    assert [m.content for m in extract_rules(turn)] == ["The user loves tea."]
    assert new_user_texts(turn) == ["I love tea."]


def test_several_new_user_messages_are_all_read_and_deduplicated() -> None:
    turn = make_turn("I'm Dana.", "I love tea.", "I'm Dana.")
    assert [m.content for m in extract_rules(turn)] == [
        "The user's name is Dana.",
        "The user loves tea.",
    ]


def test_content_parts_are_read() -> None:
    turn = make_turn("placeholder")
    turn.messages[-1]["content"] = [
        {"type": "text", "text": "I live in Oslo."},
        {"type": "image_url", "image_url": {"url": "https://example.test/x.png"}},
    ]
    assert [m.content for m in extract_rules(turn)] == ["The user lives in Oslo."]


def test_odd_messages_are_skipped() -> None:
    turn = make_turn("I love tea.")
    odd: list[Any] = [{"role": "user", "content": None}, "junk", {"role": "user"}]
    turn.messages.extend(odd)
    assert [m.content for m in extract_rules(turn)] == ["The user loves tea."]


def test_same_input_same_output() -> None:
    text = "\n".join(c[0] for c in CASES)
    first = [(m.content, m.kind) for m in extract_text(text)]
    assert first == [(m.content, m.kind) for m in extract_text(text)]
    assert len(first) == len(set(first))
    assert len(first) > 40


def test_case_insensitive() -> None:
    assert extract_text("I LOVE HIKING") == extract_text("i love HIKING")
    assert [m.content for m in extract_text("MY NAME IS DANA")] == ["The user's name is Dana."]


def test_long_statements_are_not_memories() -> None:
    assert extract_text("I love " + "very " * 100 + "long things") == []


# Diets and family members: the sentences the first version skipped.
DIET_AND_FAMILY: list[tuple[str, list[tuple[str, str]]]] = [
    ("I'm vegetarian.", [("The user is vegetarian.", F)]),
    ("I don't eat meat.", [("The user doesn't eat meat.", F)]),
    ("I never eat pork.", [("The user never eats pork.", F)]),
    ("I avoid dairy.", [("The user avoids dairy.", F)]),
    ("I'm on a keto diet.", [("The user follows a keto diet.", F)]),
    ("I follow a vegan diet.", [("The user follows a vegan diet.", F)]),
    ("I eat gluten-free.", [("The user eats gluten-free.", F)]),
    (
        "My daughter Sofia is allergic to shellfish.",
        [("The user's daughter Sofia is allergic to shellfish.", F)],
    ),
    (
        "My 5-year-old daughter is allergic to eggs.",
        [("The user's 5-year-old daughter is allergic to eggs.", F)],
    ),
    ("My daughter's name is Sofia.", [("The user's daughter's name is Sofia.", F)]),
    ("My son Leo is 7.", [("The user's son Leo is 7.", F)]),
    ("My son is named Leo.", [("The user's son is named Leo.", F)]),
    ("My wife is a nurse.", [("The user's wife is a nurse.", F)]),
    ("My husband is vegan.", [("The user's husband is vegan.", F)]),
    ("My daughter is lactose intolerant.", [("The user's daughter is lactose intolerant.", F)]),
    ("My mom lives in Porto.", [("The user's mom lives in Porto.", F)]),
    ("My dad is from Lisbon.", [("The user's dad is from Lisbon.", F)]),
    ("My brother, Tom, works at Google.", [("The user's brother Tom works at Google.", F)]),
    ("My sister doesn't eat pork.", [("The user's sister doesn't eat pork.", F)]),
    ("My husband loves jazz.", [("The user's husband loves jazz.", P)]),
    ("My mother loves my cooking.", [("The user's mother loves the user's cooking.", P)]),
    (
        "Hi! I'm Dana. My daughter Sofia is allergic to shellfish and I'm vegetarian.",
        [
            ("The user's name is Dana.", F),
            ("The user's daughter Sofia is allergic to shellfish.", F),
            ("The user is vegetarian.", F),
        ],
    ),
]

# Said of a relative but not a lasting fact, negated, or not a statement at all.
NOT_ABOUT_RELATIVES = [
    "My son isn't allergic to nuts.",
    "My husband doesn't love jazz.",
    "My wife is in Rome this week.",
    "My son is sick.",
    "My son is going to ask you something.",
    "Does my son like it?",
    "My daughter is here.",
    "I don't know.",
]


@pytest.mark.parametrize(
    ("text", "expected"), DIET_AND_FAMILY, ids=[c[0][:40] for c in DIET_AND_FAMILY]
)
def test_diets_and_family_members(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(m.content, m.kind) for m in extract_text(text)] == expected


@pytest.mark.parametrize("text", NOT_ABOUT_RELATIVES)
def test_no_memory_from_passing_or_negated_statements_about_relatives(text: str) -> None:
    assert extract_text(text) == []


def test_diet_and_family_extraction_is_deterministic() -> None:
    text = " ".join(t for t, _ in DIET_AND_FAMILY)
    first = [(m.content, m.kind) for m in extract_text(text)]
    assert first == [(m.content, m.kind) for m in extract_text(text)]
    assert len(first) == len({content for content, _ in first})
