"""Canonical JSON: one text per JSON value, wherever a value is hashed or compared as bytes.

Sorted keys, compact separators, non-ASCII kept as UTF-8. The stored digests (session
content, memory request fingerprints) are computed over this text, so it is a format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def canonical_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """Sorted keys, compact separators, non-ASCII kept: one text per JSON value.
    ``default`` converts what JSON has no form for (as :func:`json.dumps`)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=default
    )
