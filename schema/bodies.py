"""The JSON the services answer with: compact UTF-8, and the one error body
(``{"error": {"code", "message", ...}}``, :class:`schema.memory.ErrorSchema`)."""

from __future__ import annotations

from typing import Any

from core.fastjson import compact


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, ``json.dumps``'s bytes (a replay answers the same bytes)."""
    return compact(value)


def error_body(code: str, message: str, **extra: Any) -> bytes:
    return dumps({"error": {"code": code, "message": message, **extra}})
