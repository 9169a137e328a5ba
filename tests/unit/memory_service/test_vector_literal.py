"""The vector's text form (:func:`memories.store.vector_literal`): each component the ``real``
the column stores, written so that reading it back gives that ``real``."""

from __future__ import annotations

import math
import random
import struct

from memories.store import vector_literal
from memories.vectors import _literal


def as_real(x: float) -> float:
    (value,) = struct.unpack("f", struct.pack("f", x))
    return float(value)


def test_the_text_reads_back_as_the_reals_of_the_vector() -> None:
    rng = random.Random(7)
    for size in (1, 3, 256, 1536):
        vector = [rng.gauss(0.0, 1.0) * 10 ** rng.randint(-30, 0) for _ in range(size)]
        text = vector_literal(vector)
        assert text.startswith("{") and text.endswith("}")
        parts = text[1:-1].split(",")
        assert len(parts) == size
        assert [as_real(float(p)) for p in parts] == [as_real(v) for v in vector]


def test_zeros_and_signs() -> None:
    assert vector_literal((0.0, -0.0, 1.0, -1.0)) == "{0.0,-0.0,1.0,-1.0}"


def float32_reals(seed: int, count: int) -> list[float]:
    """``count`` finite reals drawn as float32 bit patterns (every exponent, subnormals),
    after zero, negative zero, the largest real, the smallest subnormal and normal."""
    rng = random.Random(seed)
    reals = [0.0, -0.0, 3.4028234663852886e38, -1.401298464324817e-45, 1.1754943508222875e-38]
    while len(reals) < count:
        (value,) = struct.unpack("f", struct.pack("I", rng.getrandbits(32)))
        if math.isfinite(value):
            reals.append(value)
    return reals


def test_every_kind_of_real_reads_back_as_itself() -> None:
    """Every kind of real is written in digits that read back as the same real; the text is
    no longer, in all, than nine significant digits make it."""
    reals = float32_reals(5, 5000)
    for start in range(0, len(reals), 250):
        chunk = reals[start : start + 250]
        text = vector_literal(chunk)
        parts = text[1:-1].split(",")
        assert [as_real(float(p)) for p in parts] == chunk
        assert len(text) <= len(_literal(chunk))


def test_what_is_not_a_finite_real_is_written_as_before() -> None:
    """NaN and the infinities keep their spelling (Postgres reads them as such, never as
    NULL), and a component past a real's range is written as the infinity it rounds to."""
    assert vector_literal((float("nan"), 1.0)) == "{nan,1}"
    assert vector_literal((float("-inf"), 0.5)) == "{-inf,0.5}"
    assert vector_literal((1e39, 0.0)) == "{inf,0}"
