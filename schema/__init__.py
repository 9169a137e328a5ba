"""marshmallow schemas for every payload that crosses a process boundary. No I/O here.

:func:`load` is the one place marshmallow's ValidationError becomes an
:class:`~core.errors.InvalidMessageError` (with the field-by-field messages kept).
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError

from core.errors import InvalidMessageError


def load(schema: Schema, data: Any, *, what: str = "input") -> Any:
    """Validate ``data`` with ``schema``; raise InvalidMessageError naming every bad field."""
    try:
        return schema.load(data)
    except ValidationError as exc:
        raise InvalidMessageError(
            f"invalid {what}: {describe_errors(exc.messages)}", exc.messages
        ) from exc


def describe_errors(messages: Any, prefix: str = "") -> str:
    """Flatten marshmallow's nested error dict into ``field.sub[2].x: message; ...``."""
    parts: list[str] = []
    if isinstance(messages, dict):
        for key, value in messages.items():
            if isinstance(key, int):
                path = f"{prefix}[{key}]"
            elif key == "_schema":
                path = prefix or "(body)"
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            inner = describe_errors(value, path)
            if inner:
                parts.append(inner)
        return "; ".join(parts)
    if isinstance(messages, list):
        if all(isinstance(m, str) for m in messages):
            return f"{prefix or '(body)'}: {' '.join(messages)}"
        return "; ".join(describe_errors(m, prefix) for m in messages)
    return f"{prefix or '(body)'}: {messages}"
