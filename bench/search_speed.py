"""Search speed: ``POST /v1/memories/search``'s SQL over 1,000,000 memories of one org.

``python -m bench.search_speed [--memories N] [--agents N] [--queries N] [--contexts N]
[--embeddings local|none] [--server system|embedded] [--shared-buffers SIZE]
[--shape facts|conversation] [--reuse] [--json]``

1. Generates, in one ``INSERT ... SELECT generate_series``, ``--memories`` memories for one org
   spread round-robin over ``--agents`` agents (one session each), with text built from word
   lists: about 2,000 distinct names, verbs and objects, so some words are in a tenth of an
   agent's memories and some in a handful; then ``VACUUM ANALYZE`` (what autovacuum does
   after a bulk load: statistics, and the GIN pending lists merged). With ``--embeddings
   local`` (the default) a vector per memory follows, by binary COPY, and the HNSW index where
   the server has pgvector (:mod:`bench.vectors`). ``--reuse`` keeps a data set of the same
   shape. ``--server embedded`` runs it all on the embedded PostgreSQL 18 with pgvector
   (data in ``--data-folder``, ``shared_buffers`` set by ``--shared-buffers``, PostgreSQL's
   128MB by default, and ``pg_prewarm`` preloaded as ``ibex up`` has it: the pages its
   buffers held at the previous run's stop are loaded back before anything is timed,
   ``prewarm_s`` in the document); the default is the server of ``--database-url``.

   ``--shape conversation`` stores instead, per agent, a dialogue between two named speakers,
   one memory per turn, ``"<Speaker>: <utterance>"`` of about 30 words made from templates
   and seeded word lists (what a chat's turns stored as memories look like), each with the
   local model's vector of its own text; its questions name one speaker or both plus a few
   content words, so most of an agent's memories share a word with the question, and each is
   asked of the agent whose speakers it names.
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


# -- The conversation shape ------------------------------------------------------------------

#: Speakers: each agent's dialogue is between two of them (agent n: names 2n and 2n + 1).
_SPEAKERS = """
Aria Bruno Celia Dmitri Elena Farid Greta Hugo Ines Jonas Kira Luca Maya Nils Olga Pavel
Rosa Sami Tara Viktor Wanda Yusuf Zelda Anton Bianca Cyrus Dalia Emil Flora Gideon
"""
SPEAKERS = tuple(_SPEAKERS.split())
_OPENERS = (
    "Hey {other}!", "Thanks {other},", "Oh wow {other},", "Honestly,", "You know what,",
    "Yeah,", "Good to hear from you {other}.", "Ha, {other},", "So,", "Guess what {other},",
)  # fmt: skip
_DID = (
    "went to", "tried", "started", "finished", "signed up for", "talked about", "planned",
    "booked", "visited", "joined", "organised", "looked into", "gave up on", "found",
)  # fmt: skip
_THINGS = """
a pottery class|a camping trip|the beach|a jazz concert|the science museum|a support group|the
city marathon|a book club|an adoption agency|a painting workshop|the farmers market|a cooking
course|a road trip|the climbing gym|a charity run|a music festival|a dance class|the botanical
garden|a photography walk|a volunteer shift|the animal shelter|a language course|a job
interview|a family reunion|a yoga retreat|the film festival|a board game night|a baking
contest|the science fair|a poetry reading|a kayak tour|the art gallery|a career fair|a
birthday party|a garden project|the local library|a startup meetup|a chess tournament|a
violin lesson|the ski trip
"""
THINGS = tuple(t.strip() for t in _THINGS.replace("\n", " ").split("|"))
_WHEN = (
    "last week", "yesterday", "this weekend", "on Friday", "last month", "a few days ago",
    "on Sunday", "this morning",
)  # fmt: skip
_WITH = ("kids", "sister", "friends", "partner", "dog", "mom", "colleagues", "brother")
_ADJECTIVES = (
    "amazing", "tough", "fun", "relaxing", "exhausting", "special", "inspiring", "chaotic",
    "peaceful", "emotional",
)  # fmt: skip
_FEELINGS = ("proud", "happy", "nervous", "grateful", "excited", "hopeful", "tired", "calm")
_CLOSERS = (
    "What about you, have you {did} {thing2} lately?",
    "I think you would really love {thing2} too.",
    "Maybe next time we can go to {thing2} together.",
    "Do you still want to try {thing2} sometime soon?",
    "It reminded me of the time we talked about {thing2}.",
    "Next on my list is {thing2}, wish me luck!",
)


def utterance(rng: random.Random, speaker: str, other: str) -> str:
    """One turn of the dialogue, about 30 words: ``"<Speaker>: <utterance>"``."""
    thing, thing2 = rng.sample(THINGS, 2)
    return (
        f"{speaker}: {rng.choice(_OPENERS).format(other=other)} I {rng.choice(_DID)} {thing}"
        f" {rng.choice(_WHEN)} with my {rng.choice(_WITH)}. It was {rng.choice(_ADJECTIVES)}"
        f" and I really feel {rng.choice(_FEELINGS)} about it. "
        + rng.choice(_CLOSERS).format(did=rng.choice(_DID), thing2=thing2)
    )


def speakers(agent: int) -> tuple[str, str]:
    """The two speakers of agent number ``agent`` (from 0)."""
    n = len(SPEAKERS)
    return SPEAKERS[(2 * agent) % n], SPEAKERS[(2 * agent + 1) % n]


#: The kinds of question of the conversation shape, in the order they cycle.
CONVERSATION_KINDS = ("one-speaker", "two-speakers", "content", "typo", "meaning")

#: Questions in words the dialogues do not use.
CONVERSATION_MEANING = (
    "which of them owns a pet",
    "who enjoys creative hobbies",
    "anyone into outdoor sports",
    "who cares about helping others",
    "which one likes classical instruments",
    "who is into learning new things",
)


def conversation_questions(count: int, seed: int, agents: int) -> list[tuple[str, str, int]]:
    """A deterministic mix of questions about the dialogues, each with its kind and the agent
    it is asked of (its speakers named, as a question about a conversation names them)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = CONVERSATION_KINDS[i % len(CONVERSATION_KINDS)]
        agent = rng.randrange(agents)
        a, b = speakers(agent)
        if rng.random() < 0.5:
            a, b = b, a
        thing = rng.choice(THINGS).split(" ", 1)[1]
        if kind == "one-speaker":
            q = rng.choice(
                (
                    f"When did {a} go to {thing}?",
                    f"How does {a} feel about {thing}?",
                    f"What did {a} think of {thing} with the {rng.choice(_WITH)}?",
                )
            )
        elif kind == "two-speakers":
            q = rng.choice(
                (
                    f"What did {a} and {b} talk about {rng.choice(_WHEN)}?",
                    f"Did {a} tell {b} about {thing}?",
                    f"What would {a} suggest {b} try next?",
                )
            )
        elif kind == "content":
            q = f"Who {rng.choice(_DID)} {thing} with their {rng.choice(_WITH)}?"
        elif kind == "typo":
            q = f"What did {_typo(a.lower(), rng).capitalize()} do {rng.choice(_WHEN)}?"
        else:
            q = rng.choice(CONVERSATION_MEANING)
        out.append((kind, q, agent))
    return out


