"""A usual message of a turn or a slot is loaded without marshmallow (schema.messages.
quick_load), to the values its schema loads; anything else is left to the schema."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidMessageError
from extraction.dispatch import ROUTES
from schema.messages import MESSAGE_SCHEMAS, ActorName, quick_load

ORG, SESSION = uuid.uuid4(), uuid.uuid4()
FIELDS = ("org_id", "session_id", "turn_index", "ordinal")
TURN_ACTORS = (ActorName.EXTRACT, ActorName.WRITE, ActorName.POINTER)

ids = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: u.hex),  # forms uuid.UUID reads too
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    st.uuids().map(lambda u: u.urn),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids(),  # already a UUID: the schema's business
    st.uuids().map(lambda u: u.bytes),
    st.text(max_size=40),
)
values = st.one_of(
    ids, st.integers(-3, 3), st.integers(), st.booleans(), st.none(), st.floats(), st.text()
)
messages = st.dictionaries(st.sampled_from([*FIELDS, "extra", "queue"]), values, max_size=6)


def schema_load(actor: str, data: dict[str, Any]) -> Any:
    return MESSAGE_SCHEMAS[actor]().load(data)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(TURN_ACTORS), messages)
def test_what_it_loads_is_what_the_schema_loads(actor: str, data: dict[str, Any]) -> None:
    quick = quick_load(actor, data)
    if quick is None:
        return  # the schema's to load or refuse
    expected = schema_load(actor, data)
    assert quick == expected
    assert {k: type(v) for k, v in quick.items()} == {k: type(v) for k, v in expected.items()}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(TURN_ACTORS), st.uuids(), st.uuids(), st.integers(1), st.integers(0))
def test_a_usual_message_is_loaded_quickly(
    actor: str, org: uuid.UUID, session: uuid.UUID, turn: int, ordinal: int
) -> None:
    data: dict[str, Any] = {"org_id": str(org), "session_id": str(session), "turn_index": turn}
    if actor == ActorName.WRITE:
        data["ordinal"] = ordinal
    assert quick_load(actor, data) == schema_load(actor, data)


@pytest.mark.parametrize(
    "data",
    [
        {"org_id": str(ORG), "session_id": str(SESSION)},  # a field missing
        {"org_id": str(ORG), "session_id": str(SESSION), "turn_index": 0},
        {"org_id": str(ORG), "session_id": str(SESSION), "turn_index": True},
        {"org_id": str(ORG), "session_id": str(SESSION), "turn_index": 1.0},
        {"org_id": str(ORG), "session_id": "not-a-uuid", "turn_index": 1},
        {"org_id": ORG, "session_id": str(SESSION), "turn_index": 1},
        {"org_id": str(ORG), "session_id": str(SESSION), "turn_index": 1, "ordinal": 0},
    ],
)
def test_anything_unusual_is_left_to_the_schema(data: dict[str, Any]) -> None:
    assert quick_load(ActorName.EXTRACT, data) is None


def test_a_scans_message_is_left_to_the_schema() -> None:
    assert quick_load(ActorName.SCAN, {"session_id": str(SESSION)}) is None


def test_a_route_loads_a_usual_message_without_its_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    route = ROUTES[ActorName.WRITE]
    data = {"org_id": str(ORG), "session_id": str(SESSION), "turn_index": 2, "ordinal": 1}
    expected = {"org_id": ORG, "session_id": SESSION, "turn_index": 2, "ordinal": 1}
    monkeypatch.setattr(route.schema, "load", None)  # any call would fail
    assert route.load(data) == expected


def test_a_bad_message_is_still_refused_field_by_field() -> None:
    data = {"org_id": str(ORG), "session_id": "nope", "turn_index": 0, "ordinal": 1}
    with pytest.raises(InvalidMessageError) as refused:
        ROUTES[ActorName.WRITE].load(data)
    assert "session_id" in str(refused.value) and "turn_index" in str(refused.value)
