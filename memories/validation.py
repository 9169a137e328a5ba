"""A fast path for the usual, valid body of ``POST /v1/memories``.

marshmallow's load of :class:`schema.memory.MemoryCreateSchema` was the largest piece of a POST's
own CPU (about 40 µs of plain Python per request). :func:`quick_load_create` accepts only the
shape well-behaved clients send, runs the schema's own validators on it, and returns exactly what
``MemoryCreateSchema().load`` returns. Whenever anything is unusual it returns ``None`` and the
caller loads with marshmallow, which then either agrees or answers 422 field by field, so the
errors a client sees never come from here. A property test checks that whatever this accepts,
marshmallow accepts with the same result.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from marshmallow import ValidationError

from schema.memory import (
    MAX_CONTENT_CHARS,
    MAX_EMBEDDING_DIMENSION,
    MAX_EMBEDDING_MODEL_CHARS,
    MEMORY_KINDS,
    _content_valid,
    _metadata_valid,
)

CREATE_FIELDS = frozenset(
    {"agent_id", "content", "kind", "source", "metadata", "user_id", "embedding"}
)
SOURCE_FIELDS = frozenset({"session_id", "turn_index", "ordinal"})
MAX_INT32 = 2**31 - 1
_MISSING = object()


def _uuid(value: Any) -> uuid.UUID | None:
    if type(value) is not str:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _small_int(value: Any, minimum: int) -> bool:
    """An int (not a bool) in ``minimum .. 2**31-1``, or null: what StrictInteger takes here."""
    return value is None or (type(value) is int and minimum <= value <= MAX_INT32)


def _embedding(value: Any) -> Any:
    if type(value) is not dict or value.keys() != {"model", "vector"}:
        return _MISSING
    model, vector = value["model"], value["vector"]
    if (
        type(model) is not str
        or not 1 <= len(model) <= MAX_EMBEDDING_MODEL_CHARS
        or type(vector) is not list
        or not 1 <= len(vector) <= MAX_EMBEDDING_DIMENSION
    ):
        return _MISSING
    floats = []
    for v in vector:
        if type(v) is not float and type(v) is not int:
            return _MISSING
        f = float(v)
        if not math.isfinite(f):
            return _MISSING
        floats.append(f)
    return {"model": model, "vector": floats}


def _source(value: Any) -> Any:
    if value is None:
        return None
    if type(value) is not dict or not value.keys() <= SOURCE_FIELDS:
        return _MISSING
    session_id = _uuid(value.get("session_id"))
    turn_index = value.get("turn_index")
    ordinal = value.get("ordinal")
    if session_id is None or not _small_int(turn_index, 1) or not _small_int(ordinal, 0):
        return _MISSING
    return {"session_id": session_id, "turn_index": turn_index, "ordinal": ordinal}


def quick_load_create(data: Any) -> dict[str, Any] | None:
    """``MemoryCreateSchema().load(data)`` for a plainly valid body, else ``None``."""
    if type(data) is not dict or not data.keys() <= CREATE_FIELDS:
        return None
    agent_id = _uuid(data.get("agent_id"))
    content = data.get("content")
    kind = data.get("kind", "fact")
    if (
        agent_id is None
        or type(content) is not str
        or not 1 <= len(content) <= MAX_CONTENT_CHARS
        or type(kind) is not str
        or kind not in MEMORY_KINDS
    ):
        return None
    source = _source(data.get("source"))
    if source is _MISSING:
        return None
    metadata = data.get("metadata", _MISSING)
    if metadata is _MISSING:
        metadata = {}
    elif type(metadata) is not dict or not all(type(k) is str for k in metadata):
        return None
    else:
        metadata = dict(metadata)
    try:
        _content_valid(content)
        _metadata_valid(metadata)
    except ValidationError:
        return None
    loaded: dict[str, Any] = {
        "agent_id": agent_id,
        "content": content,
        "kind": kind,
        "source": source,
        "metadata": metadata,
        "user": None,  # a user by key is resolved by the service: marshmallow loads it
    }
    if "user_id" in data:
        user_id = data["user_id"]
        if user_id is not None:
            user_id = _uuid(user_id)
            if user_id is None:
                return None
        loaded["user_id"] = user_id
    if "embedding" in data:
        embedding = _embedding(data["embedding"])
        if embedding is _MISSING:
            return None
        loaded["embedding"] = embedding
    return loaded
