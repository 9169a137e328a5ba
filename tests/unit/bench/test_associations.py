"""The association part of the search quality set: chat-style questions whose answers share no
content word with them, over people of 20-50 facts, from templates and by hand, with questions
no memory answers; a pool that breaks the rule is refused loudly."""

from __future__ import annotations

from collections import Counter

import pytest

from bench import BenchError, associations
from bench.associations import HAND, MAX_FACTS, MIN_FACTS, SLOTS, check_pool, generate


def test_no_question_of_the_pool_shares_a_word_with_an_answer() -> None:
    assert check_pool() == []


def test_a_pool_that_shares_a_word_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = associations.Slot(
        "home", "home", (("The user lives in Lisbon.",),), ("Where do I live?",)
    )
    monkeypatch.setattr(associations, "SLOTS", (bad,))
    assert check_pool() and "liv" in check_pool()[0]
    monkeypatch.setattr(associations, "HAND", ())
    with pytest.raises(BenchError, match="shares"):
        generate(1, 7)


def test_the_default_set_has_enough_questions_of_each_kind() -> None:
    people = generate(30, 7)
    assert all(MIN_FACTS <= len(p.memories) <= MAX_FACTS for p in people)
    kinds = Counter(k for p in people for k, _, _, _ in p.questions)
    assert kinds["association"] + kinds["association-hand"] >= 150
    assert kinds["association-hand"] == len(HAND)
    assert kinds["no-answer"] >= 30
    for person in people:
        for kind, question, answers, slot in person.questions:
            if kind == "no-answer":
                assert answers == ()
                continue
            assert answers and all(0 <= i < len(person.memories) for i in answers)
            # The answer is the slot's value as this person holds it.
            values = {m for s in SLOTS if s.name == slot for v in s.values for m in v}
            assert {person.memories[i] for i in answers} <= values, question


def test_the_set_is_deterministic_and_people_differ() -> None:
    first = generate(5, 7)
    assert [(p.memories, p.questions) for p in first] == [
        (p.memories, p.questions) for p in generate(5, 7)
    ]
    assert len({tuple(p.memories) for p in first}) == 5
    assert generate(0, 7) == []
