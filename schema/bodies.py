"""The JSON the services answer with: compact UTF-8, and the one error body
(``{"error": {"code", "message", ...}}``, :class:`schema.memory.ErrorSchema`)."""

from __future__ import annotations

import json
from typing import Any


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def error_body(code: str, message: str, **extra: Any) -> bytes:
    return dumps({"error": {"code": code, "message": message, **extra}})
