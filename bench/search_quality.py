"""Search quality: recall@5 and MRR of ``POST /v1/memories/search`` (lexical, semantic
alone, hybrid) against plain BM25.

``python -m bench.search_quality [--database-url URL] [--agents N] [--paraphrase-agents N]
[--seed S] [--embeddings local|none] [--fusion WEIGHT:FLOOR:ENTRY ...] [--json]``

1. Generates a labelled retrieval set, deterministically from ``--seed``, in two parts:

   - per agent of ``--agents``, one user and the people in their life (a sister, a friend, a
     colleague...), each with facts (allergies, home town, job, pets, hobbies, food, plans)
     written as memories the way the extractor writes them, in varied phrasings; then
     questions about those facts, each labelled with the memories that answer it, in kinds:
     ``direct`` (the memory's own words), ``inflected`` (other forms of the words: "live" for
     "lives", "working" for "works"), ``typo`` (the person's name misspelt) and
     ``paraphrase-named`` (little shared but the name). Each search ranks one agent's
     memories (about 30), as the API does;
   - per agent of ``--paraphrase-agents``, the memories of one person only and ``paraphrase``
     questions that share no content word with their answers (:mod:`bench.paraphrases`, which
     checks every question and raises otherwise; the run checks them again with Postgres's
     ``english`` stemmer). One person per store, so "How does she unwind?" has one answer set.
2. Stores the memories through the memory store (the same SQL as ``POST /v1/memories``) in a
   fresh database, with their vectors of the local model unless ``--embeddings none``, and asks
   every question through the search store (the same SQL as ``POST /v1/memories/search``):
   without a query vector (``lexical``: today's search, embeddings off) and with one
   (``hybrid``: the store's fusion, once per ``--fusion`` weighting, set through the store's
   module constants).
3. Ranks the same memories per agent with Okapi BM25 computed here (k1 = 1.2, b = 0.75,
   lower-cased letter-and-digit tokens, no stemming, no stop words: "plain" BM25) and by cosine
   similarity to the question's vector alone (``semantic``), and reports recall@5 and MRR for
   each ranking, overall and per question kind, and per fusion weighting whether hybrid is at
   least lexical on the whole set and above it on the paraphrases.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import BenchError, associations, paraphrases
from bench.dbadmin import recreate_database
from bench.report import load_average, run_and_print, table

DEFAULT_QUALITY_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/ibex_bench_search_quality"
K = 5

_NAMES = """
Dana Priyanka Tomasz Ingrid Kwame Mireille Joaquin Siobhan Haruto Olufemi Zofia Anders
Leilani Bartholomew Xiomara Dmitri Ngozi Rafferty Esperanza Giedre Takumi Fionnuala
Alejandro Svetlana Chidi Marguerite Ravindra Oksana Thaddeus Yevgenia
"""
NAMES = tuple(_NAMES.split())
RELATIONS = ("sister", "brother", "best friend", "colleague", "partner", "neighbour")


@dataclass(frozen=True)
class Fact:
    slot: str
    memories: tuple[str, ...]  # templates with {who}
    questions: tuple[tuple[str, str], ...]  # (kind, template with {name})


def _facts(rng: random.Random) -> list[Fact]:
    """One value per slot for one person, with its phrasings and its questions."""
    allergen = rng.choice(["peanuts", "shellfish", "penicillin", "cats", "pollen", "latex"])
    city = rng.choice(["Lisbon", "Toronto", "Osaka", "Nairobi", "Krakow", "Tbilisi", "Auckland"])
    job = rng.choice(["nurse", "carpenter", "pilot", "pharmacist", "architect", "librarian"])
    pet_kind, pet_name = rng.choice(
        [("dog", "Biscuit"), ("cat", "Mochi"), ("parrot", "Kiwi"), ("rabbit", "Clover")]
    )
    hobby = rng.choice(["cello", "pottery", "chess", "rock climbing", "birdwatching", "salsa"])
    dish = rng.choice(["spicy ramen", "mushroom risotto", "lentil soup", "fish tacos"])
    place = rng.choice(["Rome", "Reykjavik", "Marrakesh", "Hanoi", "Cusco"])
    month = rng.choice(["March", "May", "August", "October", "December"])
    return [
        Fact(
            "allergy",
            (f"{{who}} is allergic to {allergen}.",),
            (
                ("direct", "What is {name} allergic to?"),
                ("inflected", "Does {name} have any allergies?"),
                ("paraphrase-named", "What should {name} stay away from for health reasons?"),
            ),
        ),
        Fact(
            "home",
            (f"{{who}} lives in {city}.", f"{{who}} moved to {city} two years ago."),
            (
                ("inflected", "Where does {name} live?"),
                ("paraphrase-named", "Which city is {name} based in?"),
            ),
        ),
        Fact(
            "job",
            (f"{{who}} works as a {job}.",),
            (
                ("direct", "What does {name} work as?"),
                ("inflected", "What is {name} working as these days?"),
                ("paraphrase-named", "What is {name}'s profession?"),
            ),
        ),
        Fact(
            "pet",
            (f"{{who}} has a {pet_kind} named {pet_name}.",),
            (
                ("direct", "What is the name of {name}'s {kind}?".replace("{kind}", pet_kind)),
                ("inflected", "Does {name} have pets?"),
            ),
        ),
        Fact(
            "hobby",
            (f"{{who}} enjoys {hobby} on weekends.",),
            (
                ("inflected", "What does {name} enjoy doing on the weekend?"),
                ("paraphrase-named", "What is {name}'s favourite pastime?"),
            ),
        ),
        Fact(
            "food",
            (f"{{who}} loves {dish}.",),
            (
                ("direct", "What food does {name} love?"),
                ("inflected", "Which dish is {name} loving lately?"),
            ),
        ),
        Fact(
            "trip",
            (f"{{who}} is planning a trip to {place} in {month}.",),
            (
                ("direct", "Where is {name} planning a trip?"),
                ("inflected", "When are {name}'s travel plans?"),
            ),
        ),
    ]


def _typo(name: str, rng: random.Random) -> str:
    """One plausible misspelling: a doubled, dropped or swapped letter, never the first."""
    i = rng.randrange(1, len(name) - 1)
    kind = rng.choice(("double", "drop", "swap"))
    if kind == "double":
        return name[:i] + name[i] + name[i:]
    if kind == "drop":
        return name[:i] + name[i + 1 :]
    return name[:i] + name[i + 1] + name[i] + name[i + 2 :]


@dataclass
class Agent:
    slug: str
    memories: list[str] = field(default_factory=list)
    #: (kind, question, indexes of the memories that answer it)
    questions: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)


def generate(agents: int, seed: int) -> list[Agent]:
    """The labelled set: per agent, memories about several people and questions about them."""
    rng = random.Random(seed)
    out: list[Agent] = []
    for a in range(agents):
        agent = Agent(slug=f"assistant-{a + 1}")
        people = rng.sample(NAMES, 5)
        relations = rng.sample(RELATIONS, 5)
        for name, relation in zip(people, relations, strict=True):
            facts = rng.sample(_facts(rng), 4)
            agent.memories.append(f"The user's {relation} is called {name}.")
            for fact in facts:
                first = len(agent.memories)
                agent.memories.extend(t.format(who=name) for t in fact.memories)
                answers = tuple(range(first, len(agent.memories)))
                kind, template = rng.choice(fact.questions)
                agent.questions.append((kind, template.format(name=name), answers))
                if rng.random() < 0.35:
                    _, typo_template = rng.choice(fact.questions)
                    agent.questions.append(
                        ("typo", typo_template.format(name=_typo(name, rng)), answers)
                    )
        order = list(range(len(agent.memories)))
        rng.shuffle(order)  # the order of writing, so recency does not follow the generator
        position = {old: new for new, old in enumerate(order)}
        agent.memories = [agent.memories[i] for i in order]
        agent.questions = [
            (k, q, tuple(sorted(position[i] for i in ans))) for k, q, ans in agent.questions
        ]
        out.append(agent)
    return out


# -- BM25 -------------------------------------------------------------------------------------

_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class BM25:
    """Okapi BM25 over one agent's memories (k1 = 1.2, b = 0.75)."""

    def __init__(self, documents: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.docs = [Counter(tokens(d)) for d in documents]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lengths) / max(1, len(self.docs))
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.k1, self.b = k1, b

    def rank(self, query: str) -> list[int]:
        """Document indexes with a positive score, best first; ties: the later written first."""
        terms = set(tokens(query))
        scores = []
        for i, d in enumerate(self.docs):
            s = 0.0
            for t in terms:
                tf = d.get(t, 0)
                if tf:
                    norm = tf + self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg)
                    s += self.idf[t] * tf * (self.k1 + 1) / norm
            if s > 0:
                scores.append((s, i))
        scores.sort(key=lambda p: (-p[0], -p[1]))
        return [i for _, i in scores]


