"""The SQL of search: one agent's memories ranked in Postgres, under row-level security.

A query runs in one tenant transaction (:func:`core.db.tenant`) and one statement:

1. **Candidates**, ids only, from ``ibex_memory.search_candidates`` (migration 000006, which
   says why it is a function; 000009 adds what follows on speed): one capped branch per
   significant word of the query, the newest :data:`WORD_CANDIDATES` memories whose
   ``content_tsv`` matches the word (GIN on the generated tsvector, or the agent index in
   recency order for a word most memories contain); for two words or more, the newest
   :data:`WORD_CANDIDATES` that contain all of them, however old; and, where ``pg_trgm`` is
   installed, for a word whose full-text branch found nothing (a typo), the
   :data:`TRIGRAM_CANDIDATES` most similar to it (``content %> word``, GIN trigram index).
   Where ``btree_gin`` is installed both GIN indexes hold the agent as a key, so they return
   the agent's rows only. So the work is bounded however common a word is or however large
   the org, and a rare word is never crowded out by a common one. The rows themselves are then
   read under row-level security.
2. **Signals**, all in ``[0, 1]`` and higher-is-better:

   - ``text``: full-text rank. ``0.8 * coverage + 0.2 * r / (r + 1)``, where ``r`` is
     ``ts_rank_cd`` divided by the memory's length in words (a short memory that matches is
     more about the query than a long one), and coverage is the share of the query's distinct
     stemmed words that the memory contains, each weighted by its inverse document frequency
     among the candidates (a word every candidate has says little; a name only two memories
     mention says a lot).
   - ``trigram``: the mean, over the query's significant words, of ``word_similarity(word,
     content)``: how well each word is matched by some part of the memory, so ``Dhana`` still
     finds ``Dana``. 0 when ``pg_trgm`` is not installed. ``word_similarity`` takes the
     trigrams of the whole memory at every call, so it is the costliest signal: a word the
     memory holds as such counts 1 without it (what it would return), and the signal is
     computed only for the candidates that can still be among the first ``limit`` hits
     (their score with a signal of 1 reaches the score with their floor of ``limit`` hits
     admitted whatever the signal); the others cannot rank there, so nothing changes.
   - ``recency``: ``1 / (1 + age_in_days / 30)``: 1 for a memory written now, 0.5 at 30 days.

   - ``semantic`` (migration 000016, when the search has a query vector): the cosine
     similarity of the memory's vector of the query's model to the query's, clipped to
     ``[0, 1]``; None for a memory without such a vector, and for every hit of a search
     without a query vector (no embedder, or it failed).

3. **Score**: ``lexical = 0.75 * text + 0.25 * trigram`` with trigram, ``text`` alone without;
   then ``score = lexical + weight * bonus * (1 - lexical)`` where ``bonus = max(0, (semantic
   - floor) / (1 - floor))``, ``weight`` and ``floor`` from the query model's
   :class:`Calibration`. Not reciprocal-rank fusion: on conversation data RRF ranked worse
   than the words alone. This fusion keeps the lexical score as the base: a memory that
   matches the words well gains little (the room left above its score shrinks), and an order
   decided by the words changes only where the meaning clearly disagrees.
4. **Admission**: a memory is a hit when it shares a word with the query (or, for a word no
   memory has, a trigram-similar one), or when it comes from the semantic branch ranked among
   the scope's ``rank`` nearest, with a similarity of at least ``relative`` x the nearest
   one's and at least ``entry``: relative to the reader's scope, not an absolute cosine, which
   for a static model says little (its answers' cosines lie among the unrelated memories').
   Then ``score >= min_score``. Without a query vector the score is exactly the lexical one.
   Ties are broken by recency (newer first), then by id, so the order is total and
   deterministic. Memories ``pinned`` by the caller (a context's standing facts) are ranked in
   the same statement and returned with their signals whether they are hits or not.

A highlighted snippet (``ts_headline``, matches between :data:`HIGHLIGHT_START` and
:data:`HIGHLIGHT_STOP`) is made for the returned rows only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee

from core.db import db_errors, is_prepared, mark_prepared, tenant, uuid_column
from embeddings import LOCAL_MODEL
from memories.scope import AGENT_WIDE, ReadScope
from memories.store import COLUMNS, MemoryRow
from memories.vectors import vector_literal

#: Rows taken from each index before ranking; bounds the work of a search. The branch of all
#: the query's words finds a memory with every word beyond the per-word cap.
WORD_CANDIDATES = 50
TRIGRAM_CANDIDATES = 50
#: Words of the query used at most (a pasted page must not become a 1,000-branch query).
MAX_QUERY_WORDS = 32
MAX_BRANCH_WORDS = 10
MAX_TRIGRAM_WORDS = 6
#: ``content %> word`` holds when word_similarity(word, content) >= this.
TRIGRAM_THRESHOLD = 0.6
RECHECK_SECONDS = 60.0
TEXT_WEIGHT = 0.75
TRIGRAM_WEIGHT = 0.25
#: Semantic search (000016): the nearest vectors of the scope taken as candidates; the
#: fallback without pgvector compares the query with the scope's newest SEMANTIC_WINDOW.
SEMANTIC_CANDIDATES = 50
SEMANTIC_WINDOW = 500


@dataclass(frozen=True)
class Calibration:
    """How one embedding model's similarities enter the fusion (module docstring). Cosines
    are the model's own scale, so these belong with the model: :data:`CALIBRATIONS` per
    model name, :data:`DEFAULT_CALIBRATION` for any other (an OpenAI-compatible endpoint)."""

    #: The weight of the semantic bonus: ``score = lexical + weight * bonus * (1 - lexical)``.
    weight: float
    #: The similarity at which the bonus starts: ``bonus = max(0, (s - floor) / (1 - floor))``.
    floor: float
    #: A memory that shares no word with the query is a hit when it is among the scope's
    #: ``rank`` nearest by meaning ...
    rank: int
    #: ... and its similarity is at least ``relative`` x that of the scope's nearest ...
    relative: float
    #: ... and at least ``entry`` (an absolute floor: a similarity the model gives unrelated
    #: texts).
    entry: float
    #: The score below which a hit is not put into a context block (the person's standing
    #: facts aside): the relevance measured to be worth a prompt's tokens.
    relevance: float


#: The packaged static model (``EMBEDDINGS_PROVIDER=local``), measured by
#: ``bench/search_quality.py`` and on LoCoMo (docs/search.md, "The fusion", has the figures):
#: its cosines are small (an answer that shares no word with its question: median 0.09), so
#: no absolute floor and admission by rank (the scope's 5 nearest, each at least a fifth of
#: the nearest one's similarity); a half-weight bonus from 0, since a full one reorders the
#: word matches of questions that name people and things (LoCoMo: below the words alone).
LOCAL_CALIBRATION = Calibration(
    weight=0.5, floor=0.0, rank=5, relative=0.2, entry=0.0, relevance=0.35
)
#: Any other model, e.g. an OpenAI-compatible endpoint's: not measured here (no endpoint);
#: set from the similarity ranges such models publish (unrelated texts about 0.1-0.2), and
#: to be measured with the same benchmark (``--embeddings openai``).
DEFAULT_CALIBRATION = Calibration(
    weight=1.0, floor=0.2, rank=5, relative=0.5, entry=0.25, relevance=0.35
)
#: Calibrations by model name (the embedder's ``model``). A dict, so the quality bench can
#: try others between runs.
CALIBRATIONS: dict[str, Calibration] = {LOCAL_MODEL: LOCAL_CALIBRATION}
#: The relevance bar of a search without a query vector (the words alone).
LEXICAL_RELEVANCE = 0.35


def calibration(model: str | None) -> Calibration:
    """The calibration of ``model`` (None: no semantic signal, the default's fields unused
    but ``relevance``, which is then :data:`LEXICAL_RELEVANCE`)."""
    if model is None:
        return dataclasses.replace(DEFAULT_CALIBRATION, relevance=LEXICAL_RELEVANCE)
    return CALIBRATIONS.get(model, DEFAULT_CALIBRATION)


#: Characters that separate words (for pg_trgm as for the query's words), made spaces in a
#: memory's content to find the query's words in it as such.
SEPARATORS = "\t\n\r:;,.!?\"'()[]{}<>/\\|-_+=*&^%$#@~`"
#: The same characters as a bracket expression of Postgres's regular expressions (those
#: with a meaning there escaped): ``regexp_replace`` with it makes them spaces in about a
#: fifth of ``translate``'s time (which looks each character up in the list, 45 us for a
#: memory of 180 characters against 10).
SEPARATOR_CLASS = "[" + "".join("\\" + c if c in "\\[]^-" else c for c in SEPARATORS) + "]"

HIGHLIGHT_START = "<mark>"
HIGHLIGHT_STOP = "</mark>"
HEADLINE_OPTIONS = (
    f"StartSel={HIGHLIGHT_START}, StopSel={HIGHLIGHT_STOP}, MaxWords=30, MinWords=12,"
    ' MaxFragments=2, FragmentDelimiter=" … "'
)

_WORD = re.compile(r"[^\W_]+")
#: The rows a plan node returned, from its ``EXPLAIN ANALYZE`` line.
_ACTUAL_ROWS = re.compile(r"actual time=\S+ rows=(\d+)")
#: Words that carry no meaning on their own; kept out of the trigram side (the full-text side
#: has Postgres's own english stop words).
_STOP_WORDS = """
a about above after again all am an and any are as at be been before being below between
both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me
more most my myself no nor not now of off on once only or other our ours ourselves out over
own same she should so some such than that the their theirs them themselves then there these
they this those through to too under until up very was we were what when where which while
who whom why will with would you your yours yourself yourselves tell know remember user
"""
STOP_WORDS = frozenset(_STOP_WORDS.split())

#: Whether the semantic fallback's dot products run in C (000033: contrib's cube installed).
DOT_CUBES_AVAILABLE_SQL = "SELECT to_regproc('ibex_memory.dot_cubes') IS NOT NULL"

#: The trigram index: per agent where btree_gin is installed (migration 000009), else org-wide.
TRIGRAM_AVAILABLE_SQL = """
SELECT to_regprocedure('word_similarity(text,text)') IS NOT NULL
   AND (to_regclass('ibex_memory.idx_memories_trgm_agent') IS NOT NULL
        OR to_regclass('ibex_memory.idx_memories_trgm') IS NOT NULL)
