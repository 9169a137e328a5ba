"""Durations as operators type them (``--older-than 7d``): one parser for every command."""

from __future__ import annotations

import datetime as dt


def parse_age(text: str) -> dt.timedelta:
    """``30m``, ``12h``, ``7d`` or ``90s`` → a timedelta; ValueError otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit():
        raise ValueError(f"expected a duration like 90s, 30m, 12h or 7d, got {text!r}")
    return dt.timedelta(seconds=int(text[:-1]) * units[text[-1]])
