"""The idempotency key of one memory slot (the documented formula, exactly: docs/architecture.md).

``key_material = f"{org_id}:{session_id}:{turn_index}:{ordinal}"`` and the key is
``str(uuid5(NAMESPACE_DNS, sha256(key_material).hexdigest()))``. It depends on the slot identity
only, never on the memory's wording, so a retry that words the memory differently still sends the
same key, and the memory service answers with a replay or a conflict instead of a second row.
"""

from __future__ import annotations

import hashlib
import uuid


def _canonical(value: uuid.UUID | str) -> str:
    """Canonical lower-case form; raises ValueError for anything that is not a UUID."""
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))


def key_material(
    org_id: uuid.UUID | str, session_id: uuid.UUID | str, turn_index: int, ordinal: int
) -> str:
    return f"{_canonical(org_id)}:{_canonical(session_id)}:{int(turn_index)}:{int(ordinal)}"


def idempotency_key(
    org_id: uuid.UUID | str, session_id: uuid.UUID | str, turn_index: int, ordinal: int
) -> str:
    """``X-Idempotency-Key`` for the memory at ``ordinal`` (0-based) of ``turn_index``."""
    digest = hashlib.sha256(
        key_material(org_id, session_id, turn_index, ordinal).encode()
    ).hexdigest()
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, digest))


__all__ = ["idempotency_key", "key_material"]