"""


#: The HNSW index of a dimension (000016's ensure_vector_index names it so).
VECTOR_INDEX_SQL = (
    "SELECT to_regtype('vector') IS NOT NULL"
    " AND to_regclass('ibex_memory.idx_memory_embeddings_hnsw_' || %s::text) IS NOT NULL"
)


def query_words(query: str) -> list[str]:
    """The query's words (letters and digits), lower-cased, in order, without repeats."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.casefold()):
        seen.setdefault(word, None)
        if len(seen) >= MAX_QUERY_WORDS:
            break
    return list(seen)


def trigram_words(words: Sequence[str]) -> list[str]:
    """The significant words for trigram matching: not stop words, at least 3 characters."""
    return [w for w in words if len(w) >= 3 and w not in STOP_WORDS][:MAX_TRIGRAM_WORDS]


def _search_sql(
    *, trigram: bool, semantic: bool, vector_dimension: int | None = None, cubes: bool = False
) -> str:
    """The ranking statement; the trigram signal only where pg_trgm is installed, the
    semantic one only with a query vector (computed with pgvector's operator where the
    server has it and the query's dimension has its index, else with
    ``ibex_memory.dot_cubes`` where contrib's cube is installed (``cubes``, migration 000033:
    the query's chunks made once, in ``q``), else with ``ibex_memory.dot``)."""
    # Ids from the indexes (migration 000006 says why a function), rows read under RLS.
    # Whose memories: the user scope (migration 000013) narrows every branch, so the capped
    # branches hold the reader's memories only. (Not filtered again on the rows: a condition
    # there makes the planner scan the table instead of reading the candidates by id.)
    # Pinned ids (a context's standing facts, read in the reader's scope by profile()) are
    # ranked with the others so their signals are known, and returned whether they match
    # or not; they count for neither the words' IDF nor the semantic ranks.
    lexical = (
        "SELECT DISTINCT id, true AS lexical, NULL::integer AS sem_rank, false AS pinned,"
        " NULL::float8 AS similarity"
        " FROM ibex_memory.search_candidates(%(agent_id)s::uuid,"
        " %(words)s::text[], %(tri_words)s::text[], %(session_id)s::uuid, %(kinds)s::text[],"
        f" {WORD_CANDIDATES}, {TRIGRAM_CANDIDATES},"
        " %(all_users)s, %(user_id)s::uuid, %(include_shared)s) AS id"
        # The reader's user scope again on the pinned ids, as user_scope_condition (000013)
        # makes it: the caller read them in that scope, and an id outside it is dropped.
        " UNION ALL SELECT p.id, false, NULL, true, NULL"
        " FROM unnest(%(pinned)s::uuid[]) AS p(id)"
        " JOIN ibex_memory.memories pm ON pm.id = p.id AND pm.agent_id = %(agent_id)s::uuid"
        " AND pm.deleted_at IS NULL AND (%(all_users)s"
        " OR (%(user_id)s::uuid IS NOT NULL AND pm.user_id = %(user_id)s::uuid)"
        " OR (pm.user_id IS NULL AND (%(user_id)s::uuid IS NULL OR %(include_shared)s)))"
    )
    candidates = (
        f"SELECT id, bool_or(lexical) AS lexical, min(sem_rank) AS sem_rank,"
        f" bool_or(pinned) AS pinned, max(similarity) AS similarity FROM ({lexical}) u"
        " GROUP BY id"
    )
    semantic_signal = "NULL::float8"
    # The cubes only without pgvector's index: the query's chunks are made once, in q.
    with_cubes = semantic and cubes and vector_dimension is None
    if semantic:
        # The scope's nearest vectors of the query's model join the lexical candidates, each
        # with its rank among them (1: the nearest); the similarity is then computed exactly
        # for every candidate with such a vector.
        candidates = (
            f"SELECT id, bool_or(lexical) AS lexical, min(sem_rank) AS sem_rank,"
            f" bool_or(pinned) AS pinned, max(similarity) AS similarity FROM ({lexical}"
            " UNION ALL SELECT c.id, false,"
            " (row_number() OVER (ORDER BY c.similarity DESC, c.id))::integer, false,"
            " c.similarity"
            " FROM ibex_memory.semantic_candidates(%(agent_id)s::uuid,"
            " %(model)s, %(vector)s::real[], %(semantic_limit)s, %(semantic_window)s,"
            " %(session_id)s::uuid, %(kinds)s::text[], %(include_superseded)s,"
            " %(all_users)s, %(user_id)s::uuid, %(include_shared)s) AS c) u GROUP BY id"
        )
        if vector_dimension is not None:
            dim = int(vector_dimension)
            cosine = f"1 - (e.embedding::vector({dim}) <=> %(vector)s::real[]::vector({dim}))"
        elif with_cubes:
            # semantic_candidates scores its window with the same expression (000033).
            cosine = "ibex_memory.dot_cubes(e.embedding, q.qcubes, q.qnorm)"
        else:
            cosine = "ibex_memory.dot(e.embedding, %(vector)s::real[])"
        # A semantic candidate's similarity is the one its branch computed, with the same
        # expression on the same vectors: the others are computed here.
        semantic_signal = (
            # (GREATEST and LEAST skip a NULL: the CASE keeps it NULL.)
            "COALESCE(CASE WHEN ids.similarity IS NOT NULL"
            " THEN GREATEST(0, LEAST(1, ids.similarity)) END,"
            f" (SELECT GREATEST(0, LEAST(1, {cosine}))"
            " FROM ibex_memory.memory_embeddings e"
            " WHERE e.memory_id = m.id AND e.model = %(model)s"
            # The agent names the partition (000017): one probe, not one per partition.
            " AND e.agent_id = %(agent_id)s::uuid"
            " AND e.dimension = cardinality(%(vector)s::real[])))::float8"
        )
    trigram_signal = "0::float8"
    if trigram:
        trigram_signal = (
            # A word the memory holds as such (between separators) is similar to it by
            # exactly 1, what word_similarity would compute at many times the cost.
            "COALESCE((SELECT avg(CASE WHEN strpos(b.spaced, ' ' || w || ' ') > 0 THEN 1::real"
            " ELSE word_similarity(w, b.content) END)"
            " FROM unnest(%(tri_words)s::text[]) w), 0)::float8"
        )
    text_weight, trigram_weight = (TEXT_WEIGHT, TRIGRAM_WEIGHT) if trigram else (1.0, 0.0)
    # The trigram signal's floor: the share of the query's words the memory holds as such
    # (each similar by 1; the others by at least 0).
    trigram_low = (
        "COALESCE((SELECT count(*) FILTER (WHERE strpos(s.spaced, ' ' || w || ' ') > 0)::float8"
        " / NULLIF(count(*), 0) FROM unnest(%(tri_words)s::text[]) w), 0)"
        if trigram
        else "0"
    )
    # The trigram signal (word_similarity per query word, the costliest signal by far) only
    # for the candidates that can still be among the first `limit` hits: the score grows with
    # the lexical score, so a candidate whose score with a trigram signal of 1 stays below the
    # score with a signal of 0 of `limit` sure hits cannot rank before them. The margin keeps
    # a candidate a rounding error away. Pinned candidates are always ranked in full.
    pruned = f"""
cut AS (
    SELECT GREATEST(%(min_score)s::float8, COALESCE((
        SELECT x.low FROM (
            SELECT (b.lexical_low + %(semantic_weight)s::float8 * b.bonus
                    * (1 - b.lexical_low))::float8 AS low
              FROM bounded b WHERE b.sure) x
         WHERE x.low >= %(min_score)s::float8
         ORDER BY x.low DESC OFFSET GREATEST(%(limit)s - 1, 0) LIMIT 1), 0)) - 1e-9 AS bar
),
kept AS MATERIALIZED (
    SELECT b.*, ({trigram_signal}) AS trigram
      FROM bounded b, cut
     WHERE b.pinned
        OR (b.lexical_high + %(semantic_weight)s::float8 * b.bonus
            * (1 - b.lexical_high))::float8 >= cut.bar
),"""
    if not trigram:
        pruned = f"kept AS (SELECT b.*, {trigram_signal} AS trigram FROM bounded b),"
    columns = ", ".join(f"s.{c.strip()}" for c in COLUMNS.split(","))
    query_cubes = ""
    if with_cubes:
        query_cubes = (
            ",\n           ibex_memory.dot_query_cubes(%(vector)s::real[]) AS qcubes,"
            "\n           ibex_memory.dot_query_norm(%(vector)s::real[]) AS qnorm"
        )
    return f"""
WITH q AS (
    SELECT to_tsquery('english', %(tsquery)s) AS tsq,
           tsvector_to_array(to_tsvector('english', %(text)s)) AS lexemes{query_cubes}
),
ids AS MATERIALIZED ({candidates}),
cand AS (
    SELECT m.*, ids.lexical, ids.sem_rank, ids.pinned,
           ({semantic_signal}) AS semantic,
           ts_rank_cd(m.content_tsv, q.tsq, 2) AS rank_cd,
           -- The content lower-cased, its usual separators made spaces, between spaces: a
           -- query word found in it between spaces is a word of the memory as such.
           ' ' || regexp_replace(lower(m.content), %(separator_class)s, ' ', 'g') || ' '
           AS spaced,
           ARRAY(SELECT l FROM unnest(tsvector_to_array(m.content_tsv)) l
                  WHERE l = ANY(q.lexemes)) AS hits
      -- Each candidate read by its primary key (LIMIT 1: one probe per id whatever the
      -- statistics say; a hash join read every memory of the org to find a few hundred).
      FROM ids CROSS JOIN LATERAL (
               SELECT r.* FROM ibex_memory.memories r WHERE r.id = ids.id LIMIT 1) m, q
     -- Supersession (000014): current memories unless include_superseded. The candidates
     -- are taken before this filter, so superseded rows may use up some of a word's cap.
     WHERE %(include_superseded)s OR m.superseded_by IS NULL
),
df AS (
    SELECT l AS lexeme, count(c.id) AS n
      FROM q, unnest(q.lexemes) l LEFT JOIN cand c ON c.lexical AND l = ANY(c.hits)
     GROUP BY l
),
idf AS (
    SELECT lexeme, ln(1 + ((SELECT count(*) FROM cand WHERE lexical) + 1)::float8 / (n + 0.5))
           AS w
      FROM df
),
scored AS (
    SELECT c.*,
           CASE WHEN (SELECT sum(w) FROM idf) > 0
                THEN 0.8 * COALESCE((SELECT sum(w) FROM idf WHERE lexeme = ANY(c.hits)), 0)
                         / (SELECT sum(w) FROM idf)
                     + 0.2 * c.rank_cd / (c.rank_cd + 1)
                ELSE 0 END AS text_score,
           1 / (1 + extract(epoch FROM now() - c.created_at) / 86400.0 / 30) AS recency,
           -- The similarity of the scope's nearest memory: what a memory entering on
           -- meaning alone is measured against.
           max(c.semantic) FILTER (WHERE c.sem_rank IS NOT NULL) OVER () AS nearest
      FROM cand c
),
bounded AS (
    SELECT s.*,
           GREATEST(0, (COALESCE(s.semantic, 0) - %(semantic_floor)s::float8)
                       / (1 - %(semantic_floor)s::float8))::float8 AS bonus,
           -- Admitted whatever its trigram signal: it shares a word with the query, or it is
           -- among the scope's nearest by meaning, close to the nearest one, above the floor.
           COALESCE(s.text_score > 0
                    OR (s.sem_rank <= %(semantic_rank)s
                        AND s.semantic >= %(semantic_entry)s::float8
                        AND s.semantic > 0
                        AND s.semantic >= %(semantic_relative)s::float8 * s.nearest),
                    false) AS sure,
           -- The lexical score's bounds before the trigram signal is known (it is in [0, 1]).
           ({text_weight} * s.text_score + {trigram_weight} * {trigram_low})::float8
           AS lexical_low,
           ({text_weight} * s.text_score + {trigram_weight})::float8 AS lexical_high
      FROM scored s
),
{pruned}
fused AS (
    SELECT s.*, ({text_weight} * s.text_score + {trigram_weight} * s.trigram)::float8
           AS lexical_score,
           -- A hit: admitted as above, or a trigram-similar word is all it shares.
           s.sure OR (s.lexical AND s.trigram > 0) AS admitted
      FROM kept s
),
ranked AS (
    SELECT s.*, (s.lexical_score
                 + %(semantic_weight)s::float8 * s.bonus * (1 - s.lexical_score))::float8
                AS score
      FROM fused s
     WHERE s.admitted OR s.pinned
),
positioned AS (
    SELECT s.*, s.admitted AND s.score >= %(min_score)s::float8 AS hit,
           row_number() OVER (ORDER BY s.admitted AND s.score >= %(min_score)s::float8 DESC,
                                       s.score DESC, s.created_at DESC, s.id) AS position
      FROM ranked s
)
SELECT {columns},
       s.text_score::float8, s.trigram::float8, s.recency::float8, s.semantic::float8,
       s.score, ts_headline('english', s.content, q.tsq, %(headline)s) AS snippet,
       s.hit AND s.position <= %(limit)s AS hit, s.pinned, s.sem_rank
  FROM positioned s, q
 WHERE (s.hit AND s.position <= %(limit)s) OR s.pinned
 ORDER BY s.position
"""


