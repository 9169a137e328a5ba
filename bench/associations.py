"""The association part of the search quality set: chat-style questions whose answer is a fact
about the person that shares no content word with the question ("Can you suggest a snack for
my trip?" for "The user is allergic to peanuts.").

This is what a chat assistant asks its memory on the user's behalf: the user does not name the
fact, the fact bears on the request. Each person is one user of one agent (the agent's other
users are other people), with :data:`MIN_FACTS` to :data:`MAX_FACTS` memories written the way
the extractor writes them ("The user ..."): one value of each of their slots, drawn from the
pool below. Questions come in three kinds:

- ``association``: from templates, one slot's question asked of a person who has that slot
  (its answers: the slot's memories);
- ``association-hand``: written by hand for one value (:data:`HAND`: "Is satay sauce safe for
  me?" for the peanut allergy), placed with a person whose value that is;
- ``no-answer``: a question about a slot the person does not have, or one no memory can answer
  ("How many ounces are in a pound?"); measured for what an injected block adds to it.

Every labelled pair is checked with :func:`bench.paraphrases.check` (the same light stemmer and
stop words as the paraphrase part; :func:`generate` raises on a shared word), and the quality
bench checks them again with Postgres's ``english`` stemmer. :func:`check_pool` checks every
pairing of the pool, not just those a seed draws.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench import BenchError, paraphrases

MIN_FACTS = 20
MAX_FACTS = 50
#: Template questions and no-answer questions asked per person.
QUESTIONS_PER_PERSON = 5
NO_ANSWER_PER_PERSON = 2


@dataclass(frozen=True)
class Slot:
    name: str
    #: What the slot is, for the report only (nothing in the service reads it).
    topic: str
    values: tuple[tuple[str, ...], ...]  # per value, the memories that state it
    questions: tuple[str, ...]


# The memories say "The user", as the extractor writes them; the questions are what the user
# (first person) or an application speaking of them (third person) would ask.
SLOTS: tuple[Slot, ...] = (
    Slot(
        "allergy",
        "constraint",
        (
            ("The user is allergic to peanuts.",),
            ("The user is allergic to shellfish.",),
            ("The user has a severe tree nut allergy.",),
            ("The user is allergic to sesame.",),
        ),
        (
            "Can you suggest a snack for my trip?",
            "What should I bring to the potluck on Saturday?",
            "Any dessert ideas for tonight?",
            "Which appetizers could I order at the Thai place?",
            "Could you plan a picnic menu?",
        ),
    ),
    Slot(
        "diet",
        "constraint",
        (
            ("The user is vegetarian.",),
            ("The user eats a vegan diet.",),
            ("The user keeps halal.",),
            ("The user does not eat pork.",),
        ),
        (
            "What should I cook for dinner?",
            "Recommend a burger joint downtown.",
            "Plan my meals for the week.",
            "Suggest a barbecue menu for the weekend.",
        ),
    ),
    Slot(
        "intolerance",
        "constraint",
        (
            ("The user is lactose intolerant.",),
            ("The user has coeliac disease.",),
            ("The user cannot digest gluten.",),
        ),
        (
            "Which breakfast would you recommend?",
            "What pizza should I order?",
            "Could you suggest a café for brunch?",
        ),
    ),
    Slot(
        "mobility",
        "constraint",
        (
            ("The user uses a wheelchair.",),
            ("The user has a bad knee and cannot climb stairs.",),
            ("The user walks with crutches since a skiing accident.",),
        ),
        (
            "Can you plan a day out in the city for me?",
            "Which hiking trail would suit me?",
            "How should I get to the concert venue?",
            "Find a hotel for my weekend away.",
        ),
    ),
    Slot(
        "senses",
        "constraint",
        (
            ("The user is hard of hearing.",),
            ("The user is colour-blind.",),
            ("The user has poor eyesight and needs large print.",),
        ),
        (
            "What board game should we play tonight?",
            "How can I make my slides clearer?",
            "Which phone settings should I change?",
        ),
    ),
    Slot(
        "medical",
        "constraint",
        (
            ("The user has type 1 diabetes.",),
            ("The user has asthma.",),
            ("The user is pregnant.",),
            ("The user takes blood thinners.",),
        ),
        (
            "Is it okay if I go for a run this afternoon?",
            "What should I pack in my first aid kit?",
            "Can I have a glass of wine tonight?",
            "Plan a workout routine.",
        ),
    ),
    Slot(
        "alcohol",
        "constraint",
        (
            ("The user does not drink alcohol.",),
            ("The user is sober and avoids bars.",),
        ),
        (
            "Suggest a cocktail for my party.",
            "Where could we meet up on Friday night?",
        ),
    ),
    Slot(
        "name",
        "identity",
        (
            ("The user's name is Priya.",),
            ("The user's name is Tomasz.",),
            ("The user is called Ngozi.",),
            ("The user goes by Sam.",),
        ),
        (
            "How should you address me?",
            "How should I sign my letters?",
            "Who am I?",
        ),
    ),
    Slot(
        "age",
        "identity",
        (
            ("The user is 34 years old.",),
            ("The user turned sixty last spring.",),
            ("The user is a retiree in their seventies.",),
        ),
        (
            "Is it too late for me to learn surfing?",
            "What life insurance makes sense for me?",
        ),
    ),
    Slot(
        "job",
        "identity",
        (
            ("The user works as a nurse.",),
            ("The user is a software engineer.",),
            ("The user teaches maths at a secondary school.",),
            ("The user is a carpenter.",),
        ),
        (
            "Help me prepare for my shift tomorrow.",
            "How do I explain what I do to my kids?",
            "What should I put on my LinkedIn headline?",
            "Which professional conference should I attend?",
        ),
    ),
    Slot(
        "origin",
        "identity",
        (
            ("The user grew up in Nigeria.",),
            ("The user is originally from Poland.",),
            ("The user was raised in rural Ireland.",),
        ),
        (
            "What dishes remind me of my childhood?",
            "Where should I go to visit my roots?",
        ),
    ),
    Slot(
        "home",
        "home",
        (
            ("The user moved to Munich.",),
            ("The user settled in Lisbon.",),
            ("The user rents a flat in Leeds.",),
            ("The user has a house near Osaka.",),
        ),
        (
            "Where does she live?",
            "What's the weather like where I am?",
            "Find me a good dentist close by.",
            "Which time zone am I in?",
            "Any events in my town this weekend?",
        ),
    ),
    Slot(
        "partner",
        "people",
        (
            ("The user is married to Tom.",),
            ("The user's wife is called Anna.",),
            ("The user has a boyfriend named Luca.",),
            ("The user's husband is Kenji.",),
        ),
        (
            "Who should I take out for a romantic dinner?",
            "Help me plan an anniversary surprise.",
            "Is she seeing anyone?",
        ),
    ),
    Slot(
        "children",
        "people",
        (
            ("The user has a daughter named Mia who is six.",),
            ("The user has twin boys aged ten.",),
            ("The user's son Leo just started school.",),
        ),
        (
            "Plan a birthday party for my kid.",
            "What should we do during the summer holidays?",
            "Is he a parent?",
            "Recommend a family car.",
        ),
    ),
    Slot(
        "parents",
        "people",
        (
            ("The user's mother lives alone in Porto.",),
            ("The user's father has dementia.",),
            ("The user's parents are retired farmers.",),
        ),
        (
            "What should I get mum and dad for Christmas?",
            "How often should I call home?",
        ),
    ),
    Slot(
        "siblings",
        "people",
        (
            ("The user has two older brothers.",),
            ("The user's sister Ines is a doctor.",),
            ("The user is an only child.",),
        ),
        ("Who else did my parents raise?", "How big is my family?"),
    ),
    Slot(
        "pet",
        "people",
        (
            ("The user has a dog called Rex.",),
            ("The user adopted a cat named Mochi.",),
            ("The user keeps two rabbits.",),
        ),
        (
            "Who will need a sitter while I'm away?",
            "Should I book a pet-friendly cottage?",
            "What animal lives with me?",
        ),
    ),
    Slot(
        "friend",
        "people",
        (
            ("The user's best friend is Carla.",),
            ("The user often meets an old school friend called Dev.",),
        ),
        (
            "Who could I invite to the cinema?",
            "Which buddy should I ring this weekend?",
        ),
    ),
    Slot(
        "hobby",
        "other",
        (
            ("The user enjoys rock climbing.",),
            ("The user paints watercolours.",),
            ("The user plays chess online every evening.",),
            ("The user does woodworking in the garage.",),
        ),
        (
            "What could I do this weekend?",
            "Suggest a birthday present for me.",
            "What do I do in my spare time?",
        ),
    ),
    Slot(
        "music",
        "other",
        (
            ("The user plays the cello in an orchestra.",),
            ("The user loves jazz.",),
            ("The user sings in a choir.",),
        ),
        (
            "Which concert should I go to?",
            "Make me a mixtape for the drive.",
            "Is she musical?",
        ),
    ),
    Slot(
        "sport",
        "other",
        (
            ("The user supports Arsenal.",),
            ("The user follows the Chicago Bulls.",),
            ("The user never misses a Formula 1 race.",),
        ),
        (
            "Who won the match last night?",
            "Which team's game should I watch on Sunday?",
            "Get me some merchandise for my favourite club.",
        ),
    ),
    Slot(
        "fitness",
        "other",
        (
            ("The user swims laps three mornings a week.",),
            ("The user is training for a marathon.",),
            ("The user lifts weights at the gym.",),
        ),
        (
            "How do I stay in shape while travelling?",
            "What sport keeps me fit?",
        ),
    ),
    Slot(
        "food",
        "other",
        (
            ("The user adores spicy ramen.",),
            ("The user could eat sushi every day.",),
            ("The user loves Ethiopian injera.",),
        ),
        (
            "Which restaurant should I book for my birthday?",
            "What is my favourite meal?",
        ),
    ),
    Slot(
        "drink",
        "other",
        (
            ("The user drinks green tea.",),
            ("The user takes coffee black.",),
            ("The user starts every morning with an espresso.",),
        ),
        (
            "What hot beverage should I make for myself?",
            "What should I brew for her?",
        ),
    ),
    Slot(
        "trip",
        "other",
        (
            ("The user is flying to Reykjavik in August.",),
            ("The user booked a holiday in Crete for June.",),
            ("The user will visit Hanoi in October.",),
        ),
        (
            "What should I pack?",
            "Do I need a visa for my upcoming vacation?",
            "Which phrases should I learn before I go?",
        ),
    ),
    Slot(
        "car",
        "other",
        (
            ("The user drives an electric Volvo.",),
            ("The user rides a motorbike.",),
            ("The user does not own a car and cycles everywhere.",),
        ),
        (
            "How much will the road trip cost in fuel?",
            "How should I commute to the new office?",
            "What vehicle does she use?",
        ),
    ),
    Slot(
        "language",
        "other",
        (
            ("The user is learning Japanese.",),
            ("The user is taking Spanish lessons.",),
            ("The user practises German on Duolingo.",),
        ),
        (
            "Can you quiz me on some vocabulary?",
            "Which podcast would help my studies?",
        ),
    ),
    Slot(
        "study",
        "other",
        (
            ("The user has a PhD in chemistry.",),
            ("The user graduated in law from Edinburgh.",),
            ("The user is doing an evening MBA.",),
        ),
        (
            "What degree do I hold?",
            "Which university did she attend?",
        ),
    ),
    Slot(
        "work_project",
        "other",
        (
            ("The user is migrating the billing system to Kubernetes.",),
            ("The user is preparing a grant proposal due in May.",),
            ("The user leads the redesign of the company website.",),
        ),
        (
            "Help me write my status update.",
            "What am I working on at the office?",
        ),
    ),
    Slot(
        "schedule",
        "other",
        (
            ("The user works night shifts.",),
            ("The user gets up at 5 am.",),
            ("The user is a night owl who rarely sleeps before 2.",),
        ),
        (
            "When is a good time to call me?",
            "Is she an early riser?",
        ),
    ),
    Slot(
        "money",
        "other",
        (
            ("The user is saving for a house deposit.",),
            ("The user is paying off student loans.",),
            ("The user wants to retire early.",),
        ),
        (
            "Should I buy a new laptop this month?",
            "How should I invest my bonus?",
        ),
    ),
    Slot(
        "reading",
        "other",
        (
            ("The user reads a lot of crime fiction.",),
            ("The user collects first editions of Tolkien.",),
            ("The user loves science fiction novels.",),
        ),
        (
            "Which books would make a good present for me?",
            "Recommend something for my bedtime.",
        ),
    ),
    Slot(
        "screen",
        "other",
        (
            ("The user is binge-watching a Korean drama series.",),
            ("The user loves old Hitchcock films.",),
            ("The user watches every nature documentary.",),
        ),
        (
            "What should I stream tonight?",
            "Which cinema showing would I enjoy?",
        ),
    ),
    Slot(
        "garden",
        "other",
        (
            ("The user grows tomatoes on the balcony.",),
            ("The user tends a vegetable allotment.",),
            ("The user cultivates orchids indoors.",),
        ),
        (
            "What should I plant this spring?",
            "Does she have green fingers?",
        ),
    ),
    Slot(
        "phone",
        "other",
        (
            ("The user has an iPhone 13.",),
            ("The user switched to an Android handset.",),
            ("The user still uses an old flip phone.",),
        ),
        (
            "How do I take a screenshot?",
            "Which mobile does she carry?",
        ),
    ),
    Slot(
        "cooking",
        "other",
        (
            ("The user bakes sourdough every weekend.",),
            ("The user makes fresh pasta from scratch.",),
            ("The user took a course in Thai cooking.",),
        ),
        (
            "Is he good in the kitchen?",
            "What should I do with this leftover flour?",
        ),
    ),
    Slot(
        "volunteer",
        "other",
        (
            ("The user volunteers at a food bank.",),
            ("The user coaches a youth football team for free.",),
            ("The user helps at a homeless shelter on Sundays.",),
        ),
        (
            "Does she give time to any good causes?",
            "What charity work do I do?",
        ),
    ),
    Slot(
        "fear",
        "other",
        (
            ("The user is afraid of heights.",),
            ("The user panics around spiders.",),
            ("The user gets anxious in crowds.",),
        ),
        (
            "Would a hot air balloon ride be a nice surprise for me?",
            "What scares her?",
        ),
    ),
    Slot(
        "birthday",
        "other",
        (
            ("The user's birthday is on 3 March.",),
            ("The user turns forty in June.",),
            ("The user celebrates on the ninth of November.",),
        ),
        (
            "When should my friends throw the party?",
            "When was she born?",
        ),
    ),
    Slot(
        "appointment",
        "other",
        (
            ("The user has a dentist appointment on Thursday.",),
            ("The user has a job interview next Monday.",),
            ("The user sees a physiotherapist every Tuesday.",),
        ),
        (
            "What's on my calendar this week?",
            "Am I free for lunch on the coming days?",
        ),
    ),
    Slot(
        "clothes",
        "other",
        (
            ("The user wears size 42 shoes.",),
            ("The user only wears black.",),
            ("The user prefers linen shirts in summer.",),
        ),
        (
            "Buy me some sneakers.",
            "What outfit should I pick for the wedding?",
        ),
    ),
    Slot(
        "home_tech",
        "other",
        (
            ("The user set up solar panels on the roof.",),
            ("The user has a smart thermostat.",),
            ("The user runs a home server for backups.",),
        ),
        (
            "How can I lower my electricity bill?",
            "What gadgets are in her house?",
        ),
    ),
)

#: Written by hand for one value each: (slot, the memory, the question). Placed with a person
#: whose slot holds that memory (forced when drawing the person's slots).
HAND: tuple[tuple[str, str, str], ...] = (
    ("allergy", "The user is allergic to peanuts.", "Is satay sauce safe for me?"),
    ("allergy", "The user is allergic to shellfish.", "Can I try the paella at the beach bar?"),
    ("allergy", "The user is allergic to sesame.", "Should I order hummus as a starter?"),
    ("allergy", "The user has a severe tree nut allergy.", "Is pesto OK for me to eat?"),
    ("diet", "The user is vegetarian.", "Would a steakhouse be a good place to celebrate?"),
    ("diet", "The user eats a vegan diet.", "Can I have a cheese omelette for breakfast?"),
    ("diet", "The user does not eat pork.", "Are carbonara and bacon rolls fine for lunch?"),
    ("intolerance", "The user is lactose intolerant.", "Is a milkshake a good treat for me?"),
    ("intolerance", "The user has coeliac disease.", "Can I eat the bread at the bakery?"),
    ("mobility", "The user uses a wheelchair.", "Is the old castle tour a good outing for me?"),
    (
        "mobility",
        "The user has a bad knee and cannot climb stairs.",
        "Should I book the fifth-floor walk-up apartment?",
    ),
    ("medical", "The user has type 1 diabetes.", "How many cupcakes can I have at the party?"),
    ("medical", "The user is pregnant.", "Can I ride the roller coaster at the theme park?"),
    ("medical", "The user takes blood thinners.", "Is aspirin fine for my headache?"),
    ("medical", "The user has asthma.", "Can I go jogging when pollen counts are high?"),
    ("alcohol", "The user does not drink alcohol.", "Pick a wine to go with dinner."),
    ("senses", "The user is colour-blind.", "Which red and green shades suit my chart?"),
    ("senses", "The user is hard of hearing.", "Should I take this phone interview?"),
    ("home", "The user moved to Munich.", "Which city do I call home?"),
    ("home", "The user moved to Munich.", "Recommend a beer garden near me."),
    ("home", "The user settled in Lisbon.", "Where can I watch fado tonight?"),
    ("home", "The user rents a flat in Leeds.", "Which Yorkshire pubs are close by?"),
    ("home", "The user has a house near Osaka.", "Is it far to Kyoto from my place?"),
    ("partner", "The user's wife is called Anna.", "Who is my spouse?"),
    ("partner", "The user is married to Tom.", "Who is her husband?"),
    (
        "children",
        "The user has a daughter named Mia who is six.",
        "Which toys suit a first grader?",
    ),
    ("children", "The user has twin boys aged ten.", "Should I buy bunk beds?"),
    ("pet", "The user has a dog called Rex.", "How often should I walk him?"),
    ("pet", "The user adopted a cat named Mochi.", "Which litter box should I buy?"),
    ("pet", "The user keeps two rabbits.", "Where can I buy hay in bulk?"),
    ("job", "The user works as a nurse.", "How do I cope with long hospital hours?"),
    ("job", "The user is a software engineer.", "Should I learn Rust for my career?"),
    ("job", "The user teaches maths at a secondary school.", "How do I grade homework faster?"),
    ("hobby", "The user enjoys rock climbing.", "Which chalk bag should I get?"),
    ("hobby", "The user paints watercolours.", "Recommend some brushes and paper."),
    ("music", "The user plays the cello in an orchestra.", "Where should I buy rosin and strings?"),
    ("music", "The user loves jazz.", "Is Coltrane's album worth buying on vinyl?"),
    ("sport", "The user supports Arsenal.", "Did the Gunners win at the weekend?"),
    ("fitness", "The user is training for a marathon.", "How many miles should I run on Sunday?"),
    ("trip", "The user is flying to Reykjavik in August.", "Will I see the northern lights?"),
    ("trip", "The user will visit Hanoi in October.", "Is pho easy to find there?"),
    ("car", "The user drives an electric Volvo.", "Where is the nearest charging point?"),
    ("language", "The user is learning Japanese.", "How do I practise kanji?"),
    ("drink", "The user takes coffee black.", "Should I order a latte for her?"),
    ("money", "The user is saving for a house deposit.", "Should I splurge on a cruise?"),
    ("fear", "The user is afraid of heights.", "Should we go up the Eiffel Tower?"),
    ("fear", "The user panics around spiders.", "Would a trip to the reptile house be fun?"),
    ("garden", "The user grows tomatoes on the balcony.", "Why are my plants getting blight?"),
    ("phone", "The user has an iPhone 13.", "How do I turn on AirDrop?"),
    ("schedule", "The user works night shifts.", "When should I sleep during the day?"),
)

#: Questions that no memory of the pool answers (general knowledge, small tasks).
UNANSWERABLE = (
    "How many ounces are in a pound?",
    "Translate 'good morning' into French.",
    "What is the capital of Australia?",
    "Write a haiku about autumn leaves.",
    "How do I reverse a list in Python?",
    "What year did the Berlin Wall fall?",
    "Explain how compound interest works.",
    "Give me a synonym for happy.",
    "What is the boiling point of water in Fahrenheit?",
    "Summarise the plot of Hamlet.",
    "How far is the moon from the earth?",
    "Tell me a joke about penguins.",
)

#: Names of the people (their user keys, and nothing else: the memories say "The user").
_PEOPLE = """
elena kwame priya tomasz ingrid mireille joaquin siobhan haruto olufemi zofia anders leilani
dmitri ngozi rafferty esperanza takumi fionnuala svetlana chidi marguerite ravindra oksana
thaddeus yevgenia bartholomew xiomara giedre alejandro
"""
PEOPLE = tuple(_PEOPLE.split())


@dataclass
class Person:
    key: str
    memories: list[str] = field(default_factory=list)
    #: (kind, question, indexes of the memories that answer it (empty: none), slot)
    questions: list[tuple[str, str, tuple[int, ...], str]] = field(default_factory=list)


def _by_name() -> dict[str, Slot]:
    return {slot.name: slot for slot in SLOTS}


def generate(people: int, seed: int) -> list[Person]:
    """``people`` people with their memories and questions, from ``seed``; raises
    :class:`BenchError` for a labelled question that shares a word with an answer."""
    if people < 1:
        return []
    rng = random.Random(seed * 104729 + 3)
    slots = _by_name()
    # The hand-written pairs, dealt out round-robin: person i gets HAND[j] for j = i mod n.
    hand: list[list[tuple[str, str, str]]] = [[] for _ in range(people)]
    for j, item in enumerate(HAND):
        hand[j % people].append(item)
    out = []
    for p in range(people):
        person = Person(key=PEOPLE[p % len(PEOPLE)] + ("" if p < len(PEOPLE) else f"-{p}"))
        forced: dict[str, str] = {}
        mine = []
        for name, memory, question in hand[p]:
            # Two hand-written values of one slot for one person: the first only.
            if forced.setdefault(name, memory) == memory:
                mine.append((name, memory, question))
        facts = rng.randint(MIN_FACTS, MAX_FACTS)
        chosen = [slots[name] for name in forced]
        rest = [s for s in SLOTS if s.name not in forced]
        rng.shuffle(rest)
        where: dict[str, tuple[int, ...]] = {}
        for slot in chosen + rest:
            if len(person.memories) >= facts:
                break
            if slot.name in forced:
                value = next(v for v in slot.values if forced[slot.name] in v)
            else:
                value = rng.choice(slot.values)
            if len(person.memories) + len(value) > facts and slot.name not in forced:
                continue
            first = len(person.memories)
            person.memories.extend(value)
            where[slot.name] = tuple(range(first, len(person.memories)))
        # Filler facts beyond the pool's slots, so that a person may hold up to MAX_FACTS:
        # numbered everyday notes that answer none of the questions.
        fillers = rng.sample(FILLERS, len(FILLERS))
        while len(person.memories) < facts and fillers:
            person.memories.append(fillers.pop())
        asked = [name for name in where if name not in forced]
        for name in rng.sample(asked, min(QUESTIONS_PER_PERSON, len(asked))):
            question = rng.choice(slots[name].questions)
            _label(person, "association", question, where[name], name)
        for name, _, question in mine:
            _label(person, "association-hand", question, where[name], name)
        missing = [s for s in SLOTS if s.name not in where]
        for slot in rng.sample(missing, min(NO_ANSWER_PER_PERSON - 1, len(missing))):
            person.questions.append(("no-answer", rng.choice(slot.questions), (), slot.name))
        person.questions.append(("no-answer", rng.choice(UNANSWERABLE), (), "none"))
        order = list(range(len(person.memories)))
        rng.shuffle(order)  # the order of writing, so recency does not follow the generator
        position = {old: new for new, old in enumerate(order)}
        person.memories = [person.memories[i] for i in order]
        person.questions = [
            (k, q, tuple(sorted(position[i] for i in ans)), s) for k, q, ans, s in person.questions
        ]
        out.append(person)
    return out


def _label(person: Person, kind: str, question: str, answers: tuple[int, ...], slot: str) -> None:
    paraphrases.check(question, [person.memories[i] for i in answers])
    person.questions.append((kind, question, answers, slot))


#: Everyday notes that fill a person's list up to its size once the pool's slots run out:
#: true of nobody in particular and answering none of the questions.
FILLERS = (
    "The user prefers window seats on flights.",
    "The user keeps a paper diary.",
    "The user uses a standing desk.",
    "The user's favourite colour is green.",
    "The user likes to keep receipts in a shoebox.",
    "The user switched broadband providers last year.",
    "The user writes with a fountain pen.",
    "The user collects postcards.",
    "The user prefers email to phone calls.",
    "The user's laptop runs Linux.",
)


def check_pool() -> list[str]:
    """Every (question, value) pairing of the pool, and every hand-written pair, that shares a
    word: the problems :func:`generate` would raise for, found without sampling."""
    problems = []
    for slot in SLOTS:
        for question in slot.questions:
            for value in slot.values:
                for memory in value:
                    shared = paraphrases.shared_words(question, memory)
                    if shared:
                        problems.append(f"{slot.name}: {question!r} / {memory!r}: {shared}")
    slots = _by_name()
    for name, memory, question in HAND:
        if name not in slots or not any(memory in v for v in slots[name].values):
            problems.append(f"hand-written {question!r}: {memory!r} is not a value of {name}")
            continue
        shared = paraphrases.shared_words(question, memory)
        if shared:
            problems.append(f"hand-written {question!r} / {memory!r}: {shared}")
    return problems


def check_generated(people: list[Person]) -> None:
    """Raise :class:`BenchError` when a labelled question shares a word with an answer."""
    for person in people:
        for kind, question, answers, _ in person.questions:
            if kind != "no-answer":
                paraphrases.check(question, [person.memories[i] for i in answers])
    if any(not p.questions for p in people):
        raise BenchError("a person without questions")
