"""The vectors of memories written without one, embedded and stored after their commit in
batches, by one thread per process.

With a remote embedder (``EMBEDDINGS_PROVIDER=openai``), a memory created through the API
without a vector is stored and answered first (its 201 does not wait for the endpoint);
:class:`PendingVectors` then embeds it with the others written in the same moment, in one
embedder request, and stores their vectors in one statement per org (``put_embeddings``): a
request's round trip and a statement's fixed work once a batch instead of once a memory. (The
in-process model embeds in the request, with the row: stored here, a vector cost Postgres more
than the web saved, docs/benchmarks.md; it comes here only when that failed.)

A batch is taken when a write finds the thread idle, after at most :data:`LINGER_SECONDS`
(writes arriving meanwhile join it), at once when a read waits for it (:meth:`flush`) or when
:data:`BATCH_SIZE` are waiting. Nothing here can fail a write: an embedder or database outage
leaves the batch's memories lexical (counted and logged, without their text) and pauses the
queue for :data:`PAUSE_SECONDS`; a process that dies with memories queued leaves them lexical
too. The scheduler's backfill round (:mod:`memories.backfill`) embeds every memory without a
vector, so each of them gets one.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
import weakref
from collections import defaultdict
from dataclasses import dataclass

from core.errors import ConfigError, DatabaseUnavailableError, EmbeddingsUnavailable
from embeddings import Embedder
from memories.metrics import MemoryMetrics
from memories.vectors import EmbeddingStore, unit_pairs

log = logging.getLogger(__name__)

#: How long a batch waits for more writes after its first one.
LINGER_SECONDS = 0.05
#: The most memories a batch takes (one embedder request, one statement per org).
BATCH_SIZE = 64
#: The most memories waiting; past it a write stays lexical (the backfill embeds it).
CAPACITY = 10_000
#: After a failure, writes are not queued this long (the backfill catches up).
PAUSE_SECONDS = 30.0
#: How long a read waits for the vectors of the writes before it (:meth:`flush`).
FLUSH_SECONDS = 2.0


#: Every queue of this process that has started its thread (:func:`close_all`).
_QUEUES: weakref.WeakSet[PendingVectors] = weakref.WeakSet()
_QUEUES_LOCK = threading.Lock()


def close_all(timeout: float = FLUSH_SECONDS) -> None:
    """Store what every queue of this process holds, then stop their threads (at the
    process's exit; and after a test, whose pool closes next)."""
    with _QUEUES_LOCK:
        queues = list(_QUEUES)
        _QUEUES.clear()
    for queue in queues:
        queue.close(timeout)


@dataclass(frozen=True)
class Pending:
    org_id: uuid.UUID
    memory_id: uuid.UUID
    content: str


class PendingVectors:
    """A process's queue of memories to embed, and the thread that embeds and stores them."""

    def __init__(
        self,
        embedder: Embedder,
        embeddings: EmbeddingStore,
        metrics: MemoryMetrics,
        *,
        linger_seconds: float = LINGER_SECONDS,
        batch_size: int = BATCH_SIZE,
        capacity: int = CAPACITY,
    ) -> None:
        self.embedder = embedder
        self.embeddings = embeddings
        self.metrics = metrics
        self.linger_seconds = linger_seconds
        self.batch_size = batch_size
        self.capacity = capacity
        self._cond = threading.Condition()
        self._items: list[Pending] = []
        #: Memories queued and memories settled (stored, or left lexical), since the start:
        #: a flush waits for the second to reach the first as it was when it was called.
        self._queued = 0
        self._settled = 0
        self._flushes = 0
        self._paused_until = 0.0
        self._closing = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        # A pool closed under the thread (a test's, at its end) lets it store what it holds.
        hooks = getattr(embeddings.db, "before_close_all", None)
        if hooks is not None:
            hooks.append(self.flush)

    def add(self, org_id: uuid.UUID, memory_id: uuid.UUID, content: str) -> bool:
        """Queue a committed memory for its vector; False when it stays lexical for now
        (paused after a failure, or the queue full: the backfill embeds it)."""
        with self._cond:
            if time.monotonic() < self._paused_until or self._closing:
                return False
            if len(self._items) >= self.capacity:
                self.metrics.embeddings_failed.inc()
                return False
            self._start()
            self._items.append(Pending(org_id, memory_id, content))
            self._queued += 1
            # Wake the thread for its first memory and for a full batch, not for each one
            # that joins a lingering batch.
            if len(self._items) == 1 or len(self._items) >= self.batch_size:
                self._cond.notify_all()
        return True

    def flush(self, timeout: float = FLUSH_SECONDS) -> bool:
        """Wait until every memory queued before this call has its vector stored (or was
        left lexical); False if that took longer than ``timeout``. Cheap when nothing waits."""
        if self._settled == self._queued:  # read without the lock: an int's value is whole
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._queued
            self._flushes += 1
            self._cond.notify_all()
            try:
                while self._settled < target:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._flushes -= 1
        return True

    def close(self, timeout: float = FLUSH_SECONDS) -> None:
        """Store what is queued (waiting at most ``timeout``), then stop the thread. Writes
        after it stay lexical."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _start(self) -> None:
        """Start the thread in this process (under the lock). A forked child (a gunicorn
        worker of a preloaded app) starts its own: the parent's thread is not in it, and
        neither are its memories (a child forks before it serves)."""
        if self._thread is not None and self._pid == os.getpid():
            return
        if self._pid != os.getpid():
            self._items.clear()
            self._settled = self._queued
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="ibex-pending-vectors", daemon=True)
        self._thread.start()
        with _QUEUES_LOCK:
            _QUEUES.add(self)

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._store(batch)
            except Exception:  # the thread must outlive any one batch
                log.exception("%d memories stored without a vector (backfilled later)", len(batch))
                self.metrics.embeddings_failed.inc(len(batch))
            finally:
                with self._cond:
                    self._settled += len(batch)
                    self._cond.notify_all()

    def _take(self) -> list[Pending] | None:
        """The next batch: the first waiting memory and those that join it within the
        linger (at once for a waiting read or a full batch); None when closing."""
        with self._cond:
            while not self._items:
                if self._closing:
                    return None
                self._cond.wait()
            deadline = time.monotonic() + self.linger_seconds
            while len(self._items) < self.batch_size and not self._flushes and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = self._items[: self.batch_size]
            del self._items[: self.batch_size]
        return batch

    def _store(self, batch: list[Pending]) -> None:
        """One embedder call for the batch, one statement per org (under its tenant)."""
        try:
            vectors = self.embedder.embed([p.content for p in batch])
            by_org: dict[uuid.UUID, list[tuple[uuid.UUID, list[float]]]] = defaultdict(list)
            for pending, vector in zip(batch, vectors, strict=True):
                by_org[pending.org_id].append((pending.memory_id, vector))
            model, dimension = self.embedder.model, self.embedder.dimension
            for org_id, rows in by_org.items():
                self.embeddings.put(org_id, model, dimension, unit_pairs(rows))
        except (EmbeddingsUnavailable, DatabaseUnavailableError, ConfigError) as exc:
            with self._cond:
                self._paused_until = time.monotonic() + PAUSE_SECONDS
            self.metrics.embeddings_failed.inc(len(batch))
            log.warning(
                "%d memories stored without a vector (backfilled later): %s", len(batch), exc
            )
        finally:
            self.embeddings.release()


atexit.register(close_all)
