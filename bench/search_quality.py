"""Search quality: recall@5 and MRR of ``POST /v1/memories/search`` against plain BM25.

``python -m bench.search_quality [--database-url URL] [--agents N] [--seed S] [--json]``

1. Generates a labelled retrieval set, deterministically from ``--seed``: per agent, one user
   and the people in their life (a sister, a friend, a colleague...), each with facts
   (allergies, home town, job, pets, hobbies, food, plans) written as memories the way the
   extractor writes them, in varied phrasings; then questions about those facts, each labelled
   with the memories that answer it. Questions come in kinds: ``direct`` (the memory's own
   words), ``inflected`` (other forms of the words: "live" for "lives", "working" for
   "works"), ``typo`` (the person's name misspelt) and ``paraphrase`` (little shared but the
   name). The same conversations' memories go to every agent's own store, so each search
   ranks one agent's memories (about 60), as the API does.
2. Stores the memories through the memory store (the same SQL as ``POST /v1/memories``) in a
   fresh database, and asks every question through the search store (the same SQL as
   ``POST /v1/memories/search``).
3. Ranks the same memories per agent with Okapi BM25 computed here (k1 = 1.2, b = 0.75,
   lower-cased letter-and-digit tokens, no stemming, no stop words: "plain" BM25), and reports
   recall@5 and MRR for both, overall and per question kind.
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

from bench import BenchError
from bench.dbadmin import recreate_database
from bench.report import run_and_print, table

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
                ("paraphrase", "What should {name} stay away from for health reasons?"),
            ),
        ),
        Fact(
            "home",
            (f"{{who}} lives in {city}.", f"{{who}} moved to {city} two years ago."),
            (
                ("inflected", "Where does {name} live?"),
                ("paraphrase", "Which city is {name} based in?"),
            ),
        ),
        Fact(
            "job",
            (f"{{who}} works as a {job}.",),
            (
                ("direct", "What does {name} work as?"),
                ("inflected", "What is {name} working as these days?"),
                ("paraphrase", "What is {name}'s profession?"),
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
                ("paraphrase", "What is {name}'s favourite pastime?"),
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


def _summary(rows: list[tuple[str, float, float]]) -> dict[str, Any]:
    kinds = sorted({k for k, _, _ in rows})
    out: dict[str, Any] = {}
    for kind in ["all", *kinds]:
        chosen = [r for r in rows if kind in ("all", r[0])]
        out[kind] = {
            "questions": len(chosen),
            "recall_at_5": round(sum(r[1] for r in chosen) / len(chosen), 4),
            "mrr": round(sum(r[2] for r in chosen) / len(chosen), 4),
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from core.db import make_database
    from memory_service.canonical import content_hash
    from memory_service.memories.store import MemoryStore, NewMemory
    from memory_service.search.store import SearchStore
    from models.store import SessionStore

    dataset = generate(args.agents, args.seed)
    recreate_database(args.database_url)
    db = make_database(args.database_url)
    try:
        sessions = SessionStore(db)
        memories = MemoryStore(db)
        org_id = sessions.ensure_org("quality")
        stored: list[tuple[Any, list[Any]]] = []
        for agent in dataset:
            agent_id = sessions.ensure_agent(org_id, agent.slug)
            session = sessions.create_session(org_id, agent_id, f"{agent.slug}-conversation")
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
                    ),
                )
                if result.row is None:
                    raise BenchError(f"could not store {content!r}: {result.outcome}")
                ids.append(result.row.id)
            stored.append((agent_id, ids))
        searches = SearchStore(db)
        ours: list[tuple[str, float, float]] = []
        bm25: list[tuple[str, float, float]] = []
        examples: list[dict[str, Any]] = []
        started = time.perf_counter()
        for agent, (agent_id, ids) in zip(dataset, stored, strict=True):
            index = {memory_id: i for i, memory_id in enumerate(ids)}
            baseline = BM25(agent.memories)
            for kind, question, answers in agent.questions:
                hits = searches.search(org_id, agent_id, question, limit=10)
                ranked = [index[h.row.id] for h in hits]
                theirs = baseline.rank(question)
                ours.append((kind, recall_at(ranked, answers), reciprocal_rank(ranked, answers)))
                bm25.append((kind, recall_at(theirs, answers), reciprocal_rank(theirs, answers)))
                if len(examples) < 12 and ours[-1][2] != bm25[-1][2]:
                    examples.append(
                        {
                            "kind": kind,
                            "question": question,
                            "answer": agent.memories[answers[0]],
                            "ours_rr": round(ours[-1][2], 3),
                            "bm25_rr": round(bm25[-1][2], 3),
                        }
                    )
        seconds = time.perf_counter() - started
        mode = searches.search_mode()
    finally:
        db.close()
    return {
        "benchmark": "search_quality",
        "settings": {"agents": args.agents, "seed": args.seed, "k": K},
        "search_mode": mode,
        "memories": sum(len(a.memories) for a in dataset),
        "questions": len(ours),
        "ours": _summary(ours),
        "bm25": _summary(bm25),
        "examples": examples,
        "search_seconds": round(seconds, 3),
    }


def render(doc: dict[str, Any]) -> str:
    kinds = list(doc["ours"])
    body = [
        [
            kind,
            doc["ours"][kind]["questions"],
            doc["ours"][kind]["recall_at_5"],
            doc["bm25"][kind]["recall_at_5"],
            doc["ours"][kind]["mrr"],
            doc["bm25"][kind]["mrr"],
        ]
        for kind in kinds
    ]
    out = [
        f"search quality: {doc['questions']} questions over {doc['memories']} memories"
        f" ({doc['settings']['agents']} agents, seed {doc['settings']['seed']}),"
        f" search mode {doc['search_mode']}",
        "",
        table(["questions", "n", "recall@5 ours", "recall@5 BM25", "MRR ours", "MRR BM25"], body),
        "",
        "questions where the first relevant rank differs:",
    ]
    for e in doc["examples"]:
        out.append(
            f"  [{e['kind']}] {e['question']!r} -> {e['answer']!r}:"
            f" 1/rank ours {e['ours_rr']}, BM25 {e['bm25_rr']}"
        )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.search_quality",
        description="recall@5 and MRR of the search against plain BM25",
    )
    p.add_argument(
        "--database-url",
        default=DEFAULT_QUALITY_DATABASE_URL,
        help="dropped and created afresh (default: %(default)s)",
    )
    p.add_argument("--agents", type=int, default=10, help="agents (about 20 questions each)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_print("bench.search_quality", build_parser().parse_args(argv), run, render)


if __name__ == "__main__":
    raise SystemExit(main())
