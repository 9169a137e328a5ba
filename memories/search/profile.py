"""The person's standing facts: what every context block about them starts with, whatever was
asked.

A chat assistant asked for "a snack for my trip" must know the peanut allergy, though the
question shares no word (and, for a static embedding model, almost no meaning) with it. So a
context block does not rely on the query alone: it carries the facts about the person that
bear on almost any request (what they must avoid, who they are, where they live, the people
and animals in their life) before the memories the query finds.

The choice is a rule over each memory's text, not a model: a handful of regular expressions,
run in the process over the rows one indexed read returned (no LLM call, no embedding, no
extra round trip per class). The classes, in the order they are packed:

1. **constraints** (:data:`CONSTRAINT`): allergies, intolerances, diets, conditions and
   medication, accessibility ("allergic", "vegan", "halal", "coeliac", "diabetes",
   "wheelchair", "hard of hearing", "does not eat", "sober", ...): the facts whose absence
   from an answer can harm;
2. **identity** (:data:`IDENTITY`): name, age, occupation, origin;
3. **home** (:data:`HOME`): where they live or moved to;
4. **people** (:data:`PEOPLE`): partner, children, parents, siblings, friends, pets.

Within a class, the newest memory first. A memory matching no class is not a standing fact
(it still comes in when it is relevant to the query, or when all of the person's memories fit
the budget). The rule reads English; a memory in another language matches no class.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

CONSTRAINT = re.compile(
    r"\b(allerg\w*|anaphyla\w*|intoleran\w*|coeliac|celiac|gluten|lactose|vegan\w*"
    r"|vegetarian\w*|pescatarian|halal|kosher|diabet\w*|asthma\w*|epilep\w*|pregnan\w*"
    r"|wheelchair|crutches|disabilit\w*|disabled|blind|deaf|hard of hearing"
    r"|colou?r[- ]blind|dyslex\w*|autis\w*|medication|blood thinners?|epipen|insulin"
    r"|sober|teetotal\w*|dietary|diet)\b"
    r"|\b(does not|doesn't|do not|don't|cannot|can't|can not|never|must not|mustn't)"
    r" (eat|drink|have|take|be given|tolerate|climb|walk)\b"
    r"|\bno (alcohol|pork|meat|dairy|nuts|fish|eggs)\b",
    re.IGNORECASE,
)
IDENTITY = re.compile(
    r"\b(name is|is called|goes by|pronouns?|years old|aged \d+|born"
    r"|works (as|at|for|in)|job|profession|occupation|career|retired|retiree"
    r"|student|grew up|originally from|is from|comes from|raised in|native|nationality"
    r"|citizen)\b",
    re.IGNORECASE,
)
HOME = re.compile(
    r"\b(lives?|living|moved|relocated|resides?|settled|based in|home ?town|rents?"
    r"|flat in|apartment in|house (in|near)|address)\b",
    re.IGNORECASE,
)
PEOPLE = re.compile(
    r"\b(wife|husband|spouse|partner|girlfriend|boyfriend|fianc\w*|married|daughters?|sons?"
    r"|child|children|kids?|baby|twins?|mother|father|mum|mom|dad|parents?|sisters?"
    r"|brothers?|siblings?|only child|grand\w+|aunt|uncle|cousin|niece|nephew|friends?"
    r"|roommate|flatmate|boss|manager|colleague|dog|cat|pets?|puppy|kitten|rabbits?)\b",
    re.IGNORECASE,
)
#: The classes in packing order; a memory takes the first it matches.
CLASSES = (("constraint", CONSTRAINT), ("identity", IDENTITY), ("home", HOME), ("people", PEOPLE))


#: Texts whose class is kept: a context reads the same person's newest memories at every
#: turn, and the regular expressions cost about 0.1 ms a memory (200 of them per block).
CLASS_CACHE = 8192


@functools.lru_cache(maxsize=CLASS_CACHE)
def standing_class(content: str) -> int | None:
    """The index in :data:`CLASSES` of the first class ``content`` matches; None: not a
    standing fact. A pure function of the text, so its answers are cached."""
    for index, (_, pattern) in enumerate(CLASSES):
        if pattern.search(content):
            return index
    return None


class _Memory(Protocol):
    @property
    def content(self) -> str: ...


M = TypeVar("M", bound=_Memory)


def standing_facts(rows: Sequence[M]) -> list[M]:
    """The standing facts among ``rows`` (newest first, as :meth:`SearchStore.profile` reads
    them), in packing order: by class, then newest first."""
    ranked = [(standing_class(r.content), i, r) for i, r in enumerate(rows)]
    chosen = [(c, i, r) for c, i, r in ranked if c is not None]
    chosen.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in chosen]
