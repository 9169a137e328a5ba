"""Embedders: texts to unit vectors, for semantic search.

Three providers, chosen by ``EMBEDDINGS_PROVIDER`` (:class:`core.config.Settings`):

- ``local`` (the default): the static 256-dimension model ``l2_supercat_256`` that the
  ``wordllama`` wheel ships (weights and tokenizer inside the package). It is loaded from the
  package's own files, never from the network: ``WordLlama.load()`` looks for the packaged
  tokenizer in the wrong folder and then downloads it, so :class:`LocalEmbedder` opens the
  two files itself. A static model is a table lookup and a mean per text (about 0.1 ms for a
  sentence on one core), so the web process can embed queries inline.
- ``openai``: any OpenAI-compatible ``POST {EMBEDDINGS_BASE_URL}/v1/embeddings`` (httpx, one
  request per :meth:`Embedder.embed` call, bounded by ``EMBEDDINGS_TIMEOUT_SECONDS``). The key
  is sent as a bearer token and never logged nor put in an error message.
- ``none``: no embedder; search stays lexical.

Every vector is unit-normalised (so cosine similarity is a dot product) and its
:attr:`Embedder.model` names the provider and model (``local:wordllama-l2_supercat-256``,
``openai:text-embedding-3-small``): vectors of different models are never compared.
A failure (down, timeout, an answer that is not the vectors asked for) raises
:class:`~core.errors.EmbeddingsUnavailable`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from core.config import MAX_EMBEDDING_DIMENSION, Settings
from core.errors import ConfigError, EmbeddingsUnavailable

log = logging.getLogger(__name__)

LOCAL_MODEL = "local:wordllama-l2_supercat-256"
LOCAL_DIMENSION = 256
LOCAL_WEIGHTS = "weights/l2_supercat_256.safetensors"
LOCAL_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
#: Texts per request to an OpenAI-compatible endpoint (OpenAI takes up to 2048 inputs).
OPENAI_BATCH = 256
#: Query embeddings kept per process (search embeds the same questions again and again).
QUERY_CACHE_SIZE = 1024

__all__ = [
    "LOCAL_MODEL",
    "Embedder",
    "EmbeddingsUnavailable",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "QueryCache",
    "embedder_from_env",
    "embedder_from_settings",
    "normalise",
]


class Embedder(Protocol):
    """Texts to unit vectors of :attr:`dimension` floats, tagged with :attr:`model`."""

    @property
    def model(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order; raises :class:`EmbeddingsUnavailable`."""
        ...


