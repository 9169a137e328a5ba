"""The console's in-memory keyset pages (dead letters, tokens)."""

from __future__ import annotations

import datetime as dt

import pytest

from memory_service.console.paging import keyed_page
from memory_service.console.session import Refused

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ITEMS = [(T0 + dt.timedelta(seconds=i // 2), f"id{i}") for i in range(7)]


def key(item: tuple[dt.datetime, str]) -> tuple[dt.datetime, str]:
    return item


def test_pages_follow_each_other_without_gaps_or_repeats() -> None:
    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = keyed_page(ITEMS, key, cursor, size=3)
        seen.extend(page)
        pages += 1
        if cursor is None:
            break
    assert seen == ITEMS and pages == 3


def test_a_page_stays_put_when_earlier_items_go_away() -> None:
    first, cursor = keyed_page(ITEMS, key, None, size=3)
    assert first == ITEMS[:3]
    assert cursor is not None
    later, _ = keyed_page(ITEMS[1:], key, cursor, size=3)  # the first item was replayed
    assert later == ITEMS[3:6]


def test_a_forged_cursor_is_refused() -> None:
    with pytest.raises(Refused):
        keyed_page(ITEMS, key, "yesterday|x")
