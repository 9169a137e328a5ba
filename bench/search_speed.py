"""Search speed: ``POST /v1/memories/search``'s SQL over 1,000,000 memories of one org.

``python -m bench.search_speed [--memories N] [--agents N] [--queries N] [--contexts N]
[--embeddings local|none] [--server system|embedded] [--reuse] [--json]``

1. Generates, in one ``INSERT ... SELECT generate_series``, ``--memories`` memories for one org
   spread round-robin over ``--agents`` agents (one session each), with text built from word
   lists: about 2,000 distinct names, verbs and objects, so some words are in a tenth of an
   agent's memories and some in a handful; then ``VACUUM ANALYZE`` (what autovacuum does
   after a bulk load: statistics, and the GIN pending lists merged). With ``--embeddings
   local`` (the default) a vector per memory follows, by binary COPY, and the HNSW index where
   the server has pgvector (:mod:`bench.vectors`). ``--reuse`` keeps a data set of the same
   shape. ``--server embedded`` runs it all on the embedded PostgreSQL 18 with pgvector
   (data in ``--data-folder``); the default is the server of ``--database-url``.
2. Times ``--queries`` searches (after a warm-up), each through the search store as the
   service runs it (the tenant transaction, the candidates functions, the ranking), hybrid
   with the question's vector of the local model (embedded before the clock starts), for a
   mix of questions: a name and a common word, a common word alone, a misspelt name, two
   objects, and a question in words no memory uses (``meaning``).
   Then ``--contexts`` context blocks of 400 tokens for the same questions, through the
   service's context flow (the profile read, the search with the standing facts pinned, the
   packing), as the chat path's injection asks for them.
3. Prints p50 / p95 / p99 / max in milliseconds, overall and per kind of question, and the
   ``EXPLAIN (ANALYZE, BUFFERS)`` plans of the first question, of the slowest one and of a
   ``meaning`` question: the ranking statement as the tenant runs it, then each lexical
   candidate branch, and the semantic branch's statement (HNSW or the exact window).

With ``--reuse``, migrations added since the data set was generated are applied to it first,
and the vectors loaded when the data set has none.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2

from bench import BenchError
from bench.dbadmin import admin_connection, database_name, recreate_database, scalar, with_database
from bench.report import load_average, percentile, run_and_print

DEFAULT_SPEED_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench_search_speed"

_FIRST = "Ka Lo Mi Ta Re Zu No Fe Da Si Vo Pe Ha Ju Ri Be Xo Ga Wi Ne"
_SECOND = "ran lia dor mek sia vel tor bin zar quo nes pha lum dri kos gan wen tai rup sol"
_OBJECTS = """
peanuts shellfish pollen cats Lisbon Toronto Osaka Nairobi cello pottery chess climbing ramen
risotto soup tacos Rome Hanoi Cusco violin tennis sailing gardening poetry stamps vinyl coffee
tea sushi curry museums opera jazz hiking kayaks lanterns origami bonsai marathons quilting
falconry
"""
FIRST = tuple(_FIRST.split())
SECOND = tuple(_SECOND.split())
THIRD = ("a", "o", "i", "e", "u")
VERBS = (
    "is allergic to",
    "lives near",
    "works with",
    "loves",
    "has a dog named",
    "is planning a trip to",
    "enjoys",
    "moved to",
    "is learning",
    "collects",
    "hates",
    "visits",
)
OBJECTS = tuple(_OBJECTS.split())

GENERATE_SQL = """
SET synchronous_commit = off;
CREATE TEMP TABLE bench_agents AS
SELECT (row_number() OVER (ORDER BY a.id) - 1)::int AS n, a.id, s.id AS session_id
  FROM ibex_core.agents a JOIN ibex_core.sessions s ON s.agent_id = a.id
 WHERE a.org_id = %(org_id)s;
CREATE UNIQUE INDEX ON bench_agents (n);
INSERT INTO ibex_memory.memories
    (org_id, agent_id, session_id, turn_index, ordinal, content, content_hash, kind, created_at)