def generate_conversation(url: str, org_id: Any, agent_ids: Sequence[Any], args: Any) -> None:
    """``--memories`` turns spread evenly over the agents: each agent's dialogue alternates
    its two speakers, one memory per turn, over about 200 days (the newest now)."""
    import uuid

    from psycopg2.extras import execute_values

    per_agent = args.memories // len(agent_ids)
    rng = random.Random(args.seed)
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT agent_id, id FROM ibex_core.sessions WHERE org_id = %s", (str(org_id),)
            )
            sessions = {str(a): str(s) for a, s in cur.fetchall()}
            rows = []
            for n, agent_id in enumerate(agent_ids):
                first, second = speakers(n)
                for t in range(per_agent):
                    speaker, other = (first, second) if t % 2 == 0 else (second, first)
                    text = utterance(rng, speaker, other)
                    age = (per_agent - t) * 200 * 86400 / per_agent + n
                    rows.append(
                        (
                            str(uuid.uuid4()), str(org_id), str(agent_id),
                            sessions[str(agent_id)], t + 1, 0, text,
                            f"{n}-{t}", "event", age,
                        )
                    )  # fmt: skip
            execute_values(
                cur,
                "INSERT INTO ibex_memory.memories (id, org_id, agent_id, session_id, turn_index,"
                " ordinal, content, content_hash, kind, created_at) SELECT v.id::uuid,"
                " v.org::uuid, v.agent::uuid, v.session::uuid, v.turn, v.ord, v.content,"
                " md5(v.hash), v.kind, now() - make_interval(secs => v.age)"
                " FROM (VALUES %s) v(id, org, agent, session, turn, ord, content, hash, kind, age)",
                rows,
                page_size=1000,
            )
    finally:
        conn.close()


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
                dialogues = scalar(
                    conn,
                    "SELECT count(*) FROM ibex_core.sessions WHERE external_id LIKE %s",
                    ("%-dialogue",),
                )
            finally:
                conn.close()
            shape = "conversation" if dialogues else "facts"
            if (count, agents, shape) == (args.memories, args.agents, args.shape):
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
                    loaded = _load_vectors(url, embedder, args)
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
        suffix = "dialogue" if args.shape == "conversation" else "conversation"
        agent_ids = []
        for n in range(args.agents):
            agent_id = store.ensure_agent(org_id, f"agent-{n + 1}")
            store.create_session(org_id, agent_id, f"agent-{n + 1}-{suffix}")
            agent_ids.append(agent_id)
    finally:
        db.close()
    if args.shape == "conversation":
        generate_conversation(url, org_id, agent_ids, args)
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                GENERATE_SQL if args.shape == "facts" else "SELECT 1",
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
        expected = args.memories
        if args.shape == "conversation":
            expected = args.memories // args.agents * args.agents
        if scalar(conn, "SELECT count(*) FROM ibex_memory.memories") != expected:
            raise BenchError("the generated data set does not have the expected size")
    finally:
        conn.close()
    memories_seconds = round(time.monotonic() - started, 1)
    loaded = _load_vectors(url, embedder, args) if embedder else None
    return {
        "generated": True,
        "seconds": round(time.monotonic() - started, 1),
        "memories_seconds": memories_seconds,
        "vectors": loaded,
    }


