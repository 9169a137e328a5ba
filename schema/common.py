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