def normalise(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1; raises :class:`EmbeddingsUnavailable` when it has a
    non-finite component or is all zeros (nothing to compare)."""
    values = [float(v) for v in vector]
    if not all(math.isfinite(v) for v in values):
        raise EmbeddingsUnavailable("an embedding has a non-finite component")
    norm = math.sqrt(sum(v * v for v in values))
    if norm == 0.0:
        raise EmbeddingsUnavailable("an embedding is all zeros")
    return [v / norm for v in values]


class LocalEmbedder:
    """The ``wordllama`` package's 256-dimension static model, from the wheel's own files."""

    model = LOCAL_MODEL
    dimension = LOCAL_DIMENSION
    #: No network: the memory service embeds a new memory before its insert, in the request
    #: (the vector then goes in with the row, one statement and one commit).
    in_process = True

    def __init__(self) -> None:
        try:
            import numpy as np
            import wordllama
            from safetensors import safe_open
            from tokenizers import Tokenizer
            from wordllama.inference import WordLlamaInference
        except ImportError as exc:  # pragma: no cover - an install without the dependency
            raise ConfigError(
                f"EMBEDDINGS_PROVIDER=local needs the wordllama package: {exc}",
                variable="EMBEDDINGS_PROVIDER",
            ) from exc
        root = Path(wordllama.__file__).parent
        weights, tokenizer_file = root / LOCAL_WEIGHTS, root / LOCAL_TOKENIZER
        for path in (weights, tokenizer_file):
            if not path.is_file():
                raise ConfigError(
                    f"EMBEDDINGS_PROVIDER=local: the wordllama package lacks {path.name}",
                    variable="EMBEDDINGS_PROVIDER",
                )
        with safe_open(str(weights), framework="np", device="cpu") as f:
            matrix = f.get_tensor("embedding.weight")
        if matrix.shape[1] != LOCAL_DIMENSION:
            raise ConfigError(
                f"the packaged wordllama model has {matrix.shape[1]} dimensions, not"
                f" {LOCAL_DIMENSION}",
                variable="EMBEDDINGS_PROVIDER",
            )
        self._np = np
        self._model = WordLlamaInference(matrix, Tokenizer.from_file(str(tokenizer_file)))
        # The tokenizer is not safe to share between threads (worker threads, gunicorn's).
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            with self._lock:
                matrix = self._model.embed(list(texts), norm=False)
        except Exception as exc:  # the library's own errors, whatever they are
            raise EmbeddingsUnavailable(f"local embedding failed: {type(exc).__name__}") from exc
        return [_unit_or_zero(self._np, row) for row in matrix]


def _unit_or_zero(np: Any, row: Any) -> list[float]:
    """A text with no known token (punctuation only) has a zero mean: it stays zero (its
    similarity to anything is 0) rather than failing the batch."""
    norm = float(np.linalg.norm(row))
    if not math.isfinite(norm) or norm == 0.0:
        return [0.0] * len(row)
    return [float(v) for v in row / norm]


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        dimension: int,
        *,
        api_key: str | None = None,
        timeout_seconds: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not 1 <= dimension <= MAX_EMBEDDING_DIMENSION:
            raise ConfigError(
                f"EMBEDDINGS_DIMENSION must be 1..{MAX_EMBEDDING_DIMENSION}, got {dimension}",
                variable="EMBEDDINGS_DIMENSION",
            )
        self.remote_model = model
        self.model = f"openai:{model}"
        self.dimension = dimension
        self.url = base_url.rstrip("/").removesuffix("/v1") + "/v1/embeddings"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_seconds), headers=headers, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), OPENAI_BATCH):
            vectors.extend(self._request(list(texts[start : start + OPENAI_BATCH])))
        return vectors

    def _request(self, texts: list[str]) -> list[list[float]]:
        try:
            response = self._client.post(
                self.url, json={"model": self.remote_model, "input": texts}
            )
        except httpx.TimeoutException as exc:
            raise EmbeddingsUnavailable(f"embeddings endpoint timed out ({self.url})") from exc
        except httpx.HTTPError as exc:
            # The exception's text names the URL at most; the key is only in a header.
            raise EmbeddingsUnavailable(
                f"embeddings endpoint unreachable ({self.url}): {type(exc).__name__}"
            ) from exc
        if response.status_code != 200:
            raise EmbeddingsUnavailable(
                f"embeddings endpoint answered {response.status_code} ({self.url})"
            )
        try:
            data = response.json()["data"]
            items = sorted(data, key=lambda item: int(item["index"]))
            vectors = [item["embedding"] for item in items]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingsUnavailable("embeddings endpoint: not an embeddings answer") from exc
        if len(vectors) != len(texts) or [int(i["index"]) for i in items] != list(
            range(len(texts))
        ):
            raise EmbeddingsUnavailable(
                f"embeddings endpoint: {len(vectors)} vectors for {len(texts)} texts"
            )
        out = []
        for vector in vectors:
            if not isinstance(vector, list) or len(vector) != self.dimension:
                got = len(vector) if isinstance(vector, list) else type(vector).__name__
                raise EmbeddingsUnavailable(
                    f"embeddings endpoint: a vector of {got}, not {self.dimension} dimensions"
                )
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in vector):
                raise EmbeddingsUnavailable("embeddings endpoint: a vector of non-numbers")
            out.append(normalise(vector))
        return out


class QueryCache:
    """A small LRU of query embeddings keyed by (model, text), shared by a process's threads."""

    def __init__(self, embedder: Embedder, size: int = QUERY_CACHE_SIZE) -> None:
        self.embedder = embedder
        self.size = size
        self._items: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def model(self) -> str:
        return self.embedder.model

    @property
    def dimension(self) -> int:
        return self.embedder.dimension

    def embed_query(self, text: str) -> list[float]:
        """The vector of one query, from the cache when asked before."""
        key = (self.embedder.model, text)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        (vector,) = self.embedder.embed([text])
        with self._lock:
            self._items[key] = vector
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return vector


_LOCAL: LocalEmbedder | None = None
_LOCAL_LOCK = threading.Lock()


def embedder_from_settings(settings: Settings) -> Embedder | None:
    """The configured embedder, or None for ``none``. The local model is loaded once per
    process (16 MB of weights) and shared."""
    global _LOCAL
    provider = settings.embeddings_provider
    if provider == "none":
        return None
    if provider == "openai":
        assert settings.embeddings_base_url and settings.embeddings_model
        assert settings.embeddings_dimension is not None
        return OpenAIEmbedder(
            settings.embeddings_base_url,
            settings.embeddings_model,
            settings.embeddings_dimension,
            api_key=settings.embeddings_api_key,
            timeout_seconds=settings.embeddings_timeout_seconds,
        )
    if settings.embeddings_dimension not in (None, LOCAL_DIMENSION):
        raise ConfigError(
            f"EMBEDDINGS_PROVIDER=local has {LOCAL_DIMENSION} dimensions, not"
            f" {settings.embeddings_dimension}",
            variable="EMBEDDINGS_DIMENSION",
        )
    with _LOCAL_LOCK:
        if _LOCAL is None:
            _LOCAL = LocalEmbedder()
        return _LOCAL


def embedder_from_env(env: Mapping[str, str] | None = None) -> Embedder | None:
    """:func:`embedder_from_settings` of the settings of ``env`` (the process's environment
    when None)."""
    return embedder_from_settings(Settings.from_env(env))
