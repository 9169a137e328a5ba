"""What every embedder is: texts to unit vectors of one model and dimension."""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from typing import Protocol

from core.errors import EmbeddingsUnavailable


class Embedder(Protocol):
    """Texts to unit vectors of :attr:`dimension` floats, tagged with :attr:`model`."""

    @property
    def model(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order; raises :class:`EmbeddingsUnavailable`."""
        ...


def embed_counted(embedder: Embedder, texts: Sequence[str]) -> tuple[list[list[float]], int]:
    """:meth:`Embedder.embed` with the tokens the request cost, as the embedder reports them:
    an embedder with ``embed_counted`` (the OpenAI-compatible one, from the answer's
    ``usage``) says; any other (the local model, which bills nothing) counts 0."""
    counted = getattr(embedder, "embed_counted", None)
    if counted is not None:
        vectors, tokens = counted(texts)
        return list(vectors), int(tokens)
    return embedder.embed(texts), 0


def normalise(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1; raises :class:`EmbeddingsUnavailable` when it has a
    non-finite component or is all zeros (nothing to compare)."""
    # The same arithmetic in the same order as a loop per component, in C (a third faster).
    values = list(map(float, vector))
    if not all(map(math.isfinite, values)):
        raise EmbeddingsUnavailable("an embedding has a non-finite component")
    norm = math.sqrt(sum(map(operator.mul, values, values)))
    if norm == 0.0:
        raise EmbeddingsUnavailable("an embedding is all zeros")
    return list(map(operator.truediv, values, itertools.repeat(norm)))
