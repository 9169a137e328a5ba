"""JSON read at orjson's speed, with the standard library's answers.

A turn's vectors travel as JSON numbers: the embedder's answer (an OpenAI-style endpoint's),
the result the extract stage stores (read back by a write served by another process, or
retried), and each write's body, which the memory service parses. ``json.loads`` reads a body
with a 1,536-dimension vector in about 0.55 ms, :func:`loads` in 0.11. It gives what
``json.loads`` (or the ``fallback`` a caller names) gives for the same input, only faster:

- orjson accepts less (NaN and Infinity, lone surrogates, UTF-16 bytes, nesting past 1,024):
  whatever it refuses is read by ``fallback``, which accepts or refuses it as it always did;
- orjson reads an integer outside [-2**63, 2**64) as the nearest float, where json keeps the
  integer: a document holding a float that large (a written ``1e19`` as well) is read again
  by ``fallback``, so no integer is ever rounded.

Everything orjson accepts otherwise, json reads as the same values (floats correctly rounded
by both, the last of duplicate keys kept by both); tests/unit/core/test_fastjson.py compares
the two on generated documents.

Written the other way, :func:`compact` is ``json.dumps`` byte for byte, for the texts that are
hashed or replayed as bytes (the services' answers, request fingerprints, turn digests).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import orjson

#: The smallest magnitude a float from an integer orjson could not hold as one has.
_INTEGER_LIMIT = 9223372036854775808.0  # 2**63


def loads(data: str | bytes, fallback: Callable[[Any], Any] = json.loads) -> Any:
    """The document in ``data``, as ``fallback`` (``json.loads``) reads it; raises what
    ``fallback`` raises."""
    try:
        document = orjson.loads(data)
        if _no_large_float(document):
            return document
    except (orjson.JSONDecodeError, RecursionError):  # nested deeper than this check goes
        pass
    return fallback(data)


def dumps(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)`` up to spacing and the spelling of numbers
    (``1e-05`` is written ``1e-5``): the same document, for a ``jsonb`` column. A value
    orjson would write differently or refuse (a float that is not finite, which it writes as
    null; any type but dict, list, tuple, str, int, float, bool and None, subclasses
    included; keys that are not strings; integers past 64 bits; lone surrogates) is written
    by ``json.dumps``, which writes or refuses it as it always did."""
    try:
        if _plain(value):
            return orjson.dumps(value).decode("utf-8")
    except (orjson.JSONEncodeError, RecursionError):
        pass
    return json.dumps(value, ensure_ascii=False)


def sorted_dumps(value: Any, fallback: Callable[[Any], bytes]) -> bytes:
    """``value`` as compact UTF-8 JSON with its keys sorted, by orjson: the values ``fallback``
    (a ``json.dumps(sort_keys=True)`` of the caller's) writes, up to the spelling of numbers.
    What :func:`dumps` would leave to ``json.dumps`` is written by ``fallback``."""
    try:
        if _plain(value):
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, RecursionError):
        pass
    return fallback(value)


def compact(value: Any, *, sort_keys: bool = False) -> bytes:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys)``
    in UTF-8, byte for byte. orjson writes a value made only of strings, integers, booleans,
    None, lists, tuples and dicts with string keys: for those the two write the same bytes
    (every code point escaped alike, keys sorted alike). A float (the two spell some
    differently: ``1e-05``, ``1e-5``), an integer past 64 bits or any other type is written
    by ``json.dumps``, which writes or refuses it as it always did."""
    if _exact(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
        except (orjson.JSONEncodeError, RecursionError):
            pass
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys)
    return text.encode("utf-8")


def _exact(value: Any) -> bool:
    """Whether ``value`` holds only the types orjson writes as ``json.dumps`` does, bytes
    and all: no float, no subclass. (Keys that are not strings, integers past 64 bits and
    lone surrogates orjson refuses: :func:`compact` then asks ``json.dumps``.)"""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is dict:
        return all(map(_exact, value.values()))
    if kind is list or kind is tuple:
        return all(map(_exact, value))
    return False


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only JSON's own types and finite floats. A list of numbers is
    summed at C speed: a sum that is not finite (or too large for a float) sends the value to
    json.dumps, which is only slower."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(map(_plain, value.values()))
    if kind is list or kind is tuple:
        try:
            return math.isfinite(sum(value))
        except TypeError:  # not all numbers
            return all(map(_plain, value))
        except OverflowError:
            return False
    return kind is str or kind is int or kind is bool or value is None


def _no_large_float(value: Any) -> bool:
    """Whether no float in ``value`` has a magnitude of 2**63 or more. A list of numbers is
    checked by its least and greatest, found at C speed (only numbers compare with numbers and
    strings with strings: a list of two or more whose least is a number holds numbers)."""
    kind = type(value)
    if kind is float:
        return bool(-_INTEGER_LIMIT < value < _INTEGER_LIMIT)
    if kind is dict:
        return all(map(_no_large_float, value.values()))
    if kind is list:
        if not value:
            return True
        try:
            low, high = min(value), max(value)
        except TypeError:  # not all comparable (dicts, None, numbers with strings)
            return all(map(_no_large_float, value))
        least = type(low)
        if least is str:
            return True
        # Numbers (a list of one value of any type compares nothing: it is walked). An
        # integer may equal a float at the limit (-2**63): there each value is seen.
        if (least is int or least is float or least is bool) and (
            low > -_INTEGER_LIMIT and high < _INTEGER_LIMIT
        ):
            return True
        return all(map(_no_large_float, value))
    return True
