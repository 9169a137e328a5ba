"""The extraction result: what an LLM answers for one turn, and what is persisted for it.

``{"memories": [{"content": "...", "kind": "fact|preference|event|other"}, ...]}``

Decisions, kept here so every reader of a result agrees on them:

- ``content`` is stripped of surrounding whitespace and must then hold 1 to
  :data:`MAX_CONTENT_CHARS` characters. An empty or over-long memory makes the whole answer
  invalid (the caller retries the LLM a bounded number of times) rather than being silently
  dropped or cut, so the persisted result is always exactly what was validated.
- ``kind`` is compared case-insensitively. A missing or null kind, or a string outside
  :data:`KINDS`, becomes ``"other"``: a model that invents a category ("habit", "Person") still
  produced a usable memory. A kind that is not a string at all is a validation error.
- At most :data:`MAX_MEMORIES` memories per turn; ``memories`` itself is required.
- Unknown keys, in a memory or at the top level, are dropped.
- ``replaces`` (the LLM's answer): the local refs (``m1``, ``m2``...) of the related memories
  the prompt listed that a memory replaces. ``supersedes`` (the persisted form): the memory ids
  those refs were resolved to before the result was stored. Both optional; a memory without
  them is stored exactly as before.
"""

from __future__ import annotations

from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate

from schema.memory import MEMORY_KINDS as KINDS
from schema.memory import MemoryEmbeddingSchema

DEFAULT_KIND = "other"
MAX_CONTENT_CHARS = 2000
MAX_MEMORIES = 50
#: A memory replaces at most this many listed memories; a ref is at most this long.
MAX_REPLACES = 20
MAX_REF_CHARS = 16


class StrippedString(fields.String):
    """A string with surrounding whitespace removed before length validation."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        return str(super()._deserialize(value, attr, data, **kwargs)).strip()


class Kind(fields.String):
    """``fact | preference | event | other``; anything else (or nothing) maps to ``other``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_none=True, load_default=DEFAULT_KIND, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        if value is None:
            return DEFAULT_KIND
        if not isinstance(value, str):
            raise ValidationError("Not a valid string.")
        kind = value.strip().lower()
        return kind if kind in KINDS else DEFAULT_KIND

    def deserialize(
        self, value: Any, attr: str | None = None, data: Any = None, **kwargs: Any
    ) -> Any:
        # allow_none would otherwise hand back None untouched; a null kind means "other".
        result = super().deserialize(value, attr, data, **kwargs)
        return DEFAULT_KIND if result is None else result


class Refs(fields.Field[list[str]]):
    """``replaces``: a list of refs, tolerantly read (a model may answer one ref as a string,
    or null): anything that is not a short string is left out, as an unknown ref would be, so
    a sloppy ``replaces`` never makes the memories themselves invalid. At most
    :data:`MAX_REPLACES`, each once, in order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(load_default=list, allow_none=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> list[str]:
        items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        refs: dict[str, None] = {}
        for item in items:
            if isinstance(item, str) and 0 < len(item.strip()) <= MAX_REF_CHARS:
                refs.setdefault(item.strip(), None)
        return list(refs)[:MAX_REPLACES]

    def deserialize(
        self, value: Any, attr: str | None = None, data: Any = None, **kwargs: Any
    ) -> Any:
        result = super().deserialize(value, attr, data, **kwargs)
        return [] if result is None else result


class ExtractedMemorySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    content = StrippedString(required=True, validate=validate.Length(min=1, max=MAX_CONTENT_CHARS))
    kind = Kind()
    replaces = Refs()
    supersedes = fields.List(fields.UUID(), load_default=list, validate=validate.Length(max=20))
    #: The persisted form only (the extract stage embeds a turn's memories once).
    embedding = fields.Nested(MemoryEmbeddingSchema, load_default=None, allow_none=True)


class ExtractionResultSchema(Schema):
    """One turn's memories, in order: a memory's ordinal is its position in this list."""

    class Meta:
        unknown = EXCLUDE

    memories = fields.List(
        fields.Nested(ExtractedMemorySchema),
        required=True,
        validate=validate.Length(max=MAX_MEMORIES),
    )


__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "MAX_CONTENT_CHARS",
    "MAX_MEMORIES",
    "ExtractedMemorySchema",
    "ExtractionResultSchema",
]
