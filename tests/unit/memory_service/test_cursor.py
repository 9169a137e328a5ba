"""The list cursor codec: what it encodes decodes back, and only that is accepted."""

from __future__ import annotations

import base64
import datetime as dt
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory_service.cursor import InvalidCursorError, decode_cursor, encode_cursor
from schema.memory import MAX_CURSOR_CHARS

SOME_ID = uuid.UUID("8b9f2a52-3f57-4bd1-9c1e-2c1a8f0d6b11")
UTC_TEXT = f"2024-01-01T00:00:00+00:00|{SOME_ID}"


def _b64(text: str | bytes, *, pad: bool = False) -> str:
    raw = text.encode() if isinstance(text, str) else text
    encoded = base64.urlsafe_b64encode(raw).decode()
    return encoded if pad else encoded.rstrip("=")


aware_datetimes = st.datetimes(
    min_value=dt.datetime(1, 1, 2),
    max_value=dt.datetime(9999, 12, 30),
    timezones=st.sampled_from(
        [
            dt.UTC,
            dt.timezone(dt.timedelta(hours=2)),
            dt.timezone(dt.timedelta(hours=-9, minutes=-30)),
        ]
    ),
)


@given(aware_datetimes, st.uuids())
def test_a_cursor_decodes_to_the_instant_and_id_it_encodes(
    created_at: dt.datetime, memory_id: uuid.UUID
) -> None:
    cursor = encode_cursor(created_at, memory_id)
    assert "=" not in cursor and len(cursor) <= MAX_CURSOR_CHARS
    decoded_at, decoded_id = decode_cursor(cursor)
    assert decoded_at == created_at  # the same instant ...
    assert decoded_at.utcoffset() == dt.timedelta(0)  # ... spelled in UTC
    assert decoded_id == memory_id
    assert encode_cursor(decoded_at, decoded_id) == cursor


def test_the_encoding_is_the_base64_of_utc_time_and_id() -> None:
    created_at = dt.datetime(2024, 1, 1, 2, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert encode_cursor(created_at, SOME_ID) == _b64(UTC_TEXT)
    position = (dt.datetime(2024, 1, 1, tzinfo=dt.UTC), SOME_ID)
    assert decode_cursor(_b64(UTC_TEXT)) == position
    # Padding is not part of the spelling: a client that pads the cursor still gets its page.
    assert _b64(UTC_TEXT, pad=True).endswith("=")
    assert decode_cursor(_b64(UTC_TEXT, pad=True)) == position


@pytest.mark.parametrize(
    "cursor",
    [
        None,
        ["a", "b"],  # a repeated query parameter
        "",
        "%%%",
        "é",
        _b64("not a cursor"),
        _b64(f"2024-01-01T00:00:00|{SOME_ID}"),  # naive timestamp
        _b64(f"9999-12-31T23:59:59-14:00|{SOME_ID}"),  # past year 9999 in UTC
        _b64(f"2024-01-01T02:00:00+02:00|{SOME_ID}"),  # the same instant in another offset
        _b64(f"2024-01-01T00:00:00+00:00|{str(SOME_ID).upper()}"),  # the id in capitals
        _b64(UTC_TEXT) + "x" * MAX_CURSOR_CHARS,  # too long
    ],
)
def test_anything_but_an_issued_cursor_is_refused(cursor: object) -> None:
    with pytest.raises(InvalidCursorError):
        decode_cursor(cursor)
