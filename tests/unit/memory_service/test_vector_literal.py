"""The vector's text form (:func:`memories.store.vector_literal`): each component the ``real``
the column stores, written so that reading it back gives that ``real``."""

from __future__ import annotations

import random
import struct

from memories.store import vector_literal


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
    assert vector_literal((0.0, -0.0, 1.0, -1.0)) == "{0,-0,1,-1}"
