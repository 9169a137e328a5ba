"""The paraphrase part of the search quality set: questions that share no content word with
the memories that answer them ("How does she unwind?" for "Dana paints watercolours in the
evening.").

Each paraphrase agent's store holds the memories of one person only, so a question that names
nobody ("she") still has one well-defined answer set: the memories of the slot it asks about.
Per agent: :data:`SLOTS_PER_AGENT` slots of the pool below, one value each (its one or two
memories), of which :data:`QUESTIONS_PER_AGENT` are asked about (the others are distractors,
written the same way). Slots are chosen so that no memory of one slot answers another slot's
question.

:func:`shared_words` is the check: lower-cased letter-and-digit words, stop words (the search's
own list, :data:`memories.search.store.STOP_WORDS`) left out, a light stemmer
(:func:`stem`), and two words count as shared when their stems are equal or, both at least 4
letters long, one begins with the other ("allerg" and "allergic", "react" and "reaction"). It
is stricter than the Postgres english stemmer, which the quality bench checks as well against
the stored memories. :func:`generate` raises :class:`bench.BenchError` for any question that
shares a word with one of its answers: the set is built to have none, and a change to the
pool that breaks that must fail loudly, not be filtered away.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from bench import BenchError
from memories.search.store import STOP_WORDS

SLOTS_PER_AGENT = 22
QUESTIONS_PER_AGENT = 12

#: Memory templates: ``{who}`` the person's name, ``{her}`` their possessive pronoun.
#: Question templates: ``{subj}`` (she, he), ``{obj}`` (her, him), ``{poss}`` (her, his).


@dataclass(frozen=True)
class Slot:
    name: str
    values: tuple[tuple[str, ...], ...]  # per value, the memories that state it
    questions: tuple[str, ...]


SLOTS: tuple[Slot, ...] = (
    Slot(
        "unwind",
        (
            ("{who} paints watercolours in the evening.",),
            ("{who} knits scarves while listening to podcasts.",),
            ("{who} takes a long bath with candles after a hard day.",),
            ("{who} does jigsaw puzzles on quiet nights.", "{who} finished a 2000-piece jigsaw."),
        ),
        (
            "How does {subj} unwind?",
            "What helps {obj} relax?",
            "What does {subj} do to decompress?",
            "How does {subj} chill out once the stress builds?",
        ),
    ),
    Slot(
        "job",
        (
            ("{who} works as a nurse at the city hospital.",),
            ("{who} is a carpenter who builds kitchen cabinets.",),
            ("{who} flies planes for a regional airline.",),
            ("{who} teaches maths at a secondary school.",),
        ),
        (
            "How does {subj} earn a living?",
            "What is {poss} occupation?",
            "What does {subj} do for a paycheck?",
            "What line of business is {subj} in?",
        ),
    ),
    Slot(
        "allergy",
        (
            ("{who} is allergic to peanuts.",),
            ("{who} gets hives from shellfish.",),
            ("{who} must never be given penicillin.",),
            ("{who} had anaphylaxis after a wasp sting.",),
        ),
        (
            "What triggers {poss} immune reactions?",
            "Which substances make {obj} break out in a rash?",
            "What should {subj} carry an EpiPen for?",
        ),
    ),
    Slot(
        "home",
        (
            ("{who} lives in Lisbon.", "{who} moved to Lisbon two years ago."),
            ("{who} rents a flat in Toronto.",),
            ("{who} bought a house near Osaka.",),
            ("{who} has a cottage outside Nairobi.",),
        ),
        (
            "Where does {subj} reside?",
            "In which town has {subj} settled?",
            "Where is {poss} address these days?",
        ),
    ),
    Slot(
        "pet",
        (
            ("{who} has a dog named Biscuit.",),
            ("{who} adopted a cat called Mochi.",),
            ("{who} owns a parrot named Kiwi.",),
            ("{who} has two rabbits in a hutch.",),
        ),
        (
            "What animal keeps {obj} company?",
            "Does {subj} look after any creatures?",
            "Which furry or feathered friend lives with {obj}?",
        ),
    ),
    Slot(
        "food",
        (
            ("{who} adores spicy ramen.",),
            ("{who} could eat mushroom risotto every day.",),
            ("{who} loves fish tacos.",),
            ("{who} is crazy about Ethiopian injera.",),
        ),
        (
            "What is {poss} favourite meal?",
            "Which dish does {subj} crave?",
            "What would {subj} order at a restaurant?",
        ),
    ),
    Slot(
        "trip",
        (
            ("{who} is planning a trip to Rome in May.",),
            ("{who} booked flights to Reykjavik for August.",),
            ("{who} will visit Hanoi in October.",),
            ("{who} is heading to Cusco next spring to hike.",),
        ),
        (
            "Where is {subj} going on holiday?",
            "What journey abroad is coming up for {obj}?",
            "Which vacation destination has {subj} chosen?",
        ),
    ),
    Slot(
        "siblings",
        (
            ("{who} has two older brothers.",),
            ("{who} grew up with three sisters.",),
            ("{who} has a younger brother who is a chef.",),
        ),
        (
            "How many siblings does {subj} have?",
            "Who else did {poss} parents raise?",
        ),
    ),
    Slot(
        "music",
        (
            ("{who} plays the cello in an orchestra.",),
            ("{who} is learning jazz piano.",),
            ("{who} sings in a choir on Thursdays.",),
        ),
        (
            "Which instrument has {subj} mastered?",
            "What sort of tunes does {subj} perform?",
            "Is {subj} musical?",
        ),
    ),
    Slot(
        "fitness",
        (
            ("{who} swims laps at the pool three mornings a week.",),
            ("{who} lifts weights at the gym.",),
            ("{who} plays tennis with colleagues.",),
            ("{who} trains for marathons.",),
        ),
        (
            "How does {subj} stay fit?",
            "What exercise does {subj} get?",
            "What sport keeps {obj} in shape?",
        ),
    ),
    Slot(
        "drink",
        (
            ("{who} drinks green tea.",),
            ("{who} takes {her} coffee black.",),
            ("{who} starts every morning with an espresso.",),
        ),
        (
            "What beverage does {subj} prefer?",
            "What should I brew for {obj}?",
            "Which hot cuppa does {subj} want?",
        ),
    ),
    Slot(
        "birthday",
        (
            ("{who}'s birthday is on 3 March.",),
            ("{who} turns forty in June.",),
            ("{who} celebrates on the ninth of November.",),
        ),
        (
            "When was {subj} born?",
            "What date should we mark {poss} age going up?",
        ),
    ),
    Slot(
        "languages",
        (
            ("{who} is fluent in Portuguese and Spanish.",),
            ("{who} grew up bilingual in French and Arabic.",),
            ("{who} took evening classes in Mandarin.",),
        ),
        (
            "What languages can {subj} speak?",
            "Which tongues does {subj} know?",
            "Is {subj} a polyglot?",
        ),
    ),
    Slot(
        "transport",
        (
            ("{who} drives an electric Volvo.",),
            ("{who} takes the tram everywhere.",),
            ("{who} rides a scooter through town.",),
        ),
        (
            "How does {subj} get around?",
            "What vehicle does {subj} use?",
            "Does {subj} own a car?",
        ),
    ),
    Slot(
        "education",
        (
            ("{who} has a PhD in chemistry.",),
            ("{who} graduated in law from Edinburgh.",),
            ("{who} earned a masters in marine biology.",),
        ),
        (
            "Where did {subj} study?",
            "What degree does {subj} hold?",
            "Which university did {subj} attend?",
        ),
    ),
    Slot(
        "fear",
        (
            ("{who} is afraid of heights.",),
            ("{who} panics around spiders.",),
            ("{who} gets anxious in small enclosed spaces.",),
        ),
        (
            "What scares {obj}?",
            "What is {subj} terrified of?",
            "Does {subj} have any phobias?",
        ),
    ),
    Slot(
        "partner",
        (
            ("{who} is married to Tom.",),
            ("{who} has a girlfriend called Priya.",),
            ("{who} got engaged last spring.",),
        ),
        (
            "Is {subj} seeing anyone?",
            "Who is {poss} significant other?",
            "Is {subj} single?",
        ),
    ),
    Slot(
        "children",
        (
            ("{who} has a daughter aged six.",),
            ("{who} is raising twin boys.",),
            ("{who}'s son just started kindergarten.",),
        ),
        (
            "Is {subj} a parent?",
            "How many kids does {subj} have?",
        ),
    ),
    Slot(
        "garden",
        (
            ("{who} grows tomatoes on the balcony.",),
            ("{who} tends a vegetable allotment.",),
            ("{who} cultivates orchids indoors.",),
        ),
        (
            "What plants is {subj} nurturing?",
            "Does {subj} have green fingers?",
        ),
    ),
    Slot(
        "books",
        (
            ("{who} reads a lot of crime fiction.",),
            ("{who} collects first editions of Tolkien.",),
            ("{who} is working through the Russian classics.",),
        ),
        (
            "What literature does {subj} like?",
            "Which novels would make a good present for {obj}?",
            "Who is {poss} favourite author?",
        ),
    ),
    Slot(
        "sleep",
        (
            ("{who} gets up at 5 am.",),
            ("{who} is a night owl who rarely sleeps before 2.",),
            ("{who} wakes at dawn to meditate.",),
        ),
        (
            "Is {subj} an early riser?",
            "When does {subj} go to bed?",
            "What hours does {subj} keep?",
        ),
    ),
    Slot(
        "health",
        (
            ("{who} has type 1 diabetes.",),
            ("{who} lives with asthma.",),
            ("{who} suffers from migraines.",),
        ),
        (
            "What chronic illness does {subj} manage?",
            "Does {subj} have a long-term medical condition?",
        ),
    ),
    Slot(
        "volunteering",
        (
            ("{who} volunteers at a food bank.",),
            ("{who} coaches a youth football team for free.",),
            ("{who} helps at a homeless shelter on Sundays.",),
        ),
        (
            "Does {subj} give time to any good causes?",
            "What charity work does {subj} do?",
        ),
    ),
    Slot(
        "screen",
        (
            ("{who} is binge-watching a Korean drama series.",),
            ("{who} loves old Hitchcock films.",),
            ("{who} watches every nature documentary.",),
        ),
        (
            "Which movies or shows does {subj} enjoy?",
            "What is on {poss} telly?",
        ),
    ),
    Slot(
        "colour",
        (
            ("{who}'s favourite colour is green.",),
            ("{who} wears purple whenever possible.",),
        ),
        (
            "What shade does {subj} prefer?",
            "Which hue suits {poss} taste?",
        ),
    ),
    Slot(
        "phone",
        (
            ("{who} switched to an Android handset.",),
            ("{who} owns a Pixel smartphone.",),
            ("{who} still uses an old flip phone.",),
        ),
        (
            "Which mobile does {subj} carry?",
            "What device does {subj} text from?",
        ),
    ),
    Slot(
        "cooking",
        (
            ("{who} bakes sourdough every weekend.",),
            ("{who} makes fresh pasta from scratch.",),
            ("{who} took a course in Thai cooking.",),
        ),
        (
            "Is {subj} good in the kitchen?",
            "What does {subj} prepare at the stove?",
        ),
    ),
    Slot(
        "season",
        (
            ("{who} loves the autumn.",),
            ("{who} adores snowy winters.",),
            ("{who} lives for long summer evenings.",),
        ),
        (
            "What time of year does {subj} enjoy most?",
            "Which part of the calendar is {poss} favourite?",
        ),
    ),
)

#: Ways of opening a question, so the same slot is not always asked the same way.
LEAD_INS = ("", "Remind me, ", "Quick one: ", "Do you recall: ", "Any idea, ")

#: (name, subject, object, possessive): one person per paraphrase agent.
PEOPLE = (
    ("Dana", "she", "her", "her"),
    ("Tomasz", "he", "him", "his"),
    ("Ingrid", "she", "her", "her"),
    ("Kwame", "he", "him", "his"),
    ("Mireille", "she", "her", "her"),
    ("Joaquin", "he", "him", "his"),
    ("Siobhan", "she", "her", "her"),
    ("Haruto", "he", "him", "his"),
    ("Zofia", "she", "her", "her"),
    ("Anders", "he", "him", "his"),
    ("Leilani", "she", "her", "her"),
    ("Dmitri", "he", "him", "his"),
    ("Ngozi", "she", "her", "her"),
    ("Rafferty", "he", "him", "his"),
    ("Esperanza", "she", "her", "her"),
    ("Takumi", "he", "him", "his"),
)

_WORD = re.compile(r"[a-z0-9]+")
_SUFFIXES = ("ingly", "edly", "ings", "ing", "ies", "ied", "ers", "er", "ed", "es", "ly", "s")


def stem(word: str) -> str:
    """A light stemmer: one common suffix off (leaving at least 3 letters), then a doubled
    final consonant undone ("running" -> "run") or a final "e" dropped ("live" -> "liv")."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if len(word) >= 4 and word[-1] == word[-2] and word[-1] not in "aeiouls":
        word = word[:-1]
    elif len(word) >= 4 and word.endswith("e"):
        word = word[:-1]  # "live", "lives", "lived": "liv"
    return word