# -- measures ---------------------------------------------------------------------------------


def recall_at(ranked: Sequence[int], relevant: Sequence[int], k: int = K) -> float:
    return len(set(ranked[:k]) & set(relevant)) / len(relevant)


def reciprocal_rank(ranked: Sequence[int], relevant: Sequence[int]) -> float:
    for position, doc in enumerate(ranked, 1):
        if doc in relevant:
            return 1 / position
    return 0.0


#: Aggregates of the summary besides the kinds: the set as it was before the association part
#: (people and paraphrase agents), and the association part whole.
AGGREGATES = {
    "original": ("direct", "inflected", "typo", "paraphrase-named", "paraphrase"),
    "associations": ("association", "association-hand"),
}


def _summary(rows: list[tuple[str, float, float]]) -> dict[str, Any]:
    kinds = sorted({k for k, _, _ in rows})
    groups = {"all": None, **{k: (k,) for k in kinds}}
    for name, members in AGGREGATES.items():
        if any(k in members for k in kinds):
            groups[name] = members
    out: dict[str, Any] = {}
    for kind, members in groups.items():
        chosen = [r for r in rows if members is None or r[0] in members]
        out[kind] = {
            "questions": len(chosen),
            "recall_at_5": round(sum(r[1] for r in chosen) / len(chosen), 4),
            "mrr": round(sum(r[2] for r in chosen) / len(chosen), 4),
        }
    return out


