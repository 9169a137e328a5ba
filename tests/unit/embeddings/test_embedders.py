"""The embedders: the OpenAI-compatible client against httpx.MockTransport (batching, order,
timeouts, bad answers, the key never in an error or a log line), the packaged local model
loaded with the network refused, the query cache, and the EMBEDDINGS_* settings."""

from __future__ import annotations

import json
import logging
import math
import socket
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from core.config import Settings
from core.errors import ConfigError, EmbeddingsUnavailable
from embeddings import (
    LOCAL_MODEL,
    LocalEmbedder,
    QueryCache,
    embedder_from_env,
    normalise,
    remote,
)
from embeddings.remote import OpenAIEmbedder

KEY = "sk-test-secret-123"


def _vector(text: str, dimension: int) -> list[float]:
    return [float(len(text) + i) for i in range(dimension)]


def client(handler: Any, dimension: int = 4) -> OpenAIEmbedder:
    return OpenAIEmbedder(
        "http://emb.test",
        "text-embedding-test",
        dimension,
        api_key=KEY,
        timeout_seconds=1,
        transport=httpx.MockTransport(handler),
    )


def answering(dimension: int = 4, requests: list[Any] | None = None) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if requests is not None:
            requests.append((request, body))
        data = [
            {"index": i, "embedding": _vector(t, dimension)} for i, t in enumerate(body["input"])
        ]
        return httpx.Response(200, json={"data": list(reversed(data))})

    return handler


def test_one_request_per_batch_in_order_unit_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "OPENAI_BATCH", 2)
    seen: list[Any] = []
    embedder = client(answering(requests=seen))
    texts = ["a", "bb", "ccc", "dddd", "eeeee"]
    vectors = embedder.embed(texts)
    assert len(seen) == 3
    assert [body["input"] for _, body in seen] == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert all(body["model"] == "text-embedding-test" for _, body in seen)
    request = seen[0][0]
    assert request.url == "http://emb.test/v1/embeddings"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    # Answered out of order: put back in the texts' order, each normalised.
    for text, vector in zip(texts, vectors, strict=True):
        assert vector == pytest.approx(normalise(_vector(text, 4)))
        assert math.isclose(sum(v * v for v in vector), 1.0)
    assert embedder.model == "openai:text-embedding-test"
    assert embedder.dimension == 4


