"""The paraphrase part of the search quality set: no question shares a content word with the
memories that answer it, and a pool that would break that is refused loudly."""

from __future__ import annotations

import pytest

from bench import BenchError, paraphrases
from bench.paraphrases import check, check_pool, shared_words, stem


def test_stem_folds_the_usual_suffixes() -> None:
    assert stem("running") == stem("run") == "run"
    assert stem("lives") == stem("live") == "liv"
    assert stem("allergies") == "allerg"


def test_shared_words_sees_inflections_and_prefixes_but_not_stop_words() -> None:
    assert shared_words("Where does she live?", "Dana lives in Lisbon.") == ["liv"]
    # "allerg" begins "allergic": shared, though the stems differ.
    assert shared_words("Any allergies?", "Dana is allergic to cats.") == ["allerg"]
    assert shared_words("What does she do to unwind?", "She goes running after work.") == []


def test_check_refuses_a_question_that_shares_a_word() -> None:
    with pytest.raises(BenchError, match="shares"):
        check("Which pets does she keep?", ["Dana keeps two rabbits."])
    check("What animal lives with her?", ["Dana has a dog named Biscuit."])


def test_the_pool_has_no_shared_word_in_any_pairing() -> None:
    assert check_pool() == []


def test_generate_is_deterministic_varied_and_labelled() -> None:
    agents = paraphrases.generate(10, 7)
    assert agents == paraphrases.generate(10, 7)
    assert agents != paraphrases.generate(10, 8)
    questions = [(a, q, ans, slot) for a in agents for q, ans, slot in a.questions]
    assert len(questions) >= 100
    assert len({q for _, q, _, _ in questions}) >= 80  # not one template repeated
    assert len({slot for *_, slot in questions}) >= 20
    for agent, question, answers, _ in questions:
        assert answers and all(0 <= i < len(agent.memories) for i in answers)
        # One person per store: every memory names the agent's person.
        assert all(agent.person in m for m in agent.memories)
        assert agent.person not in question
        for i in answers:
            assert shared_words(question, agent.memories[i]) == []
    # Each slot is asked about at most once per agent: one answer set per question.
    for agent in agents:
        slots = [slot for _, _, slot in agent.questions]
        assert len(slots) == len(set(slots))