def settle_visibility(url: str) -> dict[str, Any]:
    """The memories' visibility map as a table of that size has it in service, where
    autovacuum's insert threshold vacuums it after a load: the share of its pages marked
    all-visible, and a ``VACUUM`` (up to three) while fewer than 99 % are. The generation's own
    ``VACUUM ANALYZE``, run right after the load, leaves none marked (seen on both servers; the
    next marks about 91 %, the one after the rest), and then every index-only scan of the
    searches (the count that picks the semantic path reads up to 5,001 index entries) fetches
    each row from the table instead."""

    def share(conn: Any) -> float:
        return float(
            scalar(
                conn,
                "SELECT round(CASE WHEN relpages > 0 THEN relallvisible::numeric / relpages"
                " ELSE 1 END, 3) FROM pg_class WHERE oid = 'ibex_memory.memories'::regclass",
            )
        )

    conn = admin_connection(url)
    try:
        before = after = share(conn)
        vacuums = 0
        while after < 0.99 and vacuums < 3:
            with conn.cursor() as cur:
                cur.execute("VACUUM (ANALYZE) ibex_memory.memories")
            vacuums += 1
            after = share(conn)
        return {"all_visible_before": before, "all_visible": after, "vacuums": vacuums}
    finally:
        conn.close()


def _load_vectors(url: str, embedder: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The vectors of the data set: for the facts shape from its phrases plus noise
    (:mod:`bench.vectors`), for a conversation the local model's vector of each turn."""
    from bench import vectors

    if args.shape == "facts":
        return vectors.load(url, embedder, VERBS, OBJECTS, args.seed)
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT content FROM ibex_memory.memories ORDER BY created_at, id")
            texts = [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
    return vectors.load(url, embedder, VERBS, OBJECTS, args.seed, texts=texts)


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
    # finds the data set again), with --shared-buffers (restarted when it changes), stopped
    # at the end.
    server = EmbeddedPostgres(
        Path(args.data_folder), settings={"shared_buffers": args.shared_buffers}
    )
    url = server.start()
    try:
        # The pages the server held at its last stop, loaded back by pg_prewarm's autoprewarm
        # (as an `ibex up` server does) before anything is timed.
        prewarm_s = server.wait_for_prewarm()
        document = _run(args, with_database(url, database_name(args.database_url)))
        document["prewarm_s"] = round(prewarm_s, 2)
        return document
    finally:
        server.stop()


def _run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from core.db import make_database
    from memories.search.store import SearchStore, SemanticQuery

    embedder = _local_embedder(args)
    generation = generate(url, args, embedder)
    generation["visibility"] = settle_visibility(url)
    db = make_database(url)
    try:
        org_id, agent_ids = _tenant(db)
        searches = SearchStore(db)
        rng = random.Random(args.seed)
        kinds = KINDS if args.shape == "facts" else CONVERSATION_KINDS
        # Each question with the agent asked: at random for the facts shape, the agent whose
        # speakers it names for a conversation.
        if args.shape == "facts":
            asked = questions(args.queries, args.seed)
            agent_of = [rng.choice(agent_ids) for _ in asked]
        else:
            conv = conversation_questions(args.queries, args.seed, len(agent_ids))
            asked = [(k, q) for k, q, _ in conv]
            agent_of = [agent_ids[a] for _, _, a in conv]
        query_vectors: dict[str, Any] = {}
        if embedder is not None:
            texts = sorted({q for _, q in asked})
            query_vectors = dict(zip(texts, embedder.embed(texts), strict=True))

        def semantic(question: str) -> Any:
            if embedder is None:
                return None
            return SemanticQuery(embedder.model, query_vectors[question])

        warm = max(5, args.queries // 10)
        for (_, question), agent_id in zip(asked[:warm], agent_of[:warm], strict=True):
            # Warm-up: caches, connection.
            searches.search(org_id, agent_id, question, limit=10, semantic=semantic(question))
        timings: list[float] = []
        by_kind: dict[str, list[float]] = {kind: [] for kind in kinds}
        hits: list[int] = []
        slowest = (0.0, asked[0][1], agent_of[0])
        for (kind, question), agent_id in zip(asked, agent_of, strict=True):
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
        contexts = _time_contexts(
            db, org_id, agent_ids, asked, agent_of, args, embedder, query_vectors
        )
        plan = searches.explain(
            org_id, agent_of[0], asked[0][1], limit=10, semantic=semantic(asked[0][1])
        )
        slowest_plan = searches.explain(
            org_id, slowest[2], slowest[1], limit=10, semantic=semantic(slowest[1])
        )
        meaning_at = next((i for i, (k, _) in enumerate(asked) if k == "meaning"), None)
        meaning = asked[meaning_at][1] if meaning_at is not None else None
        meaning_agent = agent_of[meaning_at] if meaning_at is not None else agent_of[0]
        hnsw = embedder is not None and searches.vector_index(embedder.dimension)
        semantic_plans = []
        if embedder is not None:
            explained = [(asked[0][1], agent_of[0]), (slowest[1], slowest[2])]
            if meaning:
                explained.append((meaning, meaning_agent))
            for question, agent_id in dict.fromkeys(explained):
                semantic_plans.append(
                    {
                        "question": question,
                        "plan": explain_semantic(
                            url, org_id, agent_id, embedder.model,
                            query_vectors[question], hnsw,
                        ),
                    }
                )  # fmt: skip
        meaning_plan = ""
        if meaning is not None:
            meaning_plan = searches.explain(
                org_id, meaning_agent, meaning, limit=10, semantic=semantic(meaning)
            )
        mode = searches.search_mode(semantic=embedder is not None)
        server = db.execute_sql("SHOW server_version").fetchone()[0]
        shared_buffers = db.execute_sql("SHOW shared_buffers").fetchone()[0]
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
            "shape": args.shape,
        },
        "server_version": server,
        "shared_buffers": shared_buffers,
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
    agent_of: Sequence[Any],
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

    def once(question: str, agent_id: Any) -> float:
        request = {
            "agent_id": rng.choice(agent_ids) if args.shape == "facts" else agent_id,
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

    chosen = [(asked[i % len(asked)][1], agent_of[i % len(asked)]) for i in range(args.contexts)]
    for question, agent_id in chosen[: max(5, args.contexts // 10)]:  # warm-up
        once(question, agent_id)
    return _latency([once(q, a) for q, a in chosen])


def render(doc: dict[str, Any]) -> str:
    s, lat = doc["settings"], doc["latency_ms"]
    g = doc["generation"]
    loaded = g.get("vectors")
    out = [
        f"search over {s['memories']:,} memories ({s.get('shape', 'facts')}) of one org,"
        f" {s['agents']} agents,"
        f" {s['queries']} questions, PostgreSQL {doc['server_version']} ({s['server']},"
        f" shared_buffers {doc.get('shared_buffers')}"
        + (f", {doc['prewarm_s']} s loading its pages back" if "prewarm_s" in doc else "")
        + "),"
        f" search mode {doc['search_mode']}, semantic branch {doc['semantic_form']}",
        f"generated: {g['generated']}, {g['seconds']} s"
        + (
            f" (vectors: {loaded['vectors']:,} copied in {loaded['copy_seconds']} s,"
            f" HNSW index {loaded['hnsw_index']} ({loaded['index_seconds']} s),"
            f" vacuum {loaded['vacuum_seconds']} s)"
            if loaded
            else ""
        ),
        "pages all-visible: {all_visible_before} -> {all_visible} ({vacuums} VACUUM)".format(
            **g["visibility"]
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
    p.add_argument(
        "--shared-buffers",
        default="128MB",
        help="the embedded server's shared_buffers, set by ALTER SYSTEM and a restart, as"
        " PostgreSQL shows it (128MB, 2GB, ...; default %(default)s, PostgreSQL's own); the"
        " HNSW scan reads its pages through it",
    )
    p.add_argument(
        "--shape",
        choices=("facts", "conversation"),
        default="facts",
        help="facts: short sentences from word lists (a name, a verb, objects); conversation:"
        " per agent a dialogue between two named speakers, a memory per turn of about 30"
        " words ('Speaker: ...'), and questions naming the speakers (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_print("bench.search_speed", build_parser().parse_args(argv), run, render)


if __name__ == "__main__":
    raise SystemExit(main())
