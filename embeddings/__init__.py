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

import threading
from collections.abc import Mapping

from core.config import Settings
from core.errors import ConfigError, EmbeddingsUnavailable
from embeddings.base import Embedder, embed_counted, normalise
from embeddings.cache import QueryCache
from embeddings.local import LOCAL_DIMENSION, LOCAL_MODEL, LocalEmbedder

__all__ = [
    "LOCAL_MODEL",
    "Embedder",
    "EmbeddingsUnavailable",
    "LocalEmbedder",
    "QueryCache",
    "embed_counted",
    "embedder_from_env",
    "embedder_from_settings",
    "normalise",
]

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
        # httpx (and the command line it brings when rich is installed) loads here, not with
        # every process that imports the pipeline's stages: ``ibex scan`` starts 0.1 s sooner.
        from embeddings.remote import OpenAIEmbedder

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
