"""Content normalisation, content hash and request fingerprint."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from memories.canonical import (
    content_hash,
    fingerprint,
    fingerprint_digest,
    normalize_content,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
bodies = st.fixed_dictionaries(
    {
        "agent_id": st.uuids().map(str),
        "content": st.text(min_size=1),
        "kind": st.sampled_from(["fact", "preference", "event", "other"]),
        "metadata": st.dictionaries(st.text(), json_values, max_size=4),
        "source": st.none()
        | st.fixed_dictionaries(
            {
                "session_id": st.uuids().map(str),
                "turn_index": st.none() | st.integers(1, 10),
                "ordinal": st.none() | st.integers(0, 10),
            }
        ),
    }
)


def test_normalisation() -> None:
    assert normalize_content("  Dana\tIS\u00a0allergic\n\nto  PEANUTS. ") == (
        "dana is allergic to peanuts."
    )
    assert normalize_content("\uff30\uff25\uff21") == "pea"  # NFKC: full-width letters
    assert normalize_content("Straße") == normalize_content("STRASSE")  # case folding
    assert normalize_content("e\u0301") == normalize_content("\u00e9")  # composition
    assert content_hash("Hello  World") == hashlib.sha256(b"hello world").hexdigest()
    assert content_hash("Hello World") != content_hash("Hello World!")


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@given(body=bodies, seed=st.integers(), indent=st.none() | st.integers(0, 4), ascii_=st.booleans())
def test_key_order_whitespace_and_escapes_give_one_fingerprint(
    body: dict[str, Any], seed: int, indent: int | None, ascii_: bool
) -> None:
    wire = json.dumps(shuffled(body, random.Random(seed)), indent=indent, ensure_ascii=ascii_)
    assert fingerprint(json.loads(wire)) == fingerprint(body)
    assert fingerprint_digest(json.loads(wire)) == fingerprint_digest(body)


@given(body=bodies, extra=st.text(min_size=1))
def test_any_content_change_gives_another_fingerprint(body: dict[str, Any], extra: str) -> None:
    changed = {**body, "content": body["content"] + extra}
    assert fingerprint_digest(changed) != fingerprint_digest(body)


@given(body=bodies, key=st.sampled_from(["agent_id", "kind", "metadata", "source"]))
def test_any_other_field_change_gives_another_fingerprint(body: dict[str, Any], key: str) -> None:
    replacement = {
        "agent_id": "00000000-0000-0000-0000-000000000000",
        "kind": "__other__",
        "metadata": {"__changed__": True},
        "source": {"session_id": "x", "turn_index": 99, "ordinal": 99},
    }[key]
    changed = {**body, key: replacement}
    assert (fingerprint_digest(changed) == fingerprint_digest(body)) == (body[key] == replacement)


def test_fingerprint_format() -> None:
    assert fingerprint({"b": 1, "a": "é"}) == 'POST|/v1/memories|{"a":"é","b":1}'


def test_the_user_is_fingerprinted_only_when_there_is_one() -> None:
    from memories.canonical import canonical_request

    body = {
        "agent_id": "22222222-2222-4222-8222-222222222222",
        "content": "Dana likes tea.",
        "kind": "fact",
        "metadata": {},
        "source": None,
    }
    without = canonical_request(body)
    # A body without a user (or with user_id null) has the fingerprint it had before users.
    assert without == canonical_request({**body, "user_id": None})
    assert "user_id" not in without
    dana = canonical_request({**body, "user_id": "55555555-5555-4555-8555-555555555555"})
    grace = canonical_request({**body, "user_id": "66666666-6666-4666-8666-666666666666"})
    assert len({fingerprint_digest(x) for x in (without, dana, grace)}) == 3