@functools.lru_cache(maxsize=32)
def _statement(
    trigram: bool, semantic: bool, vector_dimension: int | None, cubes: bool = False
) -> str:
    """The forms of the statement, each built once."""
    return _search_sql(
        trigram=trigram, semantic=semantic, vector_dimension=vector_dimension, cubes=cubes
    )


#: Each prepared form's ``EXECUTE``, by name (which connections hold which form:
#: :func:`core.db.is_prepared`).
_EXECUTE: dict[str, str] = {}
PARAMETER_TYPES_SQL = "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = %s"


@functools.lru_cache(maxsize=32)
def _prepared_form(sql: str) -> tuple[str, str, tuple[str, ...]]:
    """A form of the statement as a prepared statement of the connection: its name, its
    ``PREPARE`` (each named parameter a ``$n``, its type inferred from where the statement
    uses it) and the parameters' names in ``$n`` order. The server then parses and analyses
    the long statement once per connection and form, not at every search (about 1.5 ms of a
    10 ms search at 1,000,000 memories); the plan stays PostgreSQL's choice for the values
    of each call, so the rows are the statement's."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    body = re.sub(r"%\((\w+)\)s", number, sql).replace("%%", "%")
    name = "ibex_search_" + hashlib.sha256(sql.encode()).hexdigest()[:16]
    return name, f"PREPARE {name} AS {body}", tuple(names)


def _execute_sql(names: Sequence[str], types: Sequence[str], name: str) -> str:
    """The ``EXECUTE`` of a prepared form, each value cast to its parameter's type: a list
    arrives as ``ARRAY[...]`` of text or numbers, which the cast makes ``uuid[]`` or
    ``real[]`` as the statement's own casts did."""
    values = ", ".join(f"%({n})s::{t}" for n, t in zip(names, types, strict=True))
    return f"EXECUTE {name} ({values})"


