"""The JSON Lines import format: one session per line, each line checked on its own.

:func:`parse_session_line` turns the bytes of one line into a validated session record or
raises :class:`~core.errors.InvalidMessageError` naming what is wrong: the encoding (strict
UTF-8), the JSON, the nesting depth, a forbidden character in a string (and where), or a field.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

from marshmallow import (
    INCLUDE,
    RAISE,
    Schema,
    ValidationError,
    fields,
    validate,
    validates,
    validates_schema,
)

from core.errors import InvalidMessageError
from schema import load
from schema.common import Slug, StrictInteger

#: The longest user key (``user``), as ``ibex_core.users.external_id`` allows.
EXTERNAL_ID_MAX = 200

SESSION_STATUSES = ("active", "completed", "abandoned", "error")

#: Default largest line, in bytes, not counting its line ending (``--max-line-bytes``).
MAX_LINE_BYTES = 16 * 1024 * 1024

#: Deepest nesting of objects and arrays in a line; the session object itself is level 1.
MAX_DEPTH = 64

#: Largest value of a per-turn counter (a Postgres ``integer``).
MAX_INT32 = 2**31 - 1


#: A string without a character of ``_FORBIDDEN``, as an OpenAPI pattern (lone surrogates
#: are not Unicode text: JSON Schema strings cannot hold them).
FORBIDDEN_FREE_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*$"
#: A role: some character that is not a space, none of ``_FORBIDDEN``.
ROLE_PATTERN = (
    r"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*[^\s\x00-\x08\x0b\x0c\x0e-\x1f][^\x00-\x08\x0b\x0c\x0e-\x1f]*$"
)


class MessageSchema(Schema):
    """One chat message, kept verbatim: extra keys (name, tool_calls, ...) pass through."""

    class Meta:
        unknown = INCLUDE

    #: Not blank (``_role``): stated in the OpenAPI document as a pattern.
    role = fields.String(required=True, metadata={"minLength": 1, "pattern": ROLE_PATTERN})
    content = fields.Raw(
        required=True,
        allow_none=True,
        metadata={
            "anyOf": [{"type": "string", "pattern": FORBIDDEN_FREE_PATTERN}, {"type": "array"}]
        },
    )

    @validates("role")
    def _role(self, value: str, **_: Any) -> None:
        if not value.strip():
            raise ValidationError("must not be empty.")

    @validates("content")
    def _content(self, value: Any, **_: Any) -> None:
        if value is not None and not isinstance(value, str | list):
            raise ValidationError("must be a string, a list of content parts, or null.")


class TurnSchema(Schema):
    class Meta:
        unknown = RAISE

    messages = fields.List(
        fields.Nested(MessageSchema), required=True, validate=validate.Length(min=1)
    )
    completion = fields.Nested(MessageSchema, required=True)
    prompt_tokens = StrictInteger(load_default=0, validate=validate.Range(min=0, max=MAX_INT32))
    completion_tokens = StrictInteger(load_default=0, validate=validate.Range(min=0, max=MAX_INT32))
    latency_ms = StrictInteger(load_default=0, validate=validate.Range(min=0, max=MAX_INT32))
    is_streaming = fields.Boolean(load_default=False, truthy={True}, falsy={False})


def _printable(value: str) -> None:
    if not value.isprintable():
        raise ValidationError("must hold printable characters only.")


class SessionLineSchema(Schema):
    class Meta:
        unknown = RAISE

    org = Slug(required=True)
    agent = Slug(required=True)
    session = fields.String(required=True, validate=validate.Length(min=1, max=255))
    status = fields.String(load_default="completed", validate=validate.OneOf(SESSION_STATUSES))
    model = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=200))
    provider = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=200))
    #: Whose conversation: the application's key for the person (created when missing), or the
    #: id of a user of the org. Neither: an agent-wide session. A session's user is set once.
    user = fields.String(
        load_default=None,
        allow_none=True,
        validate=[validate.Length(min=1, max=EXTERNAL_ID_MAX), _printable],
    )
    user_id = fields.UUID(load_default=None, allow_none=True)
    turns = fields.List(fields.Nested(TurnSchema), required=True)

    @validates_schema
    def _one_user(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("user") is not None and data.get("user_id") is not None:
            raise ValidationError("give user or user_id, not both.", "user_id")


_LINE_SCHEMA = SessionLineSchema()

#: Characters no string may hold once decoded: the C0 controls other than tab, newline and
#: carriage return (Postgres text cannot hold NUL at all), and lone UTF-16 surrogates, which
#: have no UTF-8 encoding. Decoded UTF-8 JSON can hold them only as ``\u`` escapes, so a line of
#: bytes without such an escape is not walked.
_FORBIDDEN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")
_FORBIDDEN_ESCAPE = re.compile(r"\\u(?:00[01][0-9a-fA-F]|[dD][89a-fA-F][0-9a-fA-F]{2})")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def decode_line(raw: bytes, *, first: bool = False) -> str:
    """The text of one line: strict UTF-8 (a byte order mark is allowed on the first line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessageError(
            f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at byte offset {exc.start}"
        ) from exc
    if first and text.startswith("\ufeff"):
        text = text[1:]
    return text


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` before it is parsed (parsers recurse)."""
    if text.count("[") + text.count("{") <= limit:
        return
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    if depth > limit:
        raise InvalidMessageError(f"nested deeper than {limit} levels of objects and arrays")


def _path(parts: tuple[str | int, ...]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(line)"


def _describe(char: str) -> str:
    code = ord(char)
    if code == 0:
        return "a NUL character (U+0000)"
    if 0xD800 <= code <= 0xDFFF:
        return f"a lone surrogate (U+{code:04X})"
    return f"a control character (U+{code:04X})"


def check_strings(value: Any) -> None:
    """Refuse a forbidden character in any key or string, naming where it is."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = _FORBIDDEN.search(item)
            if found:
                raise InvalidMessageError(f"{_path(path)}: contains {_describe(found.group())}")
        elif isinstance(item, dict):
            for key, inner in item.items():
                found = _FORBIDDEN.search(key)
                if found:
                    raise InvalidMessageError(
                        f"{_path(path)}: a key contains {_describe(found.group())}"
                    )
                stack.append((inner, (*path, key)))
        elif isinstance(item, list):
            stack.extend((inner, (*path, i)) for i, inner in enumerate(item))


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise InvalidMessageError(f"number out of range: {text[:40]}")
    return number


def _no_constant(text: str) -> Any:
    raise InvalidMessageError(f"{text} is not a JSON number")


def parse_session_line(raw: bytes | str, *, first: bool = False) -> dict[str, Any]:
    """One line of an import file, checked and validated; InvalidMessageError says why not."""
    text = decode_line(raw, first=first) if isinstance(raw, bytes) else raw
    check_depth(text)
    try:
        data = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidMessageError(f"malformed JSON: {exc.msg} at column {exc.colno}") from exc
    except ValueError as exc:  # an integer too long to convert
        raise InvalidMessageError(f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidMessageError("a line must be a JSON object (one session)")
    if not isinstance(raw, bytes) or _FORBIDDEN_ESCAPE.search(text):
        check_strings(data)
    record: dict[str, Any] = load(_LINE_SCHEMA, data, what="session")
    return record
