"""Vectors for the search speed bench: one per generated memory, loaded with binary COPY.

A memory of :mod:`bench.search_speed` is a name, a verb and one or two objects from word
lists, the verb and objects chosen by its number ``g``. Its vector is the local model's
embedding of its "verb object" phrase (plus the second object's phrase where it has one), plus
Gaussian noise (:data:`NOISE`, deterministic from the seed), unit-normalised: memories about the
same thing cluster as real ones do, and no two vectors are equal (an HNSW graph over many
identical points is not what a real store holds). Queries are embedded with the same model, so
their nearest memories are the ones about what they ask.

The rows go straight into ``ibex_memory.memory_embeddings`` in PostgreSQL's binary COPY format
(``real[]`` as the array's binary form), built with numpy a chunk at a time, while another
connection reads the memories' ids in order. The load runs with ``session_replication_role =
replica`` (no foreign-key triggers: the rows are consistent by construction), and without the
HNSW index, which is built once afterwards (faster by far than a million inserts into it).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench import BenchError
from bench.dbadmin import admin_connection, scalar

#: The noise added to a memory's phrase vector, as the expected norm of the noise vector.
NOISE = 0.6
CHUNK = 20_000
HNSW_INDEX = "idx_memory_embeddings_hnsw_{dimension}"
#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 UTC).
PG_EPOCH_US = 946_684_800_000_000
FLOAT4_OID = 700

IDS_SQL = """
SELECT uuid_send(id), uuid_send(agent_id), uuid_send(org_id),
       (extract(epoch FROM created_at) * 1000000)::int8 - %s
  FROM ibex_memory.memories ORDER BY created_at, id
"""


def phrase_vectors(
    embedder: Any, verbs: Sequence[str], objects: Sequence[str]
) -> Any:  # numpy array (verbs, objects, dimension)
    import numpy as np

    texts = [f"{v} {o}" for v in verbs for o in objects]
    matrix = np.asarray(embedder.embed(texts), dtype=np.float64)
    return matrix.reshape(len(verbs), len(objects), -1)


def memory_vectors(
    phrases: Any, g: Any, seed: int
) -> Any:  # numpy float32 (len(g), dimension), unit rows
    """The vectors of memories number ``g`` (the generator's formulas: verb ``(g / 7) % V``,
    object ``(g / 3) % O``, a second object ``(g / 11) % O`` when ``g % 3 == 0``)."""
    import numpy as np

    verbs, objects, dimension = phrases.shape
    base = phrases[(g // 7) % verbs, (g // 3) % objects].copy()
    second = g % 3 == 0
    base[second] += phrases[(g[second] // 7) % verbs, (g[second] // 11) % objects]
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    rng = np.random.default_rng([seed, int(g[0])])
    base += rng.standard_normal(base.shape) * (NOISE / np.sqrt(dimension))
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    return base.astype(np.float32)


def _row_dtype(model: bytes, dimension: int) -> Any:
    import numpy as np

    return np.dtype(
        [
            ("fields", ">i2"),
            ("org_len", ">i4"), ("org", "S16"),
            ("memory_len", ">i4"), ("memory", "S16"),
            ("agent_len", ">i4"), ("agent", "S16"),
            ("model_len", ">i4"), ("model", f"S{len(model)}"),
            ("dimension_len", ">i4"), ("dimension", ">i4"),
            ("array_len", ">i4"), ("array_header", ">i4", (5,)),
            ("elements", [("len", ">i4"), ("value", ">f4")], (dimension,)),
            ("created_len", ">i4"), ("created", ">i8"),
        ]
    )  # fmt: skip


class _CopyStream:
    """A file-like object for ``copy_expert``: the binary COPY data, produced as read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
        self._done = False

    def read(self, size: int = -1) -> bytes:
        while not self._done and (size < 0 or len(self._buffer) < size):
            chunk = next(self._chunks, None)
            if chunk is None:
                self._buffer += struct.pack(">h", -1)
                self._done = True
            else:
                self._buffer += chunk
        if size < 0:
            size = len(self._buffer)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out


