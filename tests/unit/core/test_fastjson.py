"""core.fastjson reads and writes JSON as the standard library does, only faster."""

from __future__ import annotations

import json
import math
import uuid
from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import fastjson

# Integers across orjson's 64-bit limits, floats of every size (finite: JSON has no other).
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1.0, max_value=1.0),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text())
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=8), st.dictionaries(st.text(max_size=8), inner, max_size=8)
    ),
    max_leaves=60,
)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types (an int is not a float; -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(documents)
def test_it_reads_what_json_writes_as_json_reads_it(document: Any) -> None:
    text = json.dumps(document, ensure_ascii=False)
    expected = json.loads(text)
    assert same(fastjson.loads(text), expected)
    assert same(fastjson.loads(text.encode("utf-8")), expected)
    assert same(fastjson.loads(json.dumps(document)), expected)  # \u escapes


@settings(max_examples=300, deadline=None)
@given(documents)
def test_what_it_writes_reads_back_as_json_dumps_does(document: Any) -> None:
    assert same(json.loads(fastjson.dumps(document)), json.loads(json.dumps(document)))


@pytest.mark.parametrize(
    "text",
    [
        "123456789012345678901234567890",  # orjson alone would give a float
        "[1, -9223372036854775809, 2]",
        '{"a": [0.5, 18446744073709551616]}',
        "[[1, 2], [3, 100000000000000000000], [0]]",  # lists of lists: each one checked
        "[-9223372036854775808, -9223372036854775809]",  # an int and a float both -2**63
        '[{"a": 100000000000000000000}]',  # a list of one value: nothing compared
        "[null, 100000000000000000000]",
        "1e19",
        "[1e300, 0.1]",
        "[1e-400, -0.0]",
    ],
)
def test_integers_past_64_bits_stay_integers(text: str) -> None:
    assert same(fastjson.loads(text), json.loads(text))


@pytest.mark.parametrize(
    "text",
    ["NaN", "[Infinity]", "-Infinity", "1e400", '"\\ud800"', '{"a": "\\udfff\\ud800"}'],
)
def test_what_orjson_refuses_is_read_by_the_fallback(text: str) -> None:
    expected = json.loads(text)
    got = fastjson.loads(text)
    assert repr(got) == repr(expected)  # nan == nan is false; the reprs are equal


def test_the_fallback_decides_and_raises() -> None:
    def strict(text: Any) -> Any:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        fastjson.loads("NaN", strict)
    assert fastjson.loads('{"a": 1}', strict) == {"a": 1}  # orjson read it: no fallback
    with pytest.raises(json.JSONDecodeError):
        fastjson.loads("[1,]")
    # Past orjson's depth (1,024) and the interpreter's: json's RecursionError, as before.
    with pytest.raises(RecursionError):
        fastjson.loads("[" * 1100 + "]" * 1100)
    deep = "[" * 900 + "]" * 900
    assert fastjson.loads(deep) == json.loads(deep)


@pytest.mark.parametrize(
    "value",
    [
        [float("nan"), 1.0],  # orjson would write null
        {"a": float("inf")},
        {1: "int key"},
        [2**70],
        ["\ud800"],
        [1e308, 1e308],  # a sum too large for a float: json.dumps, same text
    ],
)
def test_what_orjson_writes_otherwise_is_written_by_json(value: Any) -> None:
    assert fastjson.dumps(value) == json.dumps(value, ensure_ascii=False)


def test_a_type_json_refuses_is_still_refused() -> None:
    with pytest.raises(TypeError):
        fastjson.dumps({"id": uuid.uuid4()})  # orjson alone would write it
    with pytest.raises(TypeError):
        fastjson.dumps([{1, 2}])


def json_bytes(value: Any, sort_keys: bool = False) -> bytes:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys)
    return text.encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(documents, st.booleans())
def test_compact_writes_json_dumps_bytes(document: Any, sort_keys: bool) -> None:
    assert fastjson.compact(document, sort_keys=sort_keys) == json_bytes(document, sort_keys)


# Documents orjson writes itself (no float): the case the byte equality is about.
exact_documents = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.text()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=8), st.dictionaries(st.text(max_size=8), inner, max_size=8)
    ),
    max_leaves=60,
)


@settings(max_examples=400, deadline=None)
@given(exact_documents, st.booleans())
def test_compact_writes_json_dumps_bytes_without_floats(document: Any, sort_keys: bool) -> None:
    assert fastjson.compact(document, sort_keys=sort_keys) == json_bytes(document, sort_keys)


def test_every_code_point_is_escaped_as_json_escapes_it() -> None:
    points = [*range(0xD800), *range(0xE000, 0x110000)]  # every scalar value
    for start in range(0, len(points), 4096):
        text = "".join(map(chr, points[start : start + 4096]))
        value = {text[:64]: text, "k": [text[::-1]]}
        assert fastjson.compact(value, sort_keys=True) == json_bytes(value, True)


def test_keys_are_sorted_as_json_sorts_them() -> None:
    keys = ["b", "a", "é", "e", "\uffff", "\U0001f600", "\ue000", "A", "", "ab", "a\x00"]
    value = {k: i for i, k in enumerate(keys)}
    assert fastjson.compact(value, sort_keys=True) == json_bytes(value, True)
    assert fastjson.compact(value) == json_bytes(value)  # insertion order kept


def test_compact_writes_plain_values_without_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json, "dumps", None)  # any call would fail
    assert fastjson.compact({"b": [1, None, True], "a": "é"}, sort_keys=True) == (
        '{"a":"é","b":[1,null,true]}'.encode()
    )


class Kind(StrEnum):
    FACT = "fact"


@pytest.mark.parametrize(
    "value",
    [
        {"score": 1e-05},  # orjson: 1e-5
        [0.1, 1e16],  # orjson: 10000000000000000.0
        [2**64],
        {1: "int key"},
        {"kind": Kind.FACT},  # a subclass: json's own rules
        [float("nan"), float("inf")],  # orjson: null
        [True, 1, "x", None, {"deep": [[[]]]}],
    ],
)
def test_what_orjson_might_write_otherwise_is_written_by_json(value: Any) -> None:
    assert fastjson.compact(value) == json_bytes(value)


def test_compact_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError):
        fastjson.compact({"id": uuid.uuid4()})  # orjson alone would write it
    with pytest.raises(TypeError):
        fastjson.compact({"b": 1, 2: 3}, sort_keys=True)  # keys json cannot order
    with pytest.raises(UnicodeEncodeError):
        fastjson.compact(["\ud800"])  # a lone surrogate has no UTF-8, as before
