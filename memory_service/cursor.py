"""The opaque cursor of ``GET /v1/memories``: where the previous page ended.

A cursor is the unpadded URL-safe base64 of ``<created_at in UTC, ISO 8601>|<memory id>``, the
sort key of the last row of a page (the list is newest first, ties broken by id). Clients must
treat it as opaque. Only a cursor whose text is the one this module writes for its position is
accepted (base64 padding is tolerated), so nothing a client makes up reaches the query.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import uuid

from schema.memory import MAX_CURSOR_CHARS

#: The (created_at, id) of the last row already seen.
Position = tuple[dt.datetime, uuid.UUID]


class InvalidCursorError(ValueError):
    """Not a cursor this service issued."""


def _text(created_at: dt.datetime, memory_id: uuid.UUID) -> str:
    return f"{created_at.astimezone(dt.UTC).isoformat()}|{memory_id}"


def encode_cursor(created_at: dt.datetime, memory_id: uuid.UUID) -> str:
    raw = _text(created_at, memory_id).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: object) -> Position:
    """The position in a cursor from :func:`encode_cursor`. Anything else, whatever its shape
    (a repeated parameter, not base64, base64 of something else, a naive or out-of-range
    timestamp, too long), raises :class:`InvalidCursorError`."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR_CHARS:
        raise InvalidCursorError(cursor)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        when, _, ident = raw.partition("|")
        created_at = dt.datetime.fromisoformat(when)
        memory_id = uuid.UUID(ident)
        canonical = _text(created_at, memory_id)
    except (binascii.Error, ValueError, UnicodeError, OverflowError):
        raise InvalidCursorError(cursor) from None
    if created_at.tzinfo is None or raw != canonical:
        raise InvalidCursorError(cursor)
    return created_at, memory_id


# -- the turns list (``GET /v1/sessions/{id}/turns``): its own cursor, a turn index ---------

_TURN_PREFIX = "turn|"


def encode_turn_cursor(turn_index: int) -> str:
    """The turns list's cursor after ``turn_index`` (unpadded URL-safe base64 of
    ``turn|<index>``)."""
    raw = f"{_TURN_PREFIX}{turn_index}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_turn_cursor(cursor: object) -> int:
    """The turn index in a cursor from :func:`encode_turn_cursor`; anything else raises
    :class:`InvalidCursorError`."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR_CHARS:
        raise InvalidCursorError(cursor)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError, UnicodeError):
        raise InvalidCursorError(cursor) from None
    number = raw.removeprefix(_TURN_PREFIX)
    if not raw.startswith(_TURN_PREFIX) or not number.isdigit() or len(number) > 10:
        raise InvalidCursorError(cursor)
    turn_index = int(number)
    if raw != f"{_TURN_PREFIX}{turn_index}" or turn_index > 2**31 - 1:
        raise InvalidCursorError(cursor)
    return turn_index