SELECT %(org_id)s, a.id, a.session_id, 1 + g / %(agents)s / 3, (g / %(agents)s) %% 3,
       -- A name from three syllable lists (2,000 names), a verb, one or two objects.
       (%(first)s::text[])[1 + g %% 20] || (%(second)s::text[])[1 + (g / 20) %% 20]
           || (%(third)s::text[])[1 + (g / 400) %% 5]
           || ' ' || (%(verbs)s::text[])[1 + (g / 7) %% %(verb_count)s]
           || ' ' || (%(objects)s::text[])[1 + (g / 3) %% %(object_count)s]
           || CASE WHEN g %% 3 = 0
                   THEN ' and ' || (%(objects)s::text[])[1 + (g / 11) %% %(object_count)s]
                   ELSE '' END || '.',
       md5(g::text), (ARRAY['fact','preference','event','other'])[1 + g %% 4],
       now() - make_interval(secs => %(memories)s - g)
  FROM generate_series(1, %(memories)s) g
  JOIN bench_agents a ON a.n = g %% %(agents)s;
"""


def _name(rng: random.Random) -> str:
    return rng.choice(FIRST) + rng.choice(SECOND) + rng.choice(THIRD)


def _typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 1)
    return word[:i] + word[i + 1] + word[i] + word[i + 2 :]


#: The kinds of question, in the order :func:`questions` cycles through them.
KINDS = ("name+common", "common", "typo", "multi-word", "meaning")

#: Questions in words the memories do not use: the semantic branch alone finds their answers.
MEANING = (
    "who has a furry companion at home",
    "which people are into classical instruments",
    "anyone with food intolerances",
    "who enjoys the outdoors and mountains",
    "who is fond of Japanese cuisine",
    "which friends are travelling abroad soon",
    "who likes handicrafts and folding paper",
    "anyone keen on birds of prey",
)


def questions(count: int, seed: int) -> list[tuple[str, str]]:
    """A deterministic mix of the questions an assistant asks, each with its kind."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        if kind == "name+common":
            out.append((kind, f"What is {_name(rng)} allergic to?"))
        elif kind == "common":
            out.append((kind, f"who {rng.choice(VERBS).split()[0]} {rng.choice(OBJECTS)}"))
        elif kind == "typo":
            out.append((kind, f"Where does {_typo(_name(rng), rng)} live?"))
        elif kind == "multi-word":
            out.append((kind, f"{rng.choice(OBJECTS)} and {rng.choice(OBJECTS)}"))
        else:
            out.append((kind, rng.choice(MEANING)))
    return out


def _latency(timings: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(timings), 2),
        "p95": round(percentile(timings, 95) or 0, 2),
        "p99": round(percentile(timings, 99) or 0, 2),
        "max": round(max(timings), 2),
    }


def _local_embedder(args: argparse.Namespace) -> Any:
    if args.embeddings != "local":
        return None
    from embeddings import embedder_from_env

    return embedder_from_env({"EMBEDDINGS_PROVIDER": "local"})


def generate(url: str, args: argparse.Namespace, embedder: Any) -> dict[str, Any]:
    from bench import vectors
    from core.db import make_database
    from sessions.store import SessionStore

    want_vectors = args.memories if embedder is not None else 0
    if args.reuse:
        try:
            conn = admin_connection(url)
            try:
                count = scalar(conn, "SELECT count(*) FROM ibex_memory.memories")
                agents = scalar(conn, "SELECT count(*) FROM ibex_core.agents")
                stored = scalar(conn, "SELECT count(*) FROM ibex_memory.memory_embeddings")
            finally:
                conn.close()
            if (count, agents) == (args.memories, args.agents):
                from core.migrate import migrate

                migrated = migrate(url)  # indexes added since the data set was generated
                if migrated:
                    conn = admin_connection(url)
                    try:
                        with conn.cursor() as cur:
                            cur.execute("VACUUM ANALYZE ibex_memory.memories")
                    finally:
                        conn.close()
                loaded = None
                if stored != want_vectors and embedder is not None:
                    loaded = vectors.load(url, embedder, VERBS, OBJECTS, args.seed)
                return {
                    "generated": False,
                    "seconds": 0.0,
                    "migrated": migrated,
                    "vectors": loaded,
                }
        except psycopg2.Error:
            pass  # no usable data set: generate one
    started = time.monotonic()
    recreate_database(url)
    db = make_database(url)
    try:
        store = SessionStore(db)
        org_id = store.ensure_org("speed")
        for n in range(args.agents):
            agent_id = store.ensure_agent(org_id, f"agent-{n + 1}")
            store.create_session(org_id, agent_id, f"agent-{n + 1}-conversation")
    finally:
        db.close()
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                GENERATE_SQL,
                {
                    "org_id": str(org_id),
                    "agents": args.agents,
                    "memories": args.memories,
                    "first": list(FIRST),
                    "second": list(SECOND),
                    "third": list(THIRD),
                    "verbs": list(VERBS),
                    "objects": list(OBJECTS),
                    "verb_count": len(VERBS),
                    "object_count": len(OBJECTS),
                },
            )
            cur.execute("VACUUM ANALYZE ibex_memory.memories")
        if scalar(conn, "SELECT count(*) FROM ibex_memory.memories") != args.memories:
            raise BenchError("the generated data set does not have the expected size")
    finally:
        conn.close()
    memories_seconds = round(time.monotonic() - started, 1)
    loaded = vectors.load(url, embedder, VERBS, OBJECTS, args.seed) if embedder else None
    return {
        "generated": True,
        "seconds": round(time.monotonic() - started, 1),
        "memories_seconds": memories_seconds,
        "vectors": loaded,
    }


