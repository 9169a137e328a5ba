"""The default embedder: the static model the ``wordllama`` wheel ships, loaded from the
package's own files (never the network)."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError, EmbeddingsUnavailable

LOCAL_MODEL = "local:wordllama-l2_supercat-256"
LOCAL_DIMENSION = 256
LOCAL_WEIGHTS = "weights/l2_supercat_256.safetensors"
LOCAL_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"


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
    # Python floats, as float(v) of each gives, in a third of the time.
    values: list[float] = (row / norm).tolist()
    return values
