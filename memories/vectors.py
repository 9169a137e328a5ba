"""The vectors of ``ibex_memory.memory_embeddings`` and the model registry
(``ibex_memory.embedding_models``, migrations 000016, 000017 and 000019): the backfill's and
``ibex reembed``'s reads and writes, the registration of a process's configured model, the
HNSW index, and a vector's ``real[]`` text as every write sends it. (The write of a memory
with its vector is ``create_memory``'s, :class:`~memories.store.MemoryStore`; the search
statement reads the vectors in :mod:`memories.search.store`.)"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
import peewee

from core.db import db_errors, tenant, transaction, uuid_column
from core.errors import ConfigError

#: Live memories of the transaction's org lacking a vector of a model, in id order after a
#: given id (keyset pages: a rerun or a resumed run continues where it stopped). The scope
#: filters are optional (NULL: every agent).
MISSING_EMBEDDINGS_SQL = """
SELECT m.id, m.content FROM ibex_memory.memories m
 WHERE m.org_id = %(org_id)s AND m.deleted_at IS NULL
   AND (%(agent_id)s::uuid IS NULL OR m.agent_id = %(agent_id)s::uuid)
   AND m.id > %(after)s::uuid
   AND (%(replace)s OR NOT EXISTS (
        SELECT 1 FROM ibex_memory.memory_embeddings e
         WHERE e.memory_id = m.id AND e.agent_id = m.agent_id AND e.model = %(model)s))
 ORDER BY m.id
 LIMIT %(limit)s
"""

COUNT_MISSING_SQL = """
SELECT count(*) FROM ibex_memory.memories m
 WHERE m.org_id = %(org_id)s AND m.deleted_at IS NULL
   AND (%(agent_id)s::uuid IS NULL OR m.agent_id = %(agent_id)s::uuid)
   AND (%(replace)s OR NOT EXISTS (
        SELECT 1 FROM ibex_memory.memory_embeddings e
         WHERE e.memory_id = m.id AND e.agent_id = m.agent_id AND e.model = %(model)s))