def _measure(kind: str, ranked: Sequence[int], answers: Sequence[int]) -> tuple[str, float, float]:
    return kind, recall_at(ranked, answers), reciprocal_rank(ranked, answers)


def cosine_rank(memory_vectors: Sequence[Sequence[float]], query: Sequence[float]) -> list[int]:
    """Every memory, by cosine similarity to ``query`` (unit vectors: the dot product), best
    first; ties: the later written first, as :meth:`BM25.rank`."""
    scores = [
        (sum(a * b for a, b in zip(vector, query, strict=True)), i)
        for i, vector in enumerate(memory_vectors)
    ]
    scores.sort(key=lambda p: (-p[0], -p[1]))
    return [i for _, i in scores]


@dataclass(frozen=True)
class Fusion:
    """A calibration of the search store's fusion (``memories.search.store``)."""

    weight: float
    floor: float
    entry: float
    #: The scope's nearest admitted by meaning, and the share of the nearest one's similarity
    #: they need; the three-number form (the fusion before rank admission) admits all of the
    #: branch's candidates above ENTRY.
    rank: int = 50
    relative: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Fusion:
        try:
            numbers = [float(x) for x in text.split(":")]
            if len(numbers) not in (3, 5):
                raise ValueError(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                "--fusion wants WEIGHT:FLOOR:ENTRY or WEIGHT:FLOOR:ENTRY:RANK:RELATIVE"
                f" (numbers), got {text!r}"
            ) from exc
        weight, floor, entry = numbers[:3]
        rank, relative = (int(numbers[3]), numbers[4]) if len(numbers) == 5 else (50, 0.0)
        if not (0 <= weight <= 1 and 0 <= floor < 1 and 0 <= entry <= 1):
            raise argparse.ArgumentTypeError(
                f"--fusion {text!r}: WEIGHT and ENTRY in [0, 1], FLOOR in [0, 1)"
            )
        if not (1 <= rank <= 50 and 0 <= relative <= 1):
            raise argparse.ArgumentTypeError(
                f"--fusion {text!r}: RANK in 1..50, RELATIVE in [0, 1]"
            )
        return cls(weight, floor, entry, rank, relative)

    @property
    def label(self) -> str:
        return f"{self.weight:g}:{self.floor:g}:{self.entry:g}:{self.rank:d}:{self.relative:g}"


def _current_fusion(model: str | None) -> Fusion:
    from memories.search import store

    tuned = store.calibration(model)
    return Fusion(tuned.weight, tuned.floor, tuned.entry, tuned.rank, tuned.relative)


def _set_fusion(model: str | None, fusion: Fusion) -> None:
    """The store reads the model's calibration at each call (``_prepare``)."""
    import dataclasses

    from memories.search import store

    if model is None:
        return
    store.CALIBRATIONS[model] = dataclasses.replace(
        store.calibration(model),
        weight=fusion.weight,
        floor=fusion.floor,
        entry=fusion.entry,
        rank=fusion.rank,
        relative=fusion.relative,
    )


