"""Field types shared by several schemas."""

from __future__ import annotations

import re
from typing import Any

from marshmallow import ValidationError, fields

SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class Slug(fields.String):
    """A lower-case identifier: letters, digits, ``-`` and ``_``, at most 63 characters (the
    OpenAPI document states the pattern)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["metadata"] = {"pattern": SLUG.pattern, **kwargs.get("metadata", {})}
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs)
        if not SLUG.match(text):
            raise ValidationError(
                "must be 1-63 lower-case letters, digits, '-' or '_', starting with a letter"
                " or digit"
            )
        return text


class StrictInteger(fields.Integer):
    """An integer that refuses booleans, floats and numeric strings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError("Not a valid integer.")
        return int(super()._deserialize(value, attr, data, **kwargs))


class StrictNumber(fields.Float):
    """A finite number (an integer or a float) that refuses booleans and numeric strings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_nan=False, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError("Not a valid number.")
        return float(super()._deserialize(value, attr, data, **kwargs))


#: What a string stored in Postgres may not hold: NUL (``text`` and ``jsonb`` refuse it) and
#: a lone UTF-16 surrogate (it has no UTF-8 encoding). Both arrive only as JSON escapes.
UNSTORABLE = "must not contain NUL or unpaired surrogate characters"
_ESCAPE = re.compile(r"\\u(?:0000|[dD][89abcdefABCDEF][0-9a-fA-F]{2})")
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def unstorable(value: Any) -> dict[str, Any] | list[str] | None:
    """Where ``value`` (decoded JSON, or a query's parameters) holds a string that cannot be
    stored: marshmallow's shape of errors (``{"field": {"nested": [message]}}``, list indexes
    as keys), or None when every string, keys included, can be stored."""
    if isinstance(value, str):
        return [UNSTORABLE] if _BAD_CHAR.search(value) else None
    items: Any
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    errors: dict[str, Any] = {}
    for key, item in items:
        if isinstance(key, str) and _BAD_CHAR.search(key):
            errors[key.encode("unicode_escape").decode("ascii")] = [UNSTORABLE]
            continue
        problem = unstorable(item)
        if problem is not None:
            errors[str(key) if isinstance(key, str) else key] = problem
    return errors or None


def may_hold_unstorable(json_text: str) -> bool:
    """Whether JSON text escapes a NUL or a surrogate (a quick test before :func:`unstorable`:
    such characters reach a decoded document only through these escapes)."""
    return "\\u" in json_text and _ESCAPE.search(json_text) is not None
