"""Canonical JSON: one text per JSON value, wherever a value is hashed or compared as bytes.

Sorted keys, compact separators, non-ASCII kept as UTF-8. The stored digests (session
content, memory request fingerprints) are computed over this text, so it is a format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from core.fastjson import compact


def canonical_bytes(value: Any) -> bytes:
    """:func:`canonical_json` in UTF-8, the text a digest is taken of (written by orjson when
    the bytes are the same, :func:`core.fastjson.compact`)."""
    return compact(value, sort_keys=True)


def canonical_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """Sorted keys, compact separators, non-ASCII kept: one text per JSON value.
    ``default`` converts what JSON has no form for (as :func:`json.dumps`)."""
    if default is None:
        return canonical_bytes(value).decode("utf-8")
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=default
    )
