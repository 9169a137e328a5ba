"""Packing memories into a token budget: never over it, no near-duplicate twice, deterministic."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memories.search.context import (
    NEAR_DUPLICATE,
    _words,
    estimate_tokens,
    fits,
    near_duplicate,
    pack,
    pack_parts,
    query_from_messages,
    render,
)
from schema.recall import CLOSE, OPEN, neutralise, strip_recalled
from tests.conftest import examples

texts = st.lists(st.text(min_size=0, max_size=300), max_size=30)


@settings(max_examples=examples(300), deadline=None)
@given(contents=texts, budget=st.integers(min_value=1, max_value=2000))
def test_never_over_budget(contents: list[str], budget: int) -> None:
    packed = pack(contents, budget)
    assert packed.tokens == estimate_tokens(packed.context)
    assert packed.tokens <= budget
    assert packed.dropped == len(contents) - len(packed.chosen)
    assert packed.chosen == sorted(packed.chosen)
    assert pack(contents, budget) == packed  # deterministic
    if packed.chosen:
        assert packed.context.startswith(OPEN + "\n") and packed.context.endswith("\n" + CLOSE)
        # One line per memory, and the block cannot be closed early by a memory's text.
        assert packed.context.count(CLOSE) == 1
        assert len(packed.context.splitlines()) == len(packed.chosen) + 2
        # Stripping the block leaves nothing of it: what the extractor will see.
        assert strip_recalled(packed.context) == ""
    else:
        assert packed.context == ""


@settings(deadline=None)
@given(contents=texts)
def test_a_generous_budget_drops_only_blanks_and_near_duplicates(contents: list[str]) -> None:
    packed = pack(contents, 100_000)
    kept = [_words(neutralise(contents[i])) for i in packed.chosen]
    for index, content in enumerate(contents):
        if index in packed.chosen:
            continue
        line = neutralise(content)
        assert not line or any(near_duplicate(_words(line), other) for other in kept)


words = st.frozensets(st.sampled_from([f"w{n}" for n in range(12)]), max_size=12)


@settings(max_examples=examples(500), deadline=None)
@given(a=words, b=words)
def test_near_duplicate_is_the_jaccard_similarity_at_its_threshold(
    a: frozenset[str], b: frozenset[str]
) -> None:
    # The size test that skips the intersection gives the answer of the similarity itself.
    expected = a == b if not a or not b else len(a & b) / len(a | b) >= NEAR_DUPLICATE
    assert near_duplicate(a, b) is expected
    assert near_duplicate(b, a) is expected


def test_near_duplicate_at_exactly_the_threshold() -> None:
    four, five = frozenset("abcd"), frozenset("abcde")
    assert len(four & five) / len(four | five) == NEAR_DUPLICATE  # 4 / 5
    assert near_duplicate(four, five) and near_duplicate(five, four)
    assert not near_duplicate(frozenset("abc"), five)  # 3 / 5: sizes alone decide
    eight, ten = frozenset("abcdefgh"), frozenset("abcdefgxyz")
    assert not near_duplicate(eight, ten)  # 7 / 11, though the sizes allow it


def test_near_duplicates_are_packed_once() -> None:
    contents = [
        "Dana is allergic to peanuts.",
        "dana is allergic to peanuts!",
        "Dana is  allergic to PEANUTS",
        "Dana lives in Lisbon.",
    ]
    packed = pack(contents, 400)
    assert packed.chosen == [0, 3]
    assert (
        packed.context
        == "<memories>\n- Dana is allergic to peanuts.\n- Dana lives in Lisbon.\n</memories>"
    )
    assert packed.dropped == 2


def test_a_memory_that_does_not_fit_leaves_room_for_a_shorter_one() -> None:
    contents = ["x" * 200, "Short one."]
    budget = estimate_tokens(render(["Short one."]))
    packed = pack(contents, budget)
    assert packed.chosen == [1]
    assert packed.tokens == budget
    assert pack(contents, budget - 1).context == ""


def test_token_estimate_rule() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("é") == 1  # two UTF-8 bytes
    assert estimate_tokens("€€") == 2  # six bytes


def test_query_from_messages_uses_the_last_user_messages_without_recalled_blocks() -> None:
    messages = [
        {"role": "system", "content": "You help.\n<memories>\n- Dana likes tea.\n</memories>"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": [{"type": "text", "text": "three"}]},
        {"role": "user", "content": "<memories>\n- old\n</memories>What does Dana eat?"},
    ]
    assert query_from_messages(messages) == "two\nthree\nWhat does Dana eat?"


@settings(max_examples=examples(200), deadline=None)
@given(
    standing=texts,
    relevant=texts,
    budget=st.integers(min_value=1, max_value=2000),
    share=st.floats(min_value=0, max_value=1),
)
def test_the_standing_part_keeps_its_share_and_the_block_its_budget(
    standing: list[str], relevant: list[str], budget: int, share: float
) -> None:
    cap = int(budget * share)
    packed = pack_parts(standing, relevant, budget, standing_tokens=cap)
    assert packed.tokens == estimate_tokens(packed.context) <= budget
    assert packed.chosen == sorted(packed.chosen)
    assert packed.dropped == len(standing) + len(relevant) - len(packed.chosen)
    first = [i for i in packed.chosen if i < len(standing)]
    head = pack_parts([standing[i] for i in first], [], budget, standing_tokens=cap)
    assert head.tokens <= cap or not first  # the standing lines alone fit their share
    assert pack_parts(standing, relevant, budget, standing_tokens=cap) == packed


def test_standing_lines_come_first_and_the_query_fills_the_rest() -> None:
    standing = ["The user is allergic to peanuts.", "The user moved to Munich."]
    relevant = ["The user plays the cello.", "The user is allergic to peanuts!"]
    packed = pack_parts(standing, relevant, 400, standing_tokens=300)
    assert packed.context == render(
        [
            "The user is allergic to peanuts.",
            "The user moved to Munich.",
            "The user plays the cello.",
        ]
    )
    assert packed.chosen == [0, 1, 2] and packed.dropped == 1  # the near-duplicate
    # A share too small for the second standing line: it is left out, the query's still fits.
    small = estimate_tokens(render(standing[:1]))
    packed = pack_parts(standing, relevant, 400, standing_tokens=small)
    assert packed.chosen == [0, 2]


def test_fits_counts_near_duplicates_once() -> None:
    texts_ = ["The user moved to Munich.", "the user moved to munich!"]
    exact = estimate_tokens(render(texts_[:1]))
    assert fits(texts_, exact)
    assert not fits(texts_, exact - 1)
    assert fits([], 1)


@settings(max_examples=examples(200), deadline=None)
@given(contents=texts, budget=st.integers(min_value=1, max_value=2000))
def test_fits_agrees_with_packing_everything(contents: list[str], budget: int) -> None:
    everything = pack(contents, 10**9)
    assert fits(contents, budget) == (everything.tokens <= budget)
