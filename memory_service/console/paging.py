"""Keyset paging for every console list: a page reads ``PAGE_SIZE + 1`` rows after the last
one shown (never an OFFSET), so page 200 costs what page 1 costs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TypeVar

import falcon

from memories.store import MemoryRow
from memory_service.console.markup import Markup, fmt
from memory_service.console.session import Refused
from memory_service.cursor import InvalidCursorError, Position, decode_cursor, encode_cursor

PAGE_SIZE = 50
T = TypeVar("T")


def memory_cursor(memory: MemoryRow) -> str:
    return encode_cursor(memory.created_at, memory.id)


def read_cursor(req: falcon.Request, name: str = "cursor") -> Position | None:
    value = req.get_param(name)
    if not value:
        return None
    try:
        return decode_cursor(value)
    except InvalidCursorError:
        raise Refused(400, "Bad request", "cursor: not a cursor this console issued") from None


def int_param(req: falcon.Request, name: str, default: int = 0) -> int:
    value = req.get_param(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise Refused(400, "Bad request", f"{name}: a whole number") from None
    if number < 0:
        raise Refused(400, "Bad request", f"{name}: at least 0")
    return number


def next_link(href: str, text: str = "Next page →") -> Markup:
    return fmt('<p class="paging"><a rel="next" href="{}">{}</a></p>', href, text)


def keyed_page(
    items: Sequence[T],
    key: Callable[[T], tuple[dt.datetime, str]],
    cursor: str | None,
    size: int = PAGE_SIZE,
) -> tuple[list[T], str | None]:
    """The ``size`` items after ``cursor`` (``<ISO time>|<id>`` of the last one shown) of a
    list ordered by ``key``, and the cursor of the next page (None: none). For the short lists
    an operator reads whole from their owner (dead letters, tokens): a page stays put when
    items before it go away (a replayed letter), which an offset would not."""
    start: tuple[dt.datetime, str] | None = None
    if cursor:
        when, _, ident = cursor.partition("|")
        try:
            start = (dt.datetime.fromisoformat(when), ident)
        except ValueError:
            raise Refused(400, "Bad request", "not a cursor this console issued") from None
    rest = [item for item in items if start is None or key(item) > start]
    page = rest[:size]
    if len(rest) <= size:
        return page, None
    last_when, last_id = key(page[-1])
    return page, f"{last_when.isoformat()}|{last_id}"