#: The statements ``ibex_memory.semantic_candidates`` (migrations 000016, 000017 and 000019)
#: runs for a reader of the whole agent, rebuilt here so that their plans can be shown (a
#: function's inner plan is not in the caller's EXPLAIN): with pgvector, the count of the
#: scope's live memories and then exact cosine (at most 5,000) or the partition's HNSW index;
#: else the exact window. The reader's scope is on the memory (m), the vector is e.
SEMANTIC_COUNT_SQL = """
SELECT count(*) FROM (SELECT 1 FROM ibex_memory.memories m
 WHERE m.org_id = %(org_id)s AND m.agent_id = %(agent_id)s
   AND m.user_id IS NULL AND m.deleted_at IS NULL LIMIT 5001) x
"""
_SEMANTIC_WHERE = """
e.org_id = %(org_id)s AND e.agent_id = %(agent_id)s AND e.model = %(model)s
   AND e.dimension = {dim} AND m.org_id = %(org_id)s AND m.agent_id = %(agent_id)s
   AND m.user_id IS NULL AND m.deleted_at IS NULL AND m.superseded_by IS NULL"""
SEMANTIC_EXACT_SQL = f"""
SELECT x.memory_id, x.s FROM (
SELECT e.memory_id, 1 - (e.embedding::vector({{dim}}) <=> %(vector)s::real[]::vector({{dim}})) AS s
  FROM ibex_memory.memory_embeddings e
  JOIN ibex_memory.memories m ON m.id = e.memory_id
 WHERE {_SEMANTIC_WHERE} OFFSET 0) x
 ORDER BY x.s DESC, x.memory_id LIMIT %(limit)s
"""
#: Most vectors a scope may hold and still be ranked exactly (000017).
EXACT_SCOPE = 5000
SEMANTIC_HNSW_SQL = f"""
SELECT e.memory_id, 1 - (e.embedding::vector({{dim}}) <=> %(vector)s::real[]::vector({{dim}}))
  FROM ibex_memory.memory_embeddings e
  JOIN ibex_memory.memories m ON m.id = e.memory_id
 WHERE {_SEMANTIC_WHERE}
 ORDER BY e.embedding::vector({{dim}}) <=> %(vector)s::real[]::vector({{dim}})
 LIMIT %(limit)s
"""
SEMANTIC_WINDOW_SQL = f"""
SELECT w.memory_id, ibex_memory.dot(w.embedding, %(vector)s::real[]) AS s
  FROM (SELECT e.memory_id, e.embedding
          FROM ibex_memory.memory_embeddings e
          JOIN ibex_memory.memories m ON m.id = e.memory_id
         WHERE {_SEMANTIC_WHERE}
         ORDER BY e.created_at DESC LIMIT %(window)s) w
 ORDER BY s DESC, w.memory_id LIMIT %(limit)s
"""