"""

#: The vectors go as real[] literals (migration 000028), as create_memory's does.
PUT_EMBEDDINGS_SQL = (
    "SELECT ibex_memory.put_embeddings(%s::uuid[], %s::text, %s::integer, %s::text[])"
)

#: The dimension a model's vectors were stored with (000016's registry: not tenant data).
MODEL_DIMENSION_SQL = "SELECT dimension FROM ibex_memory.embedding_models WHERE model = %s"
#: Register a model with its dimension (migration 000019: the owner's statement; the tenant
#: role may not write the registry, so no tenant's request decides a model's dimension).
REGISTER_MODEL_SQL = (
    "INSERT INTO ibex_memory.embedding_models (model, dimension) VALUES (%s, %s)"
    " ON CONFLICT DO NOTHING"
)
VECTOR_INDEX_SQL = "SELECT ibex_memory.ensure_vector_index(%s)"
#: Whether pgvector serves the model's dimension (the HNSW index of 000016 exists).
HAS_VECTOR_INDEX_SQL = (
    "SELECT to_regclass('ibex_memory.idx_memory_embeddings_hnsw_' || %s::text) IS NOT NULL"
)
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


#: ``'%.9g,%.9g,...'`` by vector length: nine significant digits give back the same ``real``.
_VECTOR_FORMATS: dict[int, str] = {}


def vector_literal(vector: Sequence[float]) -> str:
    """The text of a ``real[]`` holding ``vector`` (``{0.062345237,...}``), as the write
    sends it: each component rounded to a ``real`` here (as the column stores it) and written
    in the fewest digits that Postgres reads back as that same ``real``.

    A Python list would be sent as ``ARRAY[0.062345236539840698, ...]``: psycopg2 quotes each
    float on its own (about 0.4 ms of the web process's CPU for 256 dimensions), and Postgres
    parses each one as a ``numeric`` constant and casts it to ``real`` (a fifth of the
    write's CPU in Postgres). The string is built in a fraction of the time and read by
    ``real[]``'s own input function; the stored values are the same."""
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):
        reals = np.array(vector, dtype=np.float64).astype(np.float32)
    return _reals_literal(reals)


def _reals_literal(reals: Any) -> str:
    """The ``real[]`` text of a float32 array, in orjson's shortest round-trip form of each
    ``real`` (256 components: 5 us against 35 for ``'%.9g'`` in a tight loop; called once among
    other work both cost far more, docs/benchmarks.md). An array with a
    component that is not finite (NaN, an infinity, or past a real's range before the cast)
    is written with ``'%.9g'`` (``nan``, ``inf``, which Postgres reads as such): orjson would
    write ``null``, which ``real[]`` reads as NULL."""
    import numpy as np

    if not np.isfinite(reals).all():
        return _literal(reals.tolist())
    text = orjson.dumps(reals, option=orjson.OPT_SERIALIZE_NUMPY)
    return "{" + text[1:-1].decode() + "}"


def _literal(reals: Sequence[float]) -> str:
    """The ``real[]`` text of components that are already ``real`` values."""
    size = len(reals)
    template = _VECTOR_FORMATS.get(size)
    if template is None:
        template = _VECTOR_FORMATS[size] = ",".join(("%.9g",) * size)
    return "{" + template % tuple(reals) + "}"


#: Components below this (after scaling to length 1) are stored as 0: a ``real`` (float32)
#: cannot hold them, and they weigh nothing in a cosine.
TINY_COMPONENT = 1e-30


def unit_vector(vector: Sequence[float]) -> tuple[float, ...] | None:
    """``vector`` scaled to length 1 (scaled by its largest component first, so huge
    components do not overflow); None for an all-zero or non-finite vector (nothing to
    compare). In array operations (about 19 us for a list of 256, against 37 in a Python
    loop; it runs on every write with a vector): the norm's sum is numpy's, which may differ
    from a left-to-right sum in the last bit of a double, below what the stored ``real``
    keeps."""
    unit = _unit_array(vector)
    if unit is None:
        return None
    result: tuple[float, ...] = tuple(unit.tolist())
    return result


def unit_array_literal(unit: Any) -> str | None:
    """The ``real[]`` text of an embedder's float32 array already scaled to length 1 (the
    local model's ``embed_array``), written as it is: the values ``embed`` gives and a
    client would send. None for an all-zero array (no direction), as :func:`unit_vector`."""
    if not unit.any():
        return None
    return _reals_literal(unit)


def unit_literal(vector: Any) -> str | None:
    """``vector_literal(unit_vector(vector))`` in one pass, for a write's vector (a list of
    floats, or an embedder's array): the same text, without the tuple of Python floats and
    their second trip into an array. None as :func:`unit_vector`."""
    import numpy as np

    unit = _unit_array(vector)
    if unit is None:
        return None
    return _reals_literal(unit.astype(np.float32))


def _unit_array(vector: Any) -> Any:
    """:func:`unit_vector`'s arithmetic on a float64 array (None: no direction)."""
    # numpy comes with wordllama (a dependency); imported here, not by importing this module.
    import numpy as np

    values = np.array(vector, dtype=np.float64)
    if values.size == 0:
        return None
    magnitudes = np.abs(values)
    largest = float(magnitudes.max())  # nan when any component is
    if largest == 0.0 or not math.isfinite(largest):
        return None
    scaled = values / largest
    unit = scaled / math.sqrt(float(np.dot(scaled, scaled)))
    tiny = np.abs(unit) < TINY_COMPONENT
    if tiny.any():
        unit[tiny] = 0.0
    return unit


def unit_pairs(
    rows: Iterable[tuple[uuid.UUID, Sequence[float]]],
) -> list[tuple[uuid.UUID, tuple[float, ...]]]:
    """The (memory id, unit vector) pairs to store for an embedder's answer: each vector
    scaled by :func:`unit_vector`, and a memory whose vector has no direction left out."""
    pairs = []
    for memory_id, vector in rows:
        unit = unit_vector(vector)
        if unit is not None:
            pairs.append((memory_id, unit))
    return pairs


class EmbeddingStore:
    """The vectors of ``ibex_memory.memory_embeddings`` (migration 000016): the backfill and
    ``ibex reembed`` reads and writes, and the model registry. (The write of a memory with its
    vector is ``create_memory``'s, :class:`MemoryStore`.)"""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def missing(
        self,
        org_id: uuid.UUID,
        model: str,
        *,
        agent_id: uuid.UUID | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
        replace: bool = False,
    ) -> list[tuple[uuid.UUID, str]]:
        """Live memories (id, content) lacking a vector of ``model`` (every one with
        ``replace``), in id order after ``after``."""
        params = {
            "org_id": str(org_id),
            "agent_id": str(agent_id) if agent_id else None,
            "after": str(after) if after else ZERO_UUID,
            "model": model,
            "limit": limit,
            "replace": replace,
        }
        with tenant(self.db, org_id):
            rows = self.db.execute_sql(MISSING_EMBEDDINGS_SQL, params).fetchall()
        return [(uuid_column(r[0]), r[1]) for r in rows]

    def count_missing(
        self,
        org_id: uuid.UUID,
        model: str,
        *,
        agent_id: uuid.UUID | None = None,
        replace: bool = False,
    ) -> int:
        params = {
            "org_id": str(org_id),
            "agent_id": str(agent_id) if agent_id else None,
            "model": model,
            "replace": replace,
        }
        with tenant(self.db, org_id):
            row = self.db.execute_sql(COUNT_MISSING_SQL, params).fetchone()
        return int(row[0])

    def put(
        self,
        org_id: uuid.UUID,
        model: str,
        dimension: int,
        vectors: Sequence[tuple[uuid.UUID, Sequence[float]]],
    ) -> int:
        """Store (replace) the vectors of existing memories; returns how many were stored
        (a memory deleted meanwhile is skipped). A model registered with another dimension
        stores nothing and raises :class:`EmbeddingDimensionError`."""
        if not vectors:
            return 0
        ids = [str(memory_id) for memory_id, _ in vectors]
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                PUT_EMBEDDINGS_SQL,
                (ids, model, dimension, [vector_literal(vector) for _, vector in vectors]),
            ).fetchone()
        stored = int(row[0])
        if stored < 0:
            raise EmbeddingDimensionError(model, dimension, self.model_dimension(model))
        return stored

    def release(self) -> None:
        """Hand this thread's connection back (to the pool, for the web's): a thread of
        its own (:class:`~memories.pending_vectors.PendingVectors`) holds none between
        batches."""
        if not self.db.is_closed():
            self.db.close()

    def model_dimension(self, model: str) -> int | None:
        """The dimension ``model``'s vectors were stored with; None: none stored yet."""
        try:
            with db_errors():
                row = self.db.execute_sql(MODEL_DIMENSION_SQL, (model,)).fetchone()
        except peewee.ProgrammingError:
            return None  # not migrated yet: /readyz and the schema gate say so
        return int(row[0]) if row else None

    def register(self, model: str, dimension: int) -> bool:
        """Register the model a process is configured with (as the owner, outside any
        tenant): vectors of a model are stored only once it is registered with their
        dimension. False when the schema is not migrated yet (the schema gate says so).
        Raises :class:`EmbeddingDimensionError` when the model is registered with another
        dimension (a misconfigured ``EMBEDDINGS_DIMENSION``)."""
        try:
            with db_errors(), transaction(self.db):
                self.db.execute_sql(REGISTER_MODEL_SQL, (model, dimension))
        except peewee.ProgrammingError:
            return False
        self.check_dimension(model, dimension)
        return True

    def check_dimension(self, model: str, dimension: int) -> None:
        """Raise :class:`EmbeddingDimensionError` when ``model`` has vectors of another
        dimension stored (a misconfigured ``EMBEDDINGS_DIMENSION``)."""
        stored = self.model_dimension(model)
        if stored is not None and stored != dimension:
            raise EmbeddingDimensionError(model, dimension, stored)

    def ensure_index(self, dimension: int) -> bool:
        """Create the HNSW index of ``dimension`` where pgvector is installed (as the table's
        owner); True when the index exists."""
        with db_errors(), self.db.atomic():
            row = self.db.execute_sql(VECTOR_INDEX_SQL, (dimension,)).fetchone()
        return bool(row[0])

    def has_index(self, dimension: int) -> bool:
        with db_errors():
            row = self.db.execute_sql(HAS_VECTOR_INDEX_SQL, (dimension,)).fetchone()
        return bool(row[0])


class EmbeddingDimensionError(ConfigError):
    """The configured embedder's dimension is not the one its model's vectors were stored
    with: a start-up error (web, worker) and not ready in ``/readyz``."""

    def __init__(self, model: str, configured: int, stored: int | None) -> None:
        super().__init__(
            f"EMBEDDINGS_DIMENSION: model {model!r} is configured with {configured} dimensions"
            f" but its stored vectors have {stored}; fix the setting, or use another model and"
            " run `ibex reembed`",
            variable="EMBEDDINGS_DIMENSION",
        )
        self.model = model
        self.configured = configured
        self.stored = stored