def test_a_base_url_with_v1_is_not_doubled() -> None:
    embedder = OpenAIEmbedder("http://emb.test/v1/", "m", 4)
    assert embedder.url == "http://emb.test/v1/embeddings"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (httpx.Response(503, json={"error": "down"}), "answered 503"),
        (httpx.Response(200, text="not json"), "not an embeddings answer"),
        (httpx.Response(200, json={"data": [{"index": 0}]}), "not an embeddings answer"),
        (httpx.Response(200, json={"data": []}), "0 vectors for 1 texts"),
        (
            httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0, 2.0]}]}),
            "a vector of 2, not 4 dimensions",
        ),
        (
            httpx.Response(200, json={"data": [{"index": 0, "embedding": [1, "x", 2, 3]}]}),
            "non-numbers",
        ),
        (
            httpx.Response(200, json={"data": [{"index": 0, "embedding": [0, 0, 0, 0]}]}),
            "all zeros",
        ),
        (
            httpx.Response(200, json={"data": [{"index": 3, "embedding": [1, 2, 3, 4]}]}),
            "1 vectors for 1 texts",
        ),
    ],
)
def test_bad_answers_are_unavailable(
    answer: httpx.Response, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    embedder = client(lambda request: answer)
    with pytest.raises(EmbeddingsUnavailable) as raised:
        embedder.embed(["hello"])
    assert message in str(raised.value)
    assert KEY not in str(raised.value)
    assert KEY not in caplog.text


def test_timeout_and_connection_errors_are_unavailable_without_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(EmbeddingsUnavailable, match="timed out") as timed_out:
        client(slow).embed(["x"])
    with pytest.raises(EmbeddingsUnavailable, match="unreachable") as unreachable:
        client(refused).embed(["x"])
    for raised in (timed_out, unreachable):
        assert KEY not in str(raised.value)
        assert KEY not in repr(raised.value.__cause__)
    assert KEY not in caplog.text


def test_settings_redact_the_key() -> None:
    settings = Settings.from_env(
        {
            "EMBEDDINGS_PROVIDER": "openai",
            "EMBEDDINGS_BASE_URL": "http://emb.test",
            "EMBEDDINGS_MODEL": "m",
            "EMBEDDINGS_DIMENSION": "8",
            "EMBEDDINGS_API_KEY": KEY,
        }
    )
    assert settings.embeddings_api_key == KEY
    assert KEY not in repr(settings.redacted())


def test_the_local_model_loads_from_the_package_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the local embedder touched the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    embedder = LocalEmbedder()
    assert embedder.model == LOCAL_MODEL
    assert embedder.dimension == 256
    question, answer, other = embedder.embed(
        ["what is Dana allergic to?", "Dana is allergic to peanuts.", "The user lives in Oslo."]
    )
    assert len(question) == 256
    assert math.isclose(sum(v * v for v in question), 1.0, rel_tol=1e-5)

    def cos(a: Sequence[float], b: Sequence[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cos(question, answer) > cos(question, other) + 0.3
    assert embedder.embed([]) == []


def test_the_local_embedder_pools_as_wordllamas_own_inference() -> None:
    """The embedder pools one text at a time; wordllama's inference pads a batch of up to 64
    and masks the padding out. The vectors must be the same, bit for bit: stored vectors and
    query vectors made before and after compare by cosine."""
    from pathlib import Path

    import numpy as np
    import wordllama
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    from embeddings.local import LOCAL_TOKENIZER, LOCAL_WEIGHTS, _unit_or_zero

    embedder = LocalEmbedder()
    root = Path(wordllama.__file__).parent
    with safe_open(str(root / LOCAL_WEIGHTS), framework="np", device="cpu") as f:
        matrix = f.get_tensor("embedding.weight")
    reference = WordLlamaInference(matrix, Tokenizer.from_file(str(root / LOCAL_TOKENIZER)))
    rng = np.random.default_rng(7)
    sentence = "the user Dana is allergic to peanuts lives in Oslo café 1999 naïve ok ?!"
    words = sentence.split()
    texts = ["", "...", "!?", "a", "Dana is allergic to peanuts.", "日本語のテキスト", "x" * 300]
    texts += [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 60, 150)]
    texts.append(" ".join(rng.choice(words, size=3000)))  # longer than any padding
    ours = embedder.embed(texts)
    theirs = reference.embed(texts, norm=False)  # batches of 64, padded
    assert len(ours) == len(texts)
    for text, mine, row in zip(texts, ours, theirs, strict=True):
        assert mine == _unit_or_zero(np, row).tolist()
        # One text as an array (the memory service's write): the same float32 values.
        array = embedder.embed_array(text)
        assert array.dtype == np.float32 and array.tolist() == mine
    assert ours[0] == [0.0] * 256  # no token: zero, as wordllama's mean of nothing
    assert embedder.embed(["Dana is allergic to peanuts."]) == [ours[4]]


def test_the_local_embedder_is_the_default_and_shared() -> None:
    first = embedder_from_env({})
    assert first is not None and first.model == LOCAL_MODEL
    assert embedder_from_env({"EMBEDDINGS_PROVIDER": "local"}) is first
    assert embedder_from_env({"EMBEDDINGS_PROVIDER": "none"}) is None


class CountingEmbedder:
    model = "test:counting"
    dimension = 2

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return [[1.0, float(len(t))] for t in texts]


def test_the_query_cache_is_a_small_lru_keyed_by_model_and_text() -> None:
    inner = CountingEmbedder()
    cache = QueryCache(inner, size=2)
    assert cache.embed_query("a") == [1.0, 1.0]
    cache.embed_query("a")
    assert inner.calls == [["a"]]
    cache.embed_query("bb")
    cache.embed_query("a")  # a is now the most recent
    cache.embed_query("ccc")  # evicts bb
    cache.embed_query("a")
    assert inner.calls == [["a"], ["bb"], ["ccc"]]
    cache.embed_query("bb")
    assert inner.calls[-1] == ["bb"]
    inner.model = "test:other"  # type: ignore[misc]
    cache.embed_query("a")  # another model: not the cached vector
    assert inner.calls[-1] == ["a"]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"EMBEDDINGS_PROVIDER": "bert"}, "EMBEDDINGS_PROVIDER"),
        ({"EMBEDDINGS_PROVIDER": "openai"}, "EMBEDDINGS_BASE_URL"),
        (
            {"EMBEDDINGS_PROVIDER": "openai", "EMBEDDINGS_BASE_URL": "http://x"},
            "EMBEDDINGS_MODEL",
        ),
        (
            {
                "EMBEDDINGS_PROVIDER": "openai",
                "EMBEDDINGS_BASE_URL": "http://x",
                "EMBEDDINGS_MODEL": "m",
            },
            "EMBEDDINGS_DIMENSION",
        ),
        (
            {
                "EMBEDDINGS_PROVIDER": "openai",
                "EMBEDDINGS_BASE_URL": "ftp://x",
                "EMBEDDINGS_MODEL": "m",
                "EMBEDDINGS_DIMENSION": "8",
            },
            "EMBEDDINGS_BASE_URL",
        ),
        ({"EMBEDDINGS_DIMENSION": "5000"}, "EMBEDDINGS_DIMENSION"),
        ({"EMBEDDINGS_DIMENSION": "0"}, "EMBEDDINGS_DIMENSION"),
        ({"EMBEDDINGS_TIMEOUT_SECONDS": "0"}, "EMBEDDINGS_TIMEOUT_SECONDS"),
    ],
)
def test_bad_settings_name_their_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(env)
    assert raised.value.variable == variable


def test_the_local_model_has_256_dimensions_only() -> None:
    with pytest.raises(ConfigError) as raised:
        embedder_from_env({"EMBEDDINGS_DIMENSION": "512"})
    assert raised.value.variable == "EMBEDDINGS_DIMENSION"