@dataclass
class Labelled:
    """One store of the set: its memories, its questions (kind, text, answers; no answers:
    a question no memory answers), and whose memories they are (a user's, or agent-wide)."""

    slug: str
    memories: list[str]
    questions: list[tuple[str, str, tuple[int, ...]]]
    part: str
    user: str | None = None


#: The parts of the set, by the kinds of their questions.
PARTS = {
    "people": ("direct", "inflected", "typo", "paraphrase-named"),
    "paraphrase": ("paraphrase",),
    "association": ("association", "association-hand", "no-answer"),
}


def labelled_set(
    agents: int, paraphrase_agents: int, seed: int, association_people: int = 0
) -> list[Labelled]:
    """The whole set: the people agents (direct, inflected, typo, paraphrase-named questions),
    the one-person paraphrase agents (``paraphrase``, checked to share no word), and the
    association part's people, each a user of one agent (:mod:`bench.associations`)."""
    out = [Labelled(a.slug, a.memories, a.questions, "people") for a in generate(agents, seed)]
    for p in paraphrases.generate(paraphrase_agents, seed):
        out.append(
            Labelled(
                p.slug,
                p.memories,
                [("paraphrase", q, ans) for q, ans, _ in p.questions],
                "paraphrase",
            )
        )
    for person in associations.generate(association_people, seed):
        out.append(
            Labelled(
                "assistant",
                person.memories,
                [(k, q, ans) for k, q, ans, _ in person.questions],
                "association",
                user=person.key,
            )
        )
    return out


#: Postgres's own stemmer on the pairs: no lexeme of the question in the answer.
PG_SHARED_SQL = """
SELECT q, m, ARRAY(SELECT unnest(tsvector_to_array(to_tsvector('english', q)))
                   INTERSECT SELECT unnest(tsvector_to_array(to_tsvector('english', m))))
  FROM unnest(%s::text[], %s::text[]) AS p(q, m)
"""
#: The kinds whose questions share no word with their answers, checked again by Postgres.
NO_SHARED_WORD = ("paraphrase", "association", "association-hand")


def _check_with_postgres(db: Any, dataset: Sequence[Labelled]) -> int:
    """Raise :class:`BenchError` for a paraphrase or association question that shares a
    lexeme (the ``english`` configuration's stems) with an answer; the pairs checked."""
    pairs = [
        (question, agent.memories[i])
        for agent in dataset
        for kind, question, answers in agent.questions
        if kind in NO_SHARED_WORD
        for i in answers
    ]
    if not pairs:
        return 0
    rows = db.execute_sql(PG_SHARED_SQL, ([q for q, _ in pairs], [m for _, m in pairs])).fetchall()
    shared = [(q, m, lex) for q, m, lex in rows if lex]
    if shared:
        q, m, lex = shared[0]
        raise BenchError(
            f"{len(shared)} question(s) that should share no word share a Postgres lexeme"
            f" with an answer, e.g. {q!r} and {m!r}: {lex}"
        )
    return len(pairs)


#: Score thresholds at which the relevance bar is measured.
BAR_THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6)


@dataclass
class ContextCounts:
    """What the context blocks of one kind of question held."""

    questions: int = 0
    covered: float = 0.0  # the share of a question's answers in its block, summed
    tokens: int = 0
    memories: int = 0
    standing: int = 0
    query_part: int = 0  # memories packed for the query (not standing facts)
    with_query_part: int = 0  # questions whose block has any
    below_bar: int = 0  # query-part memories under the relevance bar: must stay 0

    def summary(self) -> dict[str, Any]:
        n = max(1, self.questions)
        return {
            "questions": self.questions,
            "coverage": round(self.covered / n, 4),
            "mean_tokens": round(self.tokens / n, 1),
            "mean_memories": round(self.memories / n, 2),
            "mean_standing": round(self.standing / n, 2),
            "mean_query_part": round(self.query_part / n, 2),
            "with_query_part": self.with_query_part,
            "below_bar": self.below_bar,
        }


