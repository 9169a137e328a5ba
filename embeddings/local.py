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
        # As wordllama's own inference holds it: float32, C order.
        self._matrix = np.ascontiguousarray(matrix.astype(np.float32))
        self._last_id = self._matrix.shape[0] - 1
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        # Every token of every text, unpadded (wordllama's inference pads a batch and masks
        # the padding out of the mean: the same sums).
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        # The tokenizer is not safe to share between threads (worker threads, gunicorn's).
        self._lock = threading.Lock()
        # The same ids without the offsets, tokens and masks an encoding also carries (9 us a
        # short text against 14 for ``encode``: tokenizers 0.20 and later).
        self._encode_batch = getattr(
            self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            with self._lock:
                encodings = self._encode_batch(list(texts), add_special_tokens=False)
            rows = [self._mean(encoding.ids) for encoding in encodings]
        except Exception as exc:  # the library's own errors, whatever they are
            raise EmbeddingsUnavailable(f"local embedding failed: {type(exc).__name__}") from exc
        return [_unit_or_zero(self._np, row).tolist() for row in rows]

    def embed_array(self, text: str) -> Any:
        """:meth:`embed` of one text as the model's float32 array (the same values): for a
        caller that works on arrays (the memory service's write, whose vector goes to
        Postgres as text), without a list of Python floats in between."""
        try:
            with self._lock:
                ids = self._encode_batch([text], add_special_tokens=False)[0].ids
            row = self._mean(ids)
        except Exception as exc:  # the library's own errors, whatever they are
            raise EmbeddingsUnavailable(f"local embedding failed: {type(exc).__name__}") from exc
        return _unit_or_zero(self._np, row)

    def _mean(self, ids: list[int]) -> Any:
        """The mean of the tokens' rows, as ``WordLlamaInference.embed(norm=False)`` pools
        them (ids past the matrix clamped to its last row; float32 sums, row by row, divided
        by the count; no token: zeros), with one text's array operations instead of a padded
        batch's (about 35 -> 20 us a short text)."""
        np = self._np
        positions = np.array(ids, dtype=np.intp)
        np.minimum(positions, self._last_id, out=positions)
        total = self._matrix[positions].sum(axis=0, dtype=np.float32)
        return total / np.float32(max(len(ids), 1))


def _unit_or_zero(np: Any, row: Any) -> Any:
    """The row scaled to length 1, in float32. A text with no known token (punctuation
    only) has a zero mean: it stays zero (its similarity to anything is 0) rather than
    failing the batch. (``tolist()`` gives Python floats, as float(v) of each gives, in a third
    of the time.)"""
    norm = float(np.linalg.norm(row))
    if not math.isfinite(norm) or norm == 0.0:
        return np.zeros(len(row), dtype=np.float32)
    return row / norm