def content_stems(text: str) -> set[str]:
    """The stems of ``text``'s words that are not stop words."""
    return {stem(w) for w in _WORD.findall(text.lower()) if w not in STOP_WORDS}


def _same(a: str, b: str) -> bool:
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    return len(short) >= 4 and long_.startswith(short)


def shared_words(question: str, memory: str) -> list[str]:
    """The question's content stems that the memory shares (see the module docstring)."""
    theirs = content_stems(memory)
    return sorted(q for q in content_stems(question) if any(_same(q, m) for m in theirs))


@dataclass
class Person:
    name: str
    subj: str
    obj: str
    poss: str


@dataclass
class ParaphraseAgent:
    slug: str
    person: str
    memories: list[str] = field(default_factory=list)
    #: (question, indexes of the memories that answer it, slot)
    questions: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)


def check(question: str, answers: list[str]) -> None:
    """Raise :class:`BenchError` when ``question`` shares a content word with an answer."""
    for memory in answers:
        shared = shared_words(question, memory)
        if shared:
            raise BenchError(
                f"paraphrase question {question!r} shares {shared} with its answer {memory!r}"
            )


def generate(agents: int, seed: int) -> list[ParaphraseAgent]:
    """``agents`` stores of one person each, with their paraphrase questions, from ``seed``."""
    rng = random.Random(seed * 7919 + 1)
    out = []
    for a in range(agents):
        name, subj, obj, poss = PEOPLE[a % len(PEOPLE)]
        agent = ParaphraseAgent(slug=f"companion-{a + 1}", person=name)
        slots = rng.sample(SLOTS, SLOTS_PER_AGENT)
        asked = set(rng.sample(range(SLOTS_PER_AGENT), QUESTIONS_PER_AGENT))
        pronouns = {"subj": subj, "obj": obj, "poss": poss}
        for i, slot in enumerate(slots):
            value = rng.choice(slot.values)
            first = len(agent.memories)
            agent.memories.extend(t.format(who=name, her=poss) for t in value)
            if i not in asked:
                continue
            template = rng.choice(slot.questions)
            question = template.format(**pronouns)
            lead = rng.choice(LEAD_INS)
            if lead:
                question = lead + question[0].lower() + question[1:]
            answers = tuple(range(first, len(agent.memories)))
            check(question, [agent.memories[j] for j in answers])
            agent.questions.append((question, answers, slot.name))
        order = list(range(len(agent.memories)))
        rng.shuffle(order)  # the order of writing, so recency does not follow the generator
        position = {old: new for new, old in enumerate(order)}
        agent.memories = [agent.memories[i] for i in order]
        agent.questions = [
            (q, tuple(sorted(position[i] for i in ans)), s) for q, ans, s in agent.questions
        ]
        out.append(agent)
    return out


def check_pool() -> list[str]:
    """Every (question phrasing, lead-in, value) pair of the pool that shares a word: the
    problems :func:`generate` would raise for, found without sampling."""
    problems = []
    pronouns = {"subj": "she", "obj": "her", "poss": "her"}
    for slot in SLOTS:
        for template in slot.questions:
            for lead in LEAD_INS:
                question = lead + template.format(**pronouns)
                for value in slot.values:
                    for memory in value:
                        text = memory.format(who="Dana", her="her")
                        shared = shared_words(question, text)
                        if shared:
                            problems.append(f"{slot.name}: {question!r} / {text!r}: {shared}")
    return problems
