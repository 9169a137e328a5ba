"""Standing facts: a rule over a memory's text picks the constraints, who the person is, where
they live and their people, in that order, newest first within a class; anything else is not
a standing fact."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from memories.search.profile import standing_class, standing_facts
from memories.store import MemoryRow


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("The user is allergic to peanuts.", 0),
        ("The user has coeliac disease.", 0),
        ("The user is vegetarian.", 0),
        ("The user does not eat pork.", 0),
        ("The user uses a wheelchair.", 0),
        ("The user is hard of hearing.", 0),
        ("The user's name is Priya.", 1),
        ("The user works as a nurse.", 1),
        ("The user grew up in Nigeria.", 1),
        ("The user moved to Munich.", 2),
        ("The user lives in Lisbon.", 2),
        ("The user's wife is Anna.", 3),
        ("The user has a dog called Rex.", 3),
        ("The user plays the cello.", None),
        ("The user supports Arsenal.", None),
        ("Der Nutzer ist gegen Erdnüsse allergisch.", 0),
        ("Der Nutzer wohnt in München.", None),
    ],
)
def test_the_class_of_a_memory(content: str, expected: int | None) -> None:
    assert standing_class(content) == expected


def _row(content: str, minutes: int) -> MemoryRow:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return MemoryRow(
        id=uuid.uuid4(),
        org_id=uuid.uuid4(),
        agent_id=uuid.uuid4(),
        session_id=None,
        turn_index=None,
        ordinal=None,
        content=content,
        content_hash="",
        kind="fact",
        metadata={},
        created_at=now - dt.timedelta(minutes=minutes),
        idempotency_key=None,
        request_fingerprint=None,
    )


def test_standing_facts_are_by_class_then_newest_first() -> None:
    rows = [  # newest first, as the profile read returns them
        _row("The user's sister is Ines.", 1),
        _row("The user plays chess.", 2),
        _row("The user moved to Munich.", 3),
        _row("The user is allergic to sesame.", 4),
        _row("The user is lactose intolerant.", 5),
        _row("The user lives in Lisbon.", 6),
    ]
    chosen = [r.content for r in standing_facts(rows)]
    assert chosen == [
        "The user is allergic to sesame.",
        "The user is lactose intolerant.",
        "The user moved to Munich.",
        "The user lives in Lisbon.",
        "The user's sister is Ines.",
    ]