def explain_semantic(
    url: str, org_id: Any, agent_id: Any, model: str, vector: Sequence[float], hnsw: bool
) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the semantic branch's statement, as its owner runs it
    (with the settings it sets for the HNSW form)."""
    from memories.search import store

    params = {
        "org_id": str(org_id),
        "agent_id": str(agent_id),
        "model": model,
        "vector": [float(v) for v in vector],
        "limit": store.SEMANTIC_CANDIDATES,
        "window": store.SEMANTIC_WINDOW,
    }
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            sql, form = SEMANTIC_WINDOW_SQL, f"exact cosine over the newest {params['window']}"
            if hnsw:
                cur.execute(SEMANTIC_COUNT_SQL, params)
                (count,) = cur.fetchone()
                sql, form = SEMANTIC_HNSW_SQL, "HNSW (pgvector, the agent's partition)"
                if count <= EXACT_SCOPE:
                    sql, form = SEMANTIC_EXACT_SQL, f"exact cosine over the scope's {count}"
            if sql is SEMANTIC_HNSW_SQL:
                cur.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                ef = max(40, 2 * store.SEMANTIC_CANDIDATES)
                cur.execute(f"SET LOCAL hnsw.ef_search = {ef}")
            cur.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + sql.format(dim=len(vector)).replace("%%", "%"),
                params,
            )
            plan = [r[0] for r in cur.fetchall()]
            cur.execute("ROLLBACK")
    finally:
        conn.close()
    return "\n".join([f"-- semantic branch: {form}", *plan])


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.memories < args.agents or args.agents < 1:
        raise BenchError("need at least one agent and one memory per agent")
    if args.server == "system":
        return _run(args, args.database_url)
    from cli.stack.embedded import EmbeddedPostgres

    # The embedded PostgreSQL 18 with pgvector, its data kept in --data-folder (so --reuse
    # finds the data set again), stopped at the end.
    server = EmbeddedPostgres(Path(args.data_folder))
    url = server.start()
    try:
        return _run(args, with_database(url, database_name(args.database_url)))
    finally:
        server.stop()


def _run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from core.db import make_database
    from memories.search.store import SearchStore, SemanticQuery

    embedder = _local_embedder(args)
    generation = generate(url, args, embedder)
    db = make_database(url)
    try:
        org_id, agent_ids = _tenant(db)
        searches = SearchStore(db)
        asked = questions(args.queries, args.seed)
        query_vectors: dict[str, Any] = {}
        if embedder is not None:
            texts = sorted({q for _, q in asked})
            query_vectors = dict(zip(texts, embedder.embed(texts), strict=True))

        def semantic(question: str) -> Any:
            if embedder is None:
                return None
            return SemanticQuery(embedder.model, query_vectors[question])

        rng = random.Random(args.seed)
        for _, question in asked[: max(5, args.queries // 10)]:  # warm-up: caches, connection
            searches.search(
                org_id, rng.choice(agent_ids), question, limit=10, semantic=semantic(question)
            )
        timings: list[float] = []
        by_kind: dict[str, list[float]] = {kind: [] for kind in KINDS}
        hits: list[int] = []
        slowest = (0.0, asked[0][1], agent_ids[0])
        for kind, question in asked:
            agent_id = rng.choice(agent_ids)
            # The query's vector is embedded before the clock starts: the service embeds it
            # before its one statement (about 0.1 ms with the local model, cached after).
            query = semantic(question)
            started = time.perf_counter()
            found = searches.search(org_id, agent_id, question, limit=10, semantic=query)
            elapsed = (time.perf_counter() - started) * 1000
            timings.append(elapsed)
            by_kind[kind].append(elapsed)
            hits.append(len(found))
            slowest = max(slowest, (elapsed, question, agent_id), key=lambda t: t[0])
        contexts = _time_contexts(db, org_id, agent_ids, asked, args, embedder, query_vectors)
        plan = searches.explain(
            org_id, agent_ids[0], asked[0][1], limit=10, semantic=semantic(asked[0][1])
        )
        slowest_plan = searches.explain(
            org_id, slowest[2], slowest[1], limit=10, semantic=semantic(slowest[1])
        )
        meaning = next(q for k, q in asked if k == "meaning") if args.queries >= 5 else None
        hnsw = embedder is not None and searches.vector_index(embedder.dimension)
        semantic_plans = []
        if embedder is not None:
            explained = [asked[0][1], slowest[1]] + ([meaning] if meaning else [])
            for question in dict.fromkeys(explained):
                semantic_plans.append(
                    {
                        "question": question,
                        "plan": explain_semantic(
                            url, org_id, agent_ids[0], embedder.model,
                            query_vectors[question], hnsw,
                        ),
                    }
                )  # fmt: skip
        meaning_plan = ""
        if meaning is not None:
            meaning_plan = searches.explain(
                org_id, agent_ids[0], meaning, limit=10, semantic=semantic(meaning)
            )
        mode = searches.search_mode(semantic=embedder is not None)
        server = db.execute_sql("SHOW server_version").fetchone()[0]
    finally:
        db.close()
    # An index by its name in the plans; a partitioned one (000017) by its partitions' names.
    part = r"memory_embeddings_p[0-9]+"
    indexes = {
        "idx_memories_fts_agent": None,
        "idx_memories_trgm_agent": None,
        "idx_memories_fts": None,
        "idx_memories_trgm": None,
        "idx_memories_agent": None,
        "memories_pkey": None,
        "memory_embeddings_pkey": rf"{part}_pkey",
        "idx_memory_embeddings_hnsw_256": r"idx_memory_embeddings_hnsw_256_p[0-9]+",
        "idx_memory_embeddings_scope": rf"{part}_org_id_agent_id_model_created_at_idx",
        "idx_memories_agent_user": None,
    }
    every_plan = plan + slowest_plan + meaning_plan + "".join(p["plan"] for p in semantic_plans)
    p99 = percentile(timings, 99)
    return {
        "benchmark": "search_speed",
        "settings": {
            "memories": args.memories,
            "agents": args.agents,
            "queries": args.queries,
            "seed": args.seed,
            "embeddings": args.embeddings,
            "server": args.server,
        },
        "server_version": server,
        "search_mode": mode,
        "semantic_form": None if embedder is None else ("hnsw" if hnsw else "exact-window"),
        "semantic_paths": [p["plan"].splitlines()[0] for p in semantic_plans],
        "generation": generation,
        "latency_ms": _latency(timings),
        "latency_ms_by_kind": {kind: _latency(t) for kind, t in by_kind.items() if t},
        "context_ms": contexts,
        "target_p99_ms": 50,
        "meets_target": p99 is not None and p99 < 50,
        "mean_hits": round(sum(hits) / len(hits), 2),
        "question_explained": asked[0][1],
        # Whole names only: idx_memories_fts is not used when idx_memories_fts_agent is.
        "indexes_used": {
            name: re.search(rf"\b{pattern or name}\b", every_plan) is not None
            for name, pattern in indexes.items()
        },
        "sequential_scans": [
            line.strip()
            for line in every_plan.splitlines()
            if re.search(r"Seq Scan on (memories|memory_embeddings(_p[0-9]+)?)\b", line)
        ],
        "plan": plan,
        "slowest": {"question": slowest[1], "ms": round(slowest[0], 2), "plan": slowest_plan},
        "meaning": {"question": meaning, "plan": meaning_plan},
        "semantic_plans": semantic_plans,
        "load_average": load_average(),
    }


def _tenant(db: Any) -> tuple[Any, list[Any]]:
    import uuid

    rows = db.execute_sql(
        "SELECT a.org_id, a.id FROM ibex_core.agents a JOIN ibex_core.orgs o ON o.id = a.org_id"
        " WHERE o.slug = 'speed' ORDER BY a.slug"
    ).fetchall()
    if not rows:
        raise BenchError("no data set")
    return uuid.UUID(str(rows[0][0])), [uuid.UUID(str(r[1])) for r in rows]


class _Vectors:
    """The questions' vectors, embedded before any clock starts, as the service's query
    embedder (the web process keeps a cache of them too)."""

    def __init__(self, model: str, vectors: dict[str, Any]) -> None:
        self.model = model
        self.vectors = vectors

    def embed_query(self, text: str) -> list[float]:
        return list(self.vectors[text])


def _time_contexts(
    db: Any,
    org_id: Any,
    agent_ids: Sequence[Any],
    asked: Sequence[tuple[str, str]],
    args: argparse.Namespace,
    embedder: Any,
    query_vectors: dict[str, Any],
) -> dict[str, Any] | None:
    """``--contexts`` context blocks (400 tokens, the agent-wide scope) timed as
    ``POST /v1/context`` assembles them (the service's flow, no HTTP): what injection costs
    per chat turn."""
    from memories.search.service import SearchService
    from memories.search.store import SearchStore

    if args.contexts < 1:
        return None
    vectors = _Vectors(embedder.model, query_vectors) if embedder is not None else None
    service = SearchService(SearchStore(db), vectors)
    rng = random.Random(args.seed + 1)

    def once(question: str) -> float:
        request = {
            "agent_id": rng.choice(agent_ids),
            "query": question,
            "messages": None,
            "max_tokens": 400,
            "session_id": None,
            "kinds": None,
            "include_superseded": False,
        }
        started = time.perf_counter()
        service.context(org_id, request)
        return (time.perf_counter() - started) * 1000

    chosen = [asked[i % len(asked)][1] for i in range(args.contexts)]
    for question in chosen[: max(5, args.contexts // 10)]:  # warm-up
        once(question)
    return _latency([once(q) for q in chosen])


def render(doc: dict[str, Any]) -> str:
    s, lat = doc["settings"], doc["latency_ms"]
    g = doc["generation"]
    loaded = g.get("vectors")
    out = [
        f"search over {s['memories']:,} memories of one org, {s['agents']} agents,"
        f" {s['queries']} questions, PostgreSQL {doc['server_version']} ({s['server']}),"
        f" search mode {doc['search_mode']}, semantic branch {doc['semantic_form']}",
        f"generated: {g['generated']}, {g['seconds']} s"
        + (
            f" (vectors: {loaded['vectors']:,} copied in {loaded['copy_seconds']} s,"
            f" HNSW index {loaded['hnsw_index']} ({loaded['index_seconds']} s),"
            f" vacuum {loaded['vacuum_seconds']} s)"
            if loaded
            else ""
        ),
        f"latency ms: p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}  max {lat['max']}"
        f"  (target p99 < {doc['target_p99_ms']}: {'met' if doc['meets_target'] else 'MISSED'})",
        f"mean hits per question: {doc['mean_hits']}; load average {doc['load_average']}",
        (
            "context blocks (400 tokens) ms: p50 {p50}  p95 {p95}  p99 {p99}  max {max}".format(
                **doc["context_ms"]
            )
            if doc.get("context_ms")
            else "context blocks: not timed (--contexts 0)"
        ),
        "indexes used: "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in doc["indexes_used"].items()),
        f"sequential scans: {doc['sequential_scans'] or 'none'}",
        "by kind of question (ms):",
        *(
            f"  {kind:<12} p50 {k['p50']}  p95 {k['p95']}  p99 {k['p99']}  max {k['max']}"
            for kind, k in doc["latency_ms_by_kind"].items()
        ),
        "",
        f"EXPLAIN (ANALYZE, BUFFERS) for {doc['question_explained']!r}:",
        doc["plan"],
        "",
        f"EXPLAIN (ANALYZE, BUFFERS) for the slowest question, {doc['slowest']['question']!r}"
        f" ({doc['slowest']['ms']} ms when timed):",
        doc["slowest"]["plan"],
    ]
    if doc["meaning"]["question"]:
        out += [
            "",
            f"EXPLAIN (ANALYZE, BUFFERS) for a question of no stored word,"
            f" {doc['meaning']['question']!r}:",
            doc["meaning"]["plan"],
        ]
    for p in doc["semantic_plans"]:
        out += ["", f"semantic branch for {p['question']!r}:", p["plan"]]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.search_speed", description="Time searches over many memories"
    )
    p.add_argument(
        "--database-url",
        default=DEFAULT_SPEED_DATABASE_URL,
        help="dropped and created afresh unless --reuse (default: %(default)s)",
    )
    p.add_argument("--memories", type=int, default=1_000_000)
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--queries", type=int, default=500, help="timed searches (default 500)")
    p.add_argument(
        "--contexts",
        type=int,
        default=200,
        help="context blocks timed after the searches (default 200; 0: none)",
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--reuse", action="store_true", help="keep a data set of the same shape")
    p.add_argument(
        "--embeddings",
        choices=("local", "none"),
        default="local",
        help="local: a vector per memory (the packaged model's phrase vectors plus noise) and"
        " hybrid searches; none: lexical searches only (default %(default)s)",
    )
    p.add_argument(
        "--server",
        choices=("system", "embedded"),
        default="system",
        help="system: the server of --database-url; embedded: the embedded PostgreSQL 18 with"
        " pgvector, started on --data-folder (the database named as in --database-url)",
    )
    p.add_argument(
        "--data-folder",
        default=str(Path(tempfile.gettempdir()) / "ibex-bench-search-speed-pg18"),
        help="the embedded server's data folder, kept for --reuse (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_print("bench.search_speed", build_parser().parse_args(argv), run, render)


if __name__ == "__main__":
    raise SystemExit(main())
