"""The web process's cache of query vectors: search embeds the same questions again and again."""

from __future__ import annotations

import threading
from collections import OrderedDict

from embeddings.base import Embedder

#: Query embeddings kept per process.
QUERY_CACHE_SIZE = 1024


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