@dataclass(frozen=True)
class SemanticQuery:
    """The query's vector and the model that made it: only vectors of that model compete."""

    model: str
    vector: Sequence[float]


def _prepare(
    agent_id: uuid.UUID,
    query: str,
    *,
    trigram: bool,
    limit: int,
    session_id: uuid.UUID | None = None,
    kinds: Sequence[str] | None = None,
    include_superseded: bool = False,
    scope: ReadScope = AGENT_WIDE,
    semantic: SemanticQuery | None = None,
    vector_index: bool = False,
    cubes: bool = False,
    min_score: float = 0.0,
    pinned: Sequence[uuid.UUID] = (),
) -> tuple[str, dict[str, Any]] | None:
    """The statement and its parameters; None when the query has no word worth looking up
    and nothing is pinned. ``vector_index``: pgvector serves the query's dimension (its
    operator computes the signal); else ``cubes``: ``ibex_memory.dot_cubes`` exists (000033)."""
    words = query_words(query)
    significant = [w for w in words if w not in STOP_WORDS][:MAX_BRANCH_WORDS]
    tri = trigram_words(words) if trigram else []
    if not significant and not tri and not pinned:
        return None
    params: dict[str, Any] = {
        "agent_id": str(agent_id),
        # Only letters and digits reach to_tsquery, so no operator can be injected.
        "tsquery": " | ".join(words),
        "text": " ".join(words),
        "tri_words": tri,
        "headline": HEADLINE_OPTIONS,
        "limit": limit,
        "min_score": float(min_score),
        "pinned": [str(i) for i in pinned],
        "separator_class": SEPARATOR_CLASS,
    }
    params["words"] = significant
    params["session_id"] = str(session_id) if session_id is not None else None
    params["kinds"] = list(kinds) if kinds else None
    params["include_superseded"] = include_superseded
    params.update(scope_params(scope))
    # Read at each call, so a bench may try other calibrations between runs.
    tuned = calibration(semantic.model if semantic is not None else None)
    if semantic is not None:
        params["model"] = semantic.model
        # As text, as a write sends a memory's vector (each component rounded to a real, as
        # the statement's cast rounds it): a list goes as ARRAY[...] of numeric constants,
        # each quoted by the driver, then parsed and cast by Postgres (about 0.5 ms more for
        # 256 dimensions).
        params["vector"] = vector_literal(semantic.vector)
        params["semantic_limit"] = max(SEMANTIC_CANDIDATES, tuned.rank)
        params["semantic_window"] = SEMANTIC_WINDOW
    params["semantic_weight"] = tuned.weight
    params["semantic_floor"] = tuned.floor
    params["semantic_entry"] = tuned.entry
    params["semantic_rank"] = tuned.rank
    params["semantic_relative"] = tuned.relative
    dimension = len(semantic.vector) if semantic is not None and vector_index else None
    with_cubes = semantic is not None and dimension is None and cubes
    return _statement(trigram, semantic is not None, dimension, with_cubes), params