def load(
    url: str,
    embedder: Any,
    verbs: Sequence[str],
    objects: Sequence[str],
    seed: int,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One vector per memory of the database ``url``, then the HNSW index where pgvector is;
    the seconds each step took. With ``texts`` (the memories' contents in the order of
    :data:`IDS_SQL`), each memory's vector is the model's vector of its text instead."""
    import numpy as np

    model = embedder.model.encode()
    dimension = embedder.dimension
    phrases = phrase_vectors(embedder, verbs, objects)
    own = None
    if texts is not None:
        own = np.asarray(embedder.embed(list(texts)), dtype=np.float64)
        own /= np.maximum(np.linalg.norm(own, axis=1, keepdims=True), 1e-12)
        own = own.astype(np.float32)
    dtype = _row_dtype(model, dimension)
    started = time.monotonic()
    reader, writer = admin_connection(url), admin_connection(url)
    try:
        index = HNSW_INDEX.format(dimension=dimension)
        with writer.cursor() as cur:
            cur.execute(f"DROP INDEX IF EXISTS ibex_memory.{index}")
            cur.execute("TRUNCATE ibex_memory.memory_embeddings")
            cur.execute(
                "INSERT INTO ibex_memory.embedding_models (model, dimension) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING",
                (embedder.model, dimension),
            )
        reader.autocommit = False
        ids = reader.cursor(name="memory_ids")
        ids.itersize = CHUNK
        ids.execute(IDS_SQL, (PG_EPOCH_US,))

        def chunks() -> Iterator[bytes]:
            g0 = 1
            while True:
                rows = ids.fetchmany(CHUNK)
                if not rows:
                    return
                n = len(rows)
                out = np.zeros(n, dtype=dtype)
                out["fields"] = 7
                out["org_len"] = out["memory_len"] = out["agent_len"] = 16
                out["memory"] = [bytes(r[0]) for r in rows]
                out["agent"] = [bytes(r[1]) for r in rows]
                out["org"] = [bytes(r[2]) for r in rows]
                out["model_len"] = len(model)
                out["model"] = model
                out["dimension_len"] = 4
                out["dimension"] = dimension
                out["array_len"] = 20 + 8 * dimension
                out["array_header"] = (1, 0, FLOAT4_OID, dimension, 1)
                out["elements"]["len"] = 4
                out["elements"]["value"] = (
                    own[g0 - 1 : g0 - 1 + n]
                    if own is not None
                    else memory_vectors(phrases, np.arange(g0, g0 + n, dtype=np.int64), seed)
                )
                out["created_len"] = 8
                out["created"] = [r[3] for r in rows]
                g0 += n
                yield out.tobytes()

        with writer.cursor() as cur:
            cur.execute("SET session_replication_role = replica")
            cur.copy_expert(
                "COPY ibex_memory.memory_embeddings (org_id, memory_id, agent_id,"
                " model, dimension, embedding, created_at) FROM STDIN WITH (FORMAT binary)",
                _CopyStream(chunks()),
                size=1 << 20,
            )
            cur.execute("RESET session_replication_role")
        reader.rollback()
        copied = time.monotonic()
        with writer.cursor() as cur:
            # One build, with the memory it needs (the graph of 1,000,000 vectors of 256
            # dimensions is about 1.3 GB) and one helper process (the machine has 2 cores).
            cur.execute("SET maintenance_work_mem = '4GB'")
            cur.execute("SET max_parallel_maintenance_workers = 1")
            hnsw = bool(scalar(writer, "SELECT ibex_memory.ensure_vector_index(%s)", (dimension,)))
        indexed = time.monotonic()
        with writer.cursor() as cur:
            cur.execute("VACUUM ANALYZE ibex_memory.memory_embeddings")
        count = scalar(writer, "SELECT count(*) FROM ibex_memory.memory_embeddings")
        memories = scalar(writer, "SELECT count(*) FROM ibex_memory.memories")
    finally:
        reader.close()
        writer.close()
    if count != memories:
        raise BenchError(f"{count} vectors loaded for {memories} memories")
    return {
        "vectors": count,
        "copy_seconds": round(copied - started, 1),
        "hnsw_index": hnsw,
        "index_seconds": round(indexed - copied, 1),
        "vacuum_seconds": round(time.monotonic() - indexed, 1),
    }
