"""The idempotency key: exactly the documented formula, a function of the slot identity only."""

from __future__ import annotations

import hashlib
import uuid

from hypothesis import given
from hypothesis import strategies as st

from extraction.keys import idempotency_key, key_material
from extraction.stages import memory_body
from extraction.values import PersistedResult, StoredMemory, TurnRef

ORG = uuid.UUID("6f1c3a52-9d0e-4b8e-a3f1-0c2d4e6f8a10")
SESSION = uuid.UUID("0b7e2d94-5c61-4f3a-9e8d-7a6b5c4d3e21")


def test_the_key_is_the_adr_formula_exactly() -> None:
    material = f"{ORG}:{SESSION}:3:1"
    expected = str(uuid.uuid5(uuid.NAMESPACE_DNS, hashlib.sha256(material.encode()).hexdigest()))
    assert key_material(ORG, SESSION, 3, 1) == material
    assert idempotency_key(ORG, SESSION, 3, 1) == expected


def test_the_key_is_a_canonical_lower_case_uuid_whatever_the_input_form() -> None:
    key = idempotency_key(str(ORG).upper(), f"{{{SESSION}}}", 3, 1)
    assert key == idempotency_key(ORG, SESSION, 3, 1)
    assert key == key.lower() and str(uuid.UUID(key)) == key and len(key) == 36


def test_same_turn_and_ordinal_with_different_wording_give_the_same_key() -> None:
    ref = TurnRef(ORG, SESSION, 3)
    agent = uuid.uuid4()
    first = PersistedResult((StoredMemory("Dana is allergic to peanuts.", "fact"),), "x", "m", 1, 1)
    reworded = PersistedResult(
        (StoredMemory("Dana has a peanut allergy.", "fact"),), "x", "m", 1, 1
    )
    assert memory_body(agent, ref, 0, first) != memory_body(agent, ref, 0, reworded)
    # The key depends on the slot only, so the service sees the same key for both wordings.
    assert idempotency_key(ORG, SESSION, 3, 0) == idempotency_key(ORG, SESSION, 3, 0)


@given(st.uuids(), st.uuids(), st.integers(1, 10_000), st.integers(0, 100), st.integers(0, 100))
def test_different_slots_never_share_a_key(
    org: uuid.UUID, session: uuid.UUID, turn: int, a: int, b: int
) -> None:
    same = a == b
    assert (
        idempotency_key(org, session, turn, a) == idempotency_key(org, session, turn, b)
    ) == same
    assert idempotency_key(org, session, turn, a) != idempotency_key(session, org, turn, a) or (
        org == session
    )