def scope_params(scope: ReadScope) -> dict[str, Any]:
    """The user scope's parameters of the search statement and of search_candidates."""
    return {
        "all_users": scope.all_users,
        "user_id": str(scope.user_id) if scope.user_id is not None else None,
        "include_shared": scope.include_shared,
    }


@dataclass(frozen=True)
class RankedMemory:
    """One ranked memory and why it matched (every signal in ``[0, 1]``, higher is better)."""

    row: MemoryRow
    score: float
    text: float
    trigram: float
    recency: float
    snippet: str
    #: Cosine similarity to the query in [0, 1]; None: not available (no query vector, or
    #: no vector of the query's model for this memory).
    semantic: float | None = None
    #: Its rank among the scope's nearest memories by meaning (1: the nearest); None: not
    #: among them (or no query vector).
    semantic_rank: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            **self.row.as_json(),
            "score": round(self.score, 6),
            "signals": {
                "text": round(self.text, 6),
                "trigram": round(self.trigram, 6),
                "recency": round(self.recency, 6),
                "semantic": None if self.semantic is None else round(self.semantic, 6),
            },
            "snippet": self.snippet,
        }


@dataclass(frozen=True)
class ProfileRow:
    """A memory as the profile read returns it: what choosing and packing standing facts
    needs (the rest of the row comes with its signals, from :meth:`SearchStore.rank`)."""

    id: uuid.UUID
    content: str
    user_id: uuid.UUID | None
    created_at: dt.datetime


