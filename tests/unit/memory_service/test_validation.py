"""The fast path for POST bodies agrees with marshmallow: whatever it accepts, the schema accepts
with the same result; whatever is doubtful it leaves to the schema (and its 422)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from memories.validation import quick_load_create
from schema.memory import MemoryCreateSchema
from tests.conftest import examples

SCHEMA = MemoryCreateSchema()
AGENT = str(uuid.uuid4())
SESSION = str(uuid.uuid4())

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
uuids = st.uuids().map(str) | st.sampled_from([AGENT.upper(), AGENT.replace("-", ""), "x", ""])
ints = st.integers(min_value=-2, max_value=2**31 + 1) | st.sampled_from([True, 1.0, "1"])
valid_ints = st.integers(min_value=1, max_value=2**31 - 1)
sources = st.one_of(
    st.fixed_dictionaries(
        {"session_id": st.uuids().map(str)},
        optional={"turn_index": valid_ints | st.none(), "ordinal": valid_ints | st.none()},
    ),
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "session_id": uuids | json_scalars,
            "turn_index": ints | st.none(),
            "ordinal": ints | st.none(),
            "extra": json_scalars,
        },
    ),
    json_scalars,
)
contents = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(["", " ", "\t\n", "a\x00", "\ud800", "x" * 4000, "x" * 4001, "é" * 4000]),
    json_scalars,
)

embeddings = st.one_of(
    st.fixed_dictionaries(
        {
            "model": st.text(min_size=1, max_size=8),
            "vector": st.lists(
                st.floats(allow_nan=False, allow_infinity=False) | st.integers(-3, 3),
                min_size=1,
                max_size=6,
            ),
        }
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.text(max_size=3) | json_scalars,
            "vector": st.lists(json_scalars, max_size=4) | json_scalars,
            "extra": json_scalars,
        },
    ),
    json_scalars,
)
kinds = st.sampled_from(["fact", "preference", "event", "other"]) | json_scalars
metadata = st.dictionaries(st.text(max_size=4), json_values, max_size=3) | json_values
#: Mostly valid bodies with the odd field wrong, missing or extra, and now and then no body.
bodies = st.one_of(
    st.fixed_dictionaries(
        {"agent_id": st.uuids().map(str), "content": contents},
        optional={
            "kind": kinds,
            "source": sources,
            "metadata": metadata,
            "user_id": uuids | json_scalars,
            "user": st.text(max_size=4) | json_scalars,
            "embedding": embeddings,
        },
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "agent_id": uuids | json_scalars,
            "content": contents,
            "kind": kinds,
            "source": sources,
            "metadata": metadata,
            "unexpected": json_scalars,
        },
    ),
    json_values,
)


def marshmallow_load(data: Any) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = SCHEMA.load(data)
    except ValidationError:
        return None
    return result


@settings(max_examples=examples(1500), deadline=None)
@given(bodies)
def test_whatever_the_fast_path_accepts_marshmallow_accepts_alike(data: Any) -> None:
    fast = quick_load_create(data)
    event("fast path" if fast is not None else "left to marshmallow")
    if fast is not None:
        assert fast == marshmallow_load(data)


@pytest.mark.parametrize(
    "body",
    [
        {"agent_id": AGENT, "content": "Dana is allergic to peanuts."},
        {
            "agent_id": AGENT,
            "content": "Dana is allergic to peanuts.",
            "kind": "preference",
            "source": {"session_id": SESSION, "turn_index": 3, "ordinal": 0},
            "metadata": {"lang": "en", "score": 0.5, "tags": ["a", None]},
        },
        {"agent_id": AGENT, "content": "x", "source": {"session_id": SESSION}},
        {"agent_id": AGENT, "content": "x", "source": None, "metadata": {}},
        {"agent_id": AGENT, "content": "x", "user_id": str(uuid.uuid4())},
        {"agent_id": AGENT, "content": "x", "user_id": None},
        {"agent_id": AGENT, "content": "x", "embedding": {"model": "m", "vector": [0.6, 0.8]}},
    ],
)
def test_the_usual_bodies_take_the_fast_path(body: dict[str, Any]) -> None:
    fast = quick_load_create(body)
    assert fast is not None
    assert fast == SCHEMA.load(body)


def test_the_metadata_is_a_copy() -> None:
    metadata = {"a": 1}
    fast = quick_load_create({"agent_id": AGENT, "content": "x", "metadata": metadata})
    assert fast is not None and fast["metadata"] == metadata and fast["metadata"] is not metadata


@pytest.mark.parametrize(
    "embedding",
    [
        {"model": "m", "vector": []},
        {"model": "m", "vector": [0.1] * 4097},
        {"model": "", "vector": [0.1]},
        {"model": "m", "vector": [True]},
        {"model": "m", "vector": ["0.1"]},
        {"model": "m", "vector": [float("nan")]},
        {"model": "m", "vector": [float("inf")]},
        {"model": "m"},
        {"model": "m", "vector": [0.1], "dimension": 1},
    ],
)
def test_a_bad_embedding_is_a_field_error(embedding: dict[str, Any]) -> None:
    body = {"agent_id": AGENT, "content": "x", "embedding": embedding}
    assert quick_load_create(body) is None
    with pytest.raises(ValidationError) as raised:
        SCHEMA.load(body)
    assert "embedding" in raised.value.messages
