"""The extract stage embeds a turn's memories in one request before the result is persisted;
an answer already carrying the current model's vectors is not embedded again, and an outage
leaves the answer without vectors instead of failing the turn. The write stage's body carries
each vector, outside the idempotency fingerprint."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from core.errors import EmbeddingsUnavailable
from extraction.metrics import PipelineMetrics
from extraction.stages import _embedded, _rounded, memory_body
from extraction.values import LlmAnswer, PersistedResult, TurnRef
from memories.service import new_memory
from memories.validation import quick_load_create

REF = TurnRef.of(uuid.uuid4(), uuid.uuid4(), 1)


class Embedder:
    model = "test:fake"
    dimension = 3

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        if self.fail:
            raise EmbeddingsUnavailable("down")
        return [[0.6, 0.8, 0.0] if t != "?" else [0.0, 0.0, 0.0] for t in texts]


class Metrics(PipelineMetrics):
    def __init__(self) -> None:
        self.requests: list[bool] = []

    def embedding_request(self, *, ok: bool, texts: int = 0) -> None:
        self.requests.append(ok)


def answer(*contents: str) -> LlmAnswer:
    memories = [{"content": c, "kind": "fact"} for c in contents]
    return LlmAnswer({"memories": memories}, "rules", "m", 0, 0)


def test_one_request_for_the_turn_and_vectors_in_the_persisted_form() -> None:
    embedder, metrics = Embedder(), Metrics()
    deps = SimpleNamespace(embedder=embedder, metrics=metrics)
    done = _embedded(deps, REF, answer("Dana likes tea.", "Dana lives in Oslo.", "?"))  # type: ignore[arg-type]
    assert embedder.calls == [["Dana likes tea.", "Dana lives in Oslo.", "?"]]
    assert metrics.requests == [True]
    first, second, unknown = done.result["memories"]
    assert first["embedding"] == {"model": "test:fake", "vector": [0.6, 0.8, 0.0]}
    assert second["embedding"]["model"] == "test:fake"
    assert "embedding" not in unknown  # a zero vector says nothing: none stored
    # Already embedded with the current model (a kept answer, a reused result): no request.
    again = _embedded(deps, REF, done)  # type: ignore[arg-type]
    assert again is done or again.result == done.result
    assert len(embedder.calls) == 1


def test_an_outage_leaves_the_answer_without_vectors() -> None:
    embedder, metrics = Embedder(fail=True), Metrics()
    deps = SimpleNamespace(embedder=embedder, metrics=metrics)
    given = answer("Dana likes tea.")
    assert _embedded(deps, REF, given) is given  # type: ignore[arg-type]
    assert metrics.requests == [False]


def test_no_embedder_or_no_memories_no_request() -> None:
    assert _embedded(SimpleNamespace(embedder=None), REF, answer("x")).result == {  # type: ignore[arg-type]
        "memories": [{"content": "x", "kind": "fact"}]
    }
    embedder = Embedder()
    _embedded(SimpleNamespace(embedder=embedder, metrics=Metrics()), REF, answer())  # type: ignore[arg-type]
    assert embedder.calls == []


def test_the_write_body_carries_the_vector_outside_the_fingerprint() -> None:
    embedded = {"model": "test:fake", "vector": [0.6, 0.8, 0.0]}
    stored = PersistedResult.from_row(
        {"memories": [{"content": "Dana likes tea.", "kind": "fact", "embedding": embedded}]},
        "rules",
        "m",
        0,
        0,
    )
    agent = uuid.uuid4()
    body = memory_body(agent, REF, 0, stored)
    assert body["embedding"] == embedded
    plain = {k: v for k, v in body.items() if k != "embedding"}
    with_vector = quick_load_create(body)
    without = quick_load_create(plain)
    assert with_vector is not None and without is not None
    a, b = new_memory(with_vector, "key"), new_memory(without, "key")
    assert a.fingerprint == b.fingerprint
    # The unit vector, as the real[] text the write sends.
    assert a.embedding == "{0.6,0.8,0.0}" and a.embedding_model == "test:fake"
    assert b.embedding is None


def test_a_stored_vector_is_unit_and_fits_a_real() -> None:
    from memories.vectors import unit_vector

    assert unit_vector([0.0, 0.0]) is None
    huge = unit_vector([3e200, 4e200, 1e-300])
    assert huge == pytest.approx((0.6, 0.8, 0.0)) and huge[2] == 0.0
    tiny = unit_vector([1.0, 7.5e-156, -1e-45])
    assert tiny == (1.0, 0.0, 0.0)


def _unit_left_to_right(vector: list[float]) -> tuple[float, ...] | None:
    """The definition: scaled by the largest magnitude, divided by the norm of a
    left-to-right sum of squares, components below 1e-30 stored as 0."""
    largest = max(abs(v) for v in vector)
    if largest == 0.0 or not math.isfinite(largest):
        return None
    scaled = [v / largest for v in vector]
    norm = math.sqrt(sum(v * v for v in scaled))
    return tuple(0.0 if abs(v / norm) < 1e-30 else v / norm for v in scaled)


def test_a_unit_vector_is_stored_as_its_definition_gives_it() -> None:
    """unit_vector sums the squares in array operations: over vectors of every scale, the
    ``real`` values a write sends are those of the left-to-right definition, and the
    doubles are within a few units of their last place."""
    from memories.vectors import unit_literal, unit_vector, vector_literal

    rng = random.Random(11)
    scales = (1.0, 1e-9, 1e9, 1e-150, 1e150)
    vectors = [
        [rng.gauss(0, 1) * rng.choice(scales) for _ in range(rng.choice((3, 256, 1536)))]
        for _ in range(400)
    ]
    for vector in vectors:
        ours, definition = unit_vector(vector), _unit_left_to_right(vector)
        assert ours is not None and definition is not None
        assert vector_literal(ours) == vector_literal(definition)
        # The write's one pass gives the same text.
        assert unit_literal(vector) == vector_literal(definition)
        assert ours == pytest.approx(definition, rel=1e-14, abs=1e-300)
    assert unit_vector([1.0, float("nan")]) is None
    assert unit_literal([1.0, float("nan")]) is None
    assert unit_literal([0.0, -0.0]) is None
    assert unit_vector([float("inf"), 1.0]) is None
    assert unit_vector([]) is None


def test_a_vector_is_rounded_component_by_component_to_seven_significant_digits() -> None:
    rng = random.Random(7)
    scales = (1.0, 1e-9, 1e9, 1e-320)
    vectors = [
        [rng.gauss(0, 1) * rng.choice(scales) for _ in range(rng.randint(1, 300))]
        for _ in range(300)
    ]
    vectors.append([0.0, -0.0, 0.5, -1e-5, 123456789.0, 0.1234567501])
    for vector in vectors:
        rounded = _rounded(vector)
        expected = [float(f"{v:.7g}") for v in vector]
        assert rounded == expected
        assert [math.copysign(1, v) for v in rounded] == [math.copysign(1, v) for v in expected]