@dataclass(frozen=True)
class Ranked:
    """A search's hits, best first, and the pinned memories with their signals (by id),
    whether or not they are hits."""

    hits: list[RankedMemory]
    pinned: dict[uuid.UUID, RankedMemory]


class SearchStore:
    """Ranked reads of ``ibex_memory.memories`` for one org and agent."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        #: What the schema offers (pg_trgm, cube, a dimension's HNSW index), with when asked.
        self._checks: dict[str, tuple[bool, float]] = {}

    def vector_index(self, dimension: int) -> bool:
        """Whether pgvector and the HNSW index of ``dimension`` (migration 000016) exist;
        checked again at most every :data:`RECHECK_SECONDS`."""
        return self._checked(f"vector_index:{dimension}", VECTOR_INDEX_SQL, (dimension,))

    def dot_cubes_available(self) -> bool:
        """Whether ``ibex_memory.dot_cubes`` exists (migration 000033, where the server ships
        contrib's cube); checked again at most every :data:`RECHECK_SECONDS`."""
        return self._checked("dot_cubes", DOT_CUBES_AVAILABLE_SQL)

    def trigram_available(self) -> bool:
        """Whether ``pg_trgm`` and the trigram index are installed. Checked again at most every
        :data:`RECHECK_SECONDS`, so a server that gains the extension (``ibex migrate`` after
        installing it) is noticed without a restart."""
        return self._checked("trigram", TRIGRAM_AVAILABLE_SQL)

    def _checked(self, name: str, sql: str, params: tuple[Any, ...] = ()) -> bool:
        """The answer of ``sql`` (one boolean) about the schema, kept under ``name`` and
        asked again at most every :data:`RECHECK_SECONDS`."""
        now = time.monotonic()
        known = self._checks.get(name)
        if known is None or now - known[1] > RECHECK_SECONDS:
            with db_errors():
                row = self.db.execute_sql(sql, params).fetchone()
            known = self._checks[name] = (bool(row[0]), now)
        return known[0]

    def search_mode(self, semantic: bool = False) -> str:
        """What ``/readyz`` says: ``full-text+trigram``, or ``full-text`` without pg_trgm, and
        ``+semantic`` when an embedder is configured."""
        mode = "full-text+trigram" if self.trigram_available() else "full-text"
        return mode + "+semantic" if semantic else mode

    def search(
        self,
        org_id: uuid.UUID,
        agent_id: uuid.UUID,
        query: str,
        *,
        limit: int,
        session_id: uuid.UUID | None = None,
        kinds: Sequence[str] | None = None,
        include_superseded: bool = False,
        scope: ReadScope = AGENT_WIDE,
        semantic: SemanticQuery | None = None,
        min_score: float = 0.0,
    ) -> list[RankedMemory]:
        """The best ``limit`` memories for ``query`` among the reader's ``scope`` whose score
        is at least ``min_score``, best first; none for a query of no words. With
        ``semantic`` (the query's vector), fused with the semantic signal and branch (module
        docstring)."""
        return self.rank(
            org_id,
            agent_id,
            query,
            limit=limit,
            session_id=session_id,
            kinds=kinds,
            include_superseded=include_superseded,
            scope=scope,
            semantic=semantic,
            min_score=min_score,
        ).hits

    def rank(
        self,
        org_id: uuid.UUID,
        agent_id: uuid.UUID,
        query: str,
        *,
        limit: int,
        session_id: uuid.UUID | None = None,
        kinds: Sequence[str] | None = None,
        include_superseded: bool = False,
        scope: ReadScope = AGENT_WIDE,
        semantic: SemanticQuery | None = None,
        min_score: float = 0.0,
        pinned: Sequence[uuid.UUID] = (),
    ) -> Ranked:
        """:meth:`search`, and the signals of the ``pinned`` memories (ids the caller read in
        the same ``scope``; one not in it, or not current, is left out) in the same
        statement."""
        trigram = self.trigram_available()
        prepared = _prepare(
            agent_id,
            query,
            trigram=trigram,
            limit=limit,
            session_id=session_id,
            kinds=kinds,
            include_superseded=include_superseded,
            scope=scope,
            semantic=semantic,
            vector_index=semantic is not None and self.vector_index(len(semantic.vector)),
            cubes=semantic is not None and self.dot_cubes_available(),
            min_score=min_score,
            pinned=pinned,
        )
        if prepared is None:
            return Ranked([], {})
        sql, params = prepared
        rows = self._run(org_id, trigram, sql, params, prepare=True)
        width = len(COLUMNS.split(","))
        hits: list[RankedMemory] = []
        found: dict[uuid.UUID, RankedMemory] = {}
        for r in rows:
            hit = RankedMemory(
                row=MemoryRow.from_db(r[:width]),
                text=float(r[width]),
                trigram=float(r[width + 1]),
                recency=float(r[width + 2]),
                semantic=float(r[width + 3]) if r[width + 3] is not None else None,
                score=float(r[width + 4]),
                snippet=r[width + 5],
                semantic_rank=int(r[width + 8]) if r[width + 8] is not None else None,
            )
            if r[width + 6]:
                hits.append(hit)
            if r[width + 7]:
                found[hit.row.id] = hit
        return Ranked(hits, found)

    def explain(
        self,
        org_id: uuid.UUID,
        agent_id: uuid.UUID,
        query: str,
        *,
        limit: int = 10,
        scope: ReadScope = AGENT_WIDE,
        semantic: SemanticQuery | None = None,
    ) -> str:
        """``EXPLAIN (ANALYZE, BUFFERS)`` of :meth:`search` as the tenant runs it, followed by
        the plan of each candidate branch as ``search_candidates`` runs it (as the connection's
        own role, which should be the role that migrated: the function's owner)."""
        trigram = self.trigram_available()
        prepared = _prepare(
            agent_id,
            query,
            trigram=trigram,
            limit=limit,
            scope=scope,
            semantic=semantic,
            vector_index=semantic is not None and self.vector_index(len(semantic.vector)),
            cubes=semantic is not None and self.dot_cubes_available(),
        )
        if prepared is None:
            return ""
        sql, params = prepared
        plans = [
            r[0] for r in self._run(org_id, trigram, "EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        ]
        with db_errors(), self.db.atomic():
            self.db.execute_sql(
                "SELECT set_config('ibex.org_id', %s, true),"
                " set_config('pg_trgm.word_similarity_threshold', %s, true)",
                (str(org_id), str(TRIGRAM_THRESHOLD)),
            )
            branches = self.db.execute_sql(
                "SELECT word, kind, statement FROM ibex_memory.search_branches(%(agent_id)s::uuid,"
                " %(words)s::text[], %(tri_words)s::text[], NULL, NULL,"
                f" {WORD_CANDIDATES}, {TRIGRAM_CANDIDATES},"
                " %(all_users)s, %(user_id)s::uuid, %(include_shared)s)",
                params,
            ).fetchall()
            # What search_candidates skips at run time is marked, not run.
            searched: set[str] = set()
            matched: set[str] = set()
            for word, kind, statement in branches:
                if kind == "trigram" and word in matched:
                    plans.append(
                        f"-- candidate branch: {kind} {word!r}: not run (the full-text branch"
                        " found the word as such)"
                    )
                    continue
                if kind == "all" and matched != searched:
                    plans.append(
                        f"-- candidate branch: {kind} {word!r}: not run (a word found nothing)"
                    )
                    continue
                plans.append(f"-- candidate branch: {kind} {word!r}")
                # No parameters, but the driver formats every statement: keep '%' literal.
                explain = "EXPLAIN (ANALYZE, BUFFERS) " + statement.replace("%", "%%")
                rows = [r[0] for r in self.db.execute_sql(explain).fetchall()]
                plans.extend(rows)
                found = _ACTUAL_ROWS.search(rows[0]) if rows else None
                if kind == "fts":
                    searched.add(word)
                    if found and int(found.group(1)) > 0:
                        matched.add(word)
        return "\n".join(plans)

    def _run(
        self,
        org_id: uuid.UUID,
        trigram: bool,
        sql: str,
        params: dict[str, Any],
        *,
        prepare: bool = False,
    ) -> list[Any]:
        """``sql`` in a tenant transaction; with ``prepare``, as the connection's prepared
        statement of that form (:func:`_prepared_form`), prepared at its first use."""
        with tenant(self.db, org_id):
            if prepare:
                name, prepare_sql, names = _prepared_form(sql)
                connection = self.db.connection()
                if not is_prepared(connection, name):
                    # A statement prepared in a transaction that failed afterwards is still
                    # there (PREPARE is not undone by a rollback): taken as it is.
                    row = self.db.execute_sql(PARAMETER_TYPES_SQL, (name,)).fetchone()
                    if row is None:
                        self.db.execute_sql(prepare_sql)
                        row = self.db.execute_sql(PARAMETER_TYPES_SQL, (name,)).fetchone()
                    _EXECUTE[name] = _execute_sql(names, row[0], name)
                    mark_prepared(connection, name)
                sql = _EXECUTE[name]
            if trigram:
                # The threshold for this transaction only, sent with the statement (one round
                # trip); the rows are the last statement's.
                sql = (
                    "SELECT set_config('pg_trgm.word_similarity_threshold', %(threshold)s, true);"
                    + sql
                )
                params = {**params, "threshold": str(TRIGRAM_THRESHOLD)}
            return list(self.db.execute_sql(sql, params).fetchall())

    def profile(
        self,
        org_id: uuid.UUID,
        agent_id: uuid.UUID,
        scope: ReadScope,
        *,
        limit: int,
        session_id: uuid.UUID | None = None,
        kinds: Sequence[str] | None = None,
    ) -> list[ProfileRow]:
        """The newest ``limit`` current memories of the reader's ``scope`` (its user's and the
        agent-wide ones; none for ``all_users``, which is no one person), newest first: what a
        context's standing facts are chosen from. One statement: a branch per user of the
        scope (the user's rows, the agent-wide rows), each read newest first from
        ``idx_memories_agent_user`` and capped, so the work is bounded however many memories
        the agent's other users or the agent-wide scope hold. The scope's own condition is on
        every branch as well."""
        if scope.all_users or scope.empty:
            return []
        condition, scope_values = scope.condition()
        users: list[tuple[str, list[Any]]] = []
        if scope.user_id is not None:
            users.append(("user_id = %s", [str(scope.user_id)]))
        if scope.shared:
            users.append(("user_id IS NULL", []))
        extra = ""
        extra_values: list[Any] = []
        if session_id is not None:
            extra += " AND session_id = %s"
            extra_values.append(str(session_id))
        if kinds:
            extra += " AND kind = ANY(%s::text[])"
            extra_values.append(list(kinds))
        branches = []
        values: list[Any] = []
        for user_condition, user_values in users:
            branches.append(
                "(SELECT id, content, user_id, created_at FROM ibex_memory.memories"
                f" WHERE org_id = %s AND agent_id = %s AND {user_condition} AND {condition}"
                " AND deleted_at IS NULL AND superseded_by IS NULL"
                f"{extra} ORDER BY created_at DESC, id DESC LIMIT %s)"
            )
            values += [str(org_id), str(agent_id), *user_values, *scope_values]
            values += [*extra_values, limit]
        sql = (
            f"SELECT * FROM ({' UNION ALL '.join(branches)}) p"
            " ORDER BY created_at DESC, id DESC LIMIT %s"
        )
        with tenant(self.db, org_id):
            rows = self.db.execute_sql(sql, [*values, limit]).fetchall()
        return [
            ProfileRow(
                uuid_column(r[0]),
                r[1],
                uuid_column(r[2]) if r[2] is not None else None,
                r[3],
            )
            for r in rows
        ]

    def find_agent(self, org_id: uuid.UUID, slug: str) -> uuid.UUID | None:
        """The agent of the org with this slug, or None (never created here)."""
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT id FROM ibex_core.agents WHERE org_id = %s AND slug = %s",
                (str(org_id), slug),
            ).fetchone()
        return uuid.UUID(str(row[0])) if row else None

    def agent_exists(self, org_id: uuid.UUID, agent_id: uuid.UUID) -> uuid.UUID | None:
        """``agent_id`` if it is an agent of the org, else None."""
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT id FROM ibex_core.agents WHERE org_id = %s AND id = %s",
                (str(org_id), str(agent_id)),
            ).fetchone()
        return agent_id if row else None
