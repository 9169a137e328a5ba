"""An OpenAI-compatible ``/v1/embeddings`` endpoint as an embedder (the production path)."""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from core import fastjson
from core.config import MAX_EMBEDDING_DIMENSION
from core.errors import ConfigError, EmbeddingsUnavailable
from core.http import CookielessClient, endpoint_url
from embeddings.base import normalise

#: Texts per request to an OpenAI-compatible endpoint (OpenAI takes up to 2048 inputs).
OPENAI_BATCH = 256


#: The types a JSON number decodes to (a bool's type is bool: not a number here).
_NUMBERS = frozenset((int, float))


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
        self.url = endpoint_url(
            base_url.rstrip("/").removesuffix("/v1") + "/v1/embeddings", "EMBEDDINGS_BASE_URL"
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = CookielessClient(
            timeout=httpx.Timeout(timeout_seconds), headers=headers, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        """The vectors and the tokens the endpoint says they cost (its ``usage``; 0 when it
        reports none)."""
        vectors: list[list[float]] = []
        tokens = 0
        for start in range(0, len(texts), OPENAI_BATCH):
            batch, used = self._request(list(texts[start : start + OPENAI_BATCH]))
            vectors.extend(batch)
            tokens += used
        return vectors, tokens

    def _request(self, texts: list[str]) -> tuple[list[list[float]], int]:
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
            answer = fastjson.loads(response.content)  # as response.json(), faster
            data = answer["data"]
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
            if not set(map(type, vector)) <= _NUMBERS:
                raise EmbeddingsUnavailable("embeddings endpoint: a vector of non-numbers")
            out.append(normalise(vector))
        usage = answer.get("usage") if isinstance(answer, dict) else None
        used = (
            usage.get("total_tokens", usage.get("prompt_tokens")) if isinstance(usage, dict) else 0
        )
        return out, used if isinstance(used, int) and not isinstance(used, bool) and used > 0 else 0