def _store(db: Any, dataset: Sequence[Labelled], embedder: Any) -> list[Any]:
    """Write every store's memories (with vectors when ``embedder``) through the memory
    store, as ``POST /v1/memories`` does; per store (agent id, user id, memory ids, vectors)."""
    from memories.canonical import content_hash
    from memories.store import MemoryStore, NewMemory
    from memories.vectors import EmbeddingStore
    from sessions.store import SessionStore

    sessions = SessionStore(db)
    memories = MemoryStore(db)
    if embedder is not None:
        # As the memory service does at start: vectors are stored for a registered model.
        EmbeddingStore(db).register(embedder.model, embedder.dimension)
    org_id = sessions.ensure_org("quality")
    stored: list[Any] = []
    for agent in dataset:
        agent_id = sessions.ensure_agent(org_id, agent.slug)
        user_id = sessions.resolve_user(org_id, external_id=agent.user) if agent.user else None
        conversation = f"{agent.slug}-{agent.user or 'conversation'}"
        session = sessions.create_session(org_id, agent_id, conversation, user_id=user_id)
        vectors = embedder.embed(agent.memories) if embedder is not None else []
        ids = []
        for ordinal, content in enumerate(agent.memories):
            result = memories.create(
                org_id,
                NewMemory(
                    agent_id=agent_id,
                    content=content,
                    content_hash=content_hash(content),
                    kind="fact",
                    metadata={},
                    session_id=session.id,
                    turn_index=1 + ordinal // 3,
                    ordinal=ordinal % 3,
                    idempotency_key=None,
                    fingerprint="",
                    user_id=user_id,
                    embedding_model=embedder.model if embedder is not None else None,
                    embedding=tuple(vectors[ordinal]) if embedder is not None else None,
                ),
            )
            if result.row is None:
                raise BenchError(f"could not store {content!r}: {result.outcome}")
            ids.append(result.row.id)
        stored.append((agent_id, user_id, ids, vectors))
    return [org_id, stored]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from core.db import make_database
    from memories.scope import AGENT_WIDE, ReadScope
    from memories.search.service import SearchService
    from memories.search.store import SearchStore, SemanticQuery, calibration
    from schema.search import DEFAULT_CONTEXT_TOKENS

    dataset = labelled_set(args.agents, args.paraphrase_agents, args.seed, args.association_people)
    embedder = None
    if args.embeddings != "none":
        import os

        from embeddings import embedder_from_env

        # openai: the endpoint of this process's EMBEDDINGS_* settings, to calibrate it.
        env = {**os.environ, "EMBEDDINGS_PROVIDER": args.embeddings}
        embedder = embedder_from_env(
            env if args.embeddings == "openai" else {"EMBEDDINGS_PROVIDER": "local"}
        )
        if embedder is None:  # pragma: no cover - local and openai always give one
            raise BenchError(f"EMBEDDINGS_PROVIDER={args.embeddings} gave no embedder")
    model = embedder.model if embedder is not None else None
    default_fusion = _current_fusion(model)
    trials = args.fusion or [default_fusion]
    budgets = sorted(set(args.context_tokens or [DEFAULT_CONTEXT_TOKENS]))
    recreate_database(args.database_url)
    db = make_database(args.database_url)
    try:
        pairs_checked = _check_with_postgres(db, dataset)
        org_id, stored = _store(db, dataset, embedder)
        searches = SearchStore(db)
        service = SearchService(searches, QueryVectors(embedder) if embedder else None)
        rows: dict[str, list[tuple[str, float, float]]] = {"lexical": [], "bm25": []}
        if embedder is not None:
            rows["semantic"] = []
        hybrid: dict[Fusion, list[tuple[str, float, float]]] = {f: [] for f in trials}
        contexts = {b: {} for b in budgets}  # type: dict[int, dict[str, ContextCounts]]
        #: per labelled question, the answers' hybrid scores; per no-answer question, the
        #: best hybrid score: what the relevance bar is measured on.
        answer_scores: list[float] = []
        other_scores: list[float] = []
        no_answer_best: list[float] = []
        examples: list[dict[str, Any]] = []
        paraphrase_examples: list[dict[str, Any]] = []
        started = time.perf_counter()
        for agent, (agent_id, user_id, ids, vectors) in zip(dataset, stored, strict=True):
            index = {memory_id: i for i, memory_id in enumerate(ids)}
            scope = ReadScope(user_id=user_id, named=True) if user_id else AGENT_WIDE
            baseline = BM25(agent.memories)
            for kind, question, answers in agent.questions:
                vector = embedder.embed([question])[0] if embedder is not None else None
                semantic = (
                    SemanticQuery(embedder.model, vector)
                    if embedder is not None and vector is not None and any(vector)
                    else None
                )
                for budget in budgets:
                    _measure_context(
                        service, org_id, agent_id, scope, question, kind, answers, index,
                        budget, contexts[budget],
                    )  # fmt: skip
                if not answers:
                    if semantic is not None:
                        found = searches.search(
                            org_id, agent_id, question, limit=10, scope=scope, semantic=semantic
                        )
                        no_answer_best.append(max((h.score for h in found), default=0.0))
                    continue
                hits = searches.search(org_id, agent_id, question, limit=10, scope=scope)
                lexical = [index[h.row.id] for h in hits]
                theirs = baseline.rank(question)
                rows["lexical"].append(_measure(kind, lexical, answers))
                rows["bm25"].append(_measure(kind, theirs, answers))
                differs = rows["lexical"][-1][2] != rows["bm25"][-1][2]
                if len(examples) < 12 and kind in PARTS["people"] and differs:
                    examples.append(
                        {
                            "kind": kind,
                            "question": question,
                            "answer": agent.memories[answers[0]],
                            "ours_rr": round(rows["lexical"][-1][2], 3),
                            "bm25_rr": round(rows["bm25"][-1][2], 3),
                        }
                    )
                if embedder is None or vector is None:
                    continue
                rows["semantic"].append(_measure(kind, cosine_rank(vectors, vector), answers))
                for number, fusion in enumerate(trials):
                    _set_fusion(model, fusion)
                    found = searches.search(
                        org_id, agent_id, question, limit=10, scope=scope, semantic=semantic
                    )
                    ranked = [index[h.row.id] for h in found]
                    hybrid[fusion].append(_measure(kind, ranked, answers))
                    if number == 0:
                        for h in found:
                            wanted = index[h.row.id] in answers
                            (answer_scores if wanted else other_scores).append(h.score)
                _set_fusion(model, default_fusion)
                if kind in NO_SHARED_WORD and len(paraphrase_examples) < 8:
                    paraphrase_examples.append(
                        {
                            "kind": kind,
                            "question": question,
                            "answer": agent.memories[answers[0]],
                            "lexical_rr": round(rows["lexical"][-1][2], 3),
                            "semantic_rr": round(rows["semantic"][-1][2], 3),
                            "hybrid_rr": round(hybrid[trials[0]][-1][2], 3),
                        }
                    )
        seconds = time.perf_counter() - started
        mode = searches.search_mode(semantic=embedder is not None)
    finally:
        _set_fusion(model, default_fusion)
        db.close()
    rankers = {name: _summary(r) for name, r in rows.items()}
    fusion_trials = []
    if embedder is not None:
        rankers["hybrid"] = _summary(hybrid[trials[0]])
        lexical_all = rankers["lexical"]["all"]
        lexical_para = rankers["lexical"].get("paraphrase")
        for fusion in trials:
            summary = _summary(hybrid[fusion])
            para = summary.get("paraphrase")
            fusion_trials.append(
                {
                    "fusion": fusion.label,
                    "semantic_weight": fusion.weight,
                    "semantic_floor": fusion.floor,
                    "semantic_entry_floor": fusion.entry,
                    "semantic_rank": fusion.rank,
                    "semantic_relative": fusion.relative,
                    "summary": summary,
                    # Hybrid at least lexical on the whole set, above it on the paraphrases.
                    "beats_lexical": summary["all"]["recall_at_5"] >= lexical_all["recall_at_5"]
                    and summary["all"]["mrr"] >= lexical_all["mrr"]
                    and (
                        para is None
                        or lexical_para is None
                        or (
                            para["recall_at_5"] > lexical_para["recall_at_5"]
                            and para["mrr"] > lexical_para["mrr"]
                        )
                    ),
                }
            )
    tuned = calibration(model)
    return {
        "benchmark": "search_quality",
        "settings": {
            "agents": args.agents,
            "paraphrase_agents": args.paraphrase_agents,
            "association_people": args.association_people,
            "seed": args.seed,
            "k": K,
            "embeddings": args.embeddings,
            "model": model,
            "store_fusion": default_fusion.label,
            "relevance": tuned.relevance,
            "context_tokens": budgets,
        },
        "search_mode": mode,
        "memories": sum(len(a.memories) for a in dataset),
        "questions": sum(len(a.questions) for a in dataset),
        "paraphrase_pairs_checked": pairs_checked,
        "rankers": rankers,
        "context": {
            str(b): {k: c.summary() for k, c in sorted(contexts[b].items())} for b in budgets
        },
        "relevance_bar": _bar_table(answer_scores, other_scores, no_answer_best),
        "fusion_trials": fusion_trials,
        "examples": examples,
        "paraphrase_examples": paraphrase_examples,
        "search_seconds": round(seconds, 3),
        "load_average": load_average(),
    }


class QueryVectors:
    """The bench's embedder as the service's query embedder (no cache: every question is
    asked once per ranking anyway)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    @property
    def model(self) -> str:
        return str(self.embedder.model)

    def embed_query(self, text: str) -> list[float]:
        return list(self.embedder.embed([text])[0])


def _measure_context(
    service: Any,
    org_id: Any,
    agent_id: Any,
    scope: Any,
    question: str,
    kind: str,
    answers: Sequence[int],
    index: dict[Any, int],
    budget: int,
    counts: dict[str, ContextCounts],
) -> None:
    """The context block for ``question`` as ``POST /v1/context`` builds it; what it holds."""
    request = {
        "agent_id": agent_id,
        "query": question,
        "messages": None,
        "max_tokens": budget,
        "session_id": None,
        "kinds": None,
        "include_superseded": False,
    }
    context = service.context(org_id, request, scope)
    packed = [context.hits[i] for i in context.packed.chosen]
    query_part = [context.hits[i] for i in context.packed.chosen if i >= context.standing]
    held = {index[h.row.id] for h in packed}
    names = ["all" if answers else "no-answer", kind]
    names += [name for name, kinds in AGGREGATES.items() if kind in kinds]
    for name in names:
        c = counts.setdefault(name, ContextCounts())
        c.questions += 1
        c.covered += len(held & set(answers)) / len(answers) if answers else 0.0
        c.tokens += context.packed.tokens
        c.memories += len(packed)
        c.standing += len(packed) - len(query_part)
        c.query_part += len(query_part)
        c.with_query_part += 1 if query_part else 0
        c.below_bar += sum(1 for h in query_part if h.score < context.relevance)


def _bar_table(
    answers: Sequence[float], others: Sequence[float], no_answer: Sequence[float]
) -> list[dict[str, Any]]:
    """Per score threshold: the share of labelled answers that reach it (among the hybrid
    top 10), the share of the hits reaching it that are answers, and the share of no-answer
    questions with some hit reaching it (a block would carry something for them)."""
    out = []
    for t in BAR_THRESHOLDS:
        a = sum(1 for s in answers if s >= t)
        o = sum(1 for s in others if s >= t)
        out.append(
            {
                "threshold": t,
                "answers_reaching": round(a / max(1, len(answers)), 4),
                "precision": round(a / max(1, a + o), 4),
                "no_answer_with_a_hit": round(
                    sum(1 for s in no_answer if s >= t) / max(1, len(no_answer)), 4
                ),
            }
        )
    return out


RANKER_ORDER = ("bm25", "lexical", "semantic", "hybrid")
KIND_ORDER = (
    "all",
    "original",
    "direct",
    "inflected",
    "typo",
    "paraphrase-named",
    "paraphrase",
    "associations",
    "association",
    "association-hand",
)


def render(doc: dict[str, Any]) -> str:
    rankers = [r for r in RANKER_ORDER if r in doc["rankers"]]
    kinds = [k for k in KIND_ORDER if k in doc["rankers"]["bm25"]]
    budgets = list(doc["context"])
    header = ["questions", "n"]
    header += [f"R@5 {r}" for r in rankers] + [f"MRR {r}" for r in rankers]
    header += [f"context {b}" for b in budgets]
    body = [
        [kind, doc["rankers"]["bm25"][kind]["questions"]]
        + [doc["rankers"][r][kind]["recall_at_5"] for r in rankers]
        + [doc["rankers"][r][kind]["mrr"] for r in rankers]
        + [doc["context"][b].get(kind, {}).get("coverage", "") for b in budgets]
        for kind in kinds
    ]
    s = doc["settings"]
    out = [
        f"search quality: {doc['questions']} questions over {doc['memories']} memories"
        f" ({s['agents']} agents of people, {s['paraphrase_agents']} of one person each,"
        f" {s['association_people']} people of the association part, seed {s['seed']}),"
        f" search mode {doc['search_mode']}, embeddings {s['embeddings']} ({s['model']});"
        f" {doc['paraphrase_pairs_checked']} pairs checked to share no word",
        "",
        table(header, body),
    ]
    out += ["", f"context blocks (relevance bar {s['relevance']}):"]
    context_body = [
        [b, kind, c["questions"], c["coverage"], c["mean_tokens"], c["mean_memories"],
         c["mean_standing"], c["mean_query_part"], c["with_query_part"], c["below_bar"]]
        for b in budgets
        for kind, c in doc["context"][b].items()
    ]  # fmt: skip
    out.append(
        table(
            [
                "budget",
                "questions",
                "n",
                "coverage",
                "tokens",
                "memories",
                "standing",
                "query part",
                "with query part",
                "below bar",
            ],
            context_body,
        )
    )
    if doc["relevance_bar"]:
        out += ["", "relevance bar (hybrid top 10): threshold, answers reaching, precision,"
                " no-answer questions with a hit reaching it"]  # fmt: skip
        out.append(
            table(
                ["threshold", "answers", "precision", "no-answer"],
                [
                    [
                        r["threshold"],
                        r["answers_reaching"],
                        r["precision"],
                        r["no_answer_with_a_hit"],
                    ]
                    for r in doc["relevance_bar"]
                ],
            )
        )
    if doc["fusion_trials"]:
        out += ["", "hybrid by calibration (WEIGHT:FLOOR:ENTRY:RANK:RELATIVE):"]
        trial_body = [
            [t["fusion"], t["summary"]["all"]["recall_at_5"], t["summary"]["all"]["mrr"]]
            + [
                t["summary"].get(k, {}).get("recall_at_5", "")
                for k in ("paraphrase", "association", "association-hand")
            ]
            + ["yes" if t["beats_lexical"] else "no"]
            for t in doc["fusion_trials"]
        ]
        out.append(
            table(
                ["fusion", "R@5 all", "MRR all", "R@5 para", "R@5 assoc", "R@5 hand", ">= lexical"],
                trial_body,
            )
        )
    out += ["", "questions where the first relevant rank differs (lexical vs BM25):"]
    for e in doc["examples"]:
        out.append(
            f"  [{e['kind']}] {e['question']!r} -> {e['answer']!r}:"
            f" 1/rank ours {e['ours_rr']}, BM25 {e['bm25_rr']}"
        )
    if doc["paraphrase_examples"]:
        out += ["", "questions sharing no word (1/rank lexical, semantic, hybrid):"]
        for e in doc["paraphrase_examples"]:
            out.append(
                f"  [{e['kind']}] {e['question']!r} -> {e['answer']!r}:"
                f" {e['lexical_rr']}, {e['semantic_rr']}, {e['hybrid_rr']}"
            )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.search_quality",
        description="recall@5 and MRR of the search (lexical, semantic, hybrid) against BM25,"
        " and what the context block holds",
    )
    p.add_argument(
        "--database-url",
        default=DEFAULT_QUALITY_DATABASE_URL,
        help="dropped and created afresh (default: %(default)s)",
    )
    p.add_argument("--agents", type=int, default=10, help="agents (about 20 questions each)")
    p.add_argument(
        "--paraphrase-agents",
        type=int,
        default=10,
        help=f"one-person agents of the paraphrase part ({paraphrases.QUESTIONS_PER_AGENT}"
        " questions each; default %(default)s)",
    )
    p.add_argument(
        "--association-people",
        type=int,
        default=30,
        help="people of the association part, users of one agent (about"
        f" {associations.QUESTIONS_PER_PERSON + associations.NO_ANSWER_PER_PERSON + 1}"
        " questions each; default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--embeddings",
        choices=("local", "openai", "none"),
        default="local",
        help="local: vectors of the packaged model, semantic and hybrid rankings too;"
        " openai: the OpenAI-compatible endpoint of the EMBEDDINGS_* environment (to"
        " calibrate it); none: lexical and BM25 only (default %(default)s)",
    )
    p.add_argument(
        "--fusion",
        type=Fusion.parse,
        action="append",
        metavar="WEIGHT:FLOOR:ENTRY[:RANK:RELATIVE]",
        help="hybrid with this calibration of the model (repeat to compare; the first is the"
        " report's hybrid, the context blocks use the store's; default: the store's)",
    )
    p.add_argument(
        "--context-tokens",
        type=int,
        action="append",
        metavar="N",
        help="the context blocks' budget (repeat for several; default 400, the API's)",
    )
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_print("bench.search_quality", build_parser().parse_args(argv), run, render)


if __name__ == "__main__":
    raise SystemExit(main())
