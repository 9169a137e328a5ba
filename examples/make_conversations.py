"""Writes ``examples/conversations.jsonl``: the sample sessions ``ibex demo`` imports.

Three orgs, five agents, 38 sessions of 2 to 6 turns: people introducing themselves, stating
allergies, likes and dislikes, where they live and work, plans, pets and things to remember,
mixed with small talk and questions that hold nothing worth remembering. Each session is one
person's (``user``: the application's key for them, e.g. ``dana``), so their memories are
theirs alone. A few sessions are still active or were abandoned, so they are not extracted.
The last two are one user's, who moves and changes jobs between them (facts that change).
Deterministic: running it again writes the same file.

    python examples/make_conversations.py > examples/conversations.jsonl
"""

from __future__ import annotations

import json
import random
import sys

PEOPLE = [
    ("Dana", "peanuts", "Lisbon", "hiking", "a nurse", "Pixel", "dog"),
    ("Marco", "shellfish", "Turin", "jazz", "an architect", "Olive", "cat"),
    ("Aiko", "penicillin", "Osaka", "green tea", "a data scientist", "Mochi", "cat"),
    ("Samir", "gluten", "Casablanca", "chess", "a teacher", "Atlas", "dog"),
    ("Lena", "cats", "Berlin", "techno", "a software engineer", "Rex", "dog"),
    ("Tomás", "bee stings", "Valparaíso", "surfing", "a marine biologist", "Nube", "cat"),
    ("Priya", "lactose", "Pune", "cricket", "a pharmacist", "Bolt", "dog"),
    ("Jonas", "pollen", "Oslo", "cross-country skiing", "a carpenter", "Frost", "dog"),
    ("Grace", "eggs", "Dublin", "crime novels", "a solicitor", "Biscuit", "dog"),
    ("Yusuf", "sesame", "Istanbul", "photography", "a pilot", "Pamuk", "cat"),
    ("Elena", "latex", "Madrid", "flamenco", "a dentist", "Luna", "cat"),
    ("Kwame", "soy", "Accra", "football", "an accountant", "Kofi", "dog"),
]

DISLIKES = ["cilantro", "loud restaurants", "early meetings", "horror films", "olives", "rain"]
PLANS = [
    "I'm going to Japan next month",
    "I plan to run a marathon in the spring",
    "I'm moving to a new flat in March",
    "I have a job interview on Friday",
    "I'm going to visit my parents next weekend",
    "I plan to learn Portuguese this year",
]
REMEMBER = [
    "remember that I prefer email over phone calls",
    "remember that my flight number is TP 1337",
    "remember that I take my coffee black",
    "remember that I'm vegetarian",
    "remember that my daughter's name is Ines",
    "remember that I work night shifts",
]
SMALL_TALK = [
    ("What's the weather like today?", "I can't check live weather, but I can help you plan."),
    ("Can you summarise our conversation?", "Sure: we talked about your plans and preferences."),
    ("Thanks, that's all for now.", "You're welcome! Talk soon."),
    ("How do I reset my password?", "Go to Settings, then Security, then Reset password."),
    ("Is the store open on Sundays?", "Yes, from 10:00 to 16:00."),
]

ORGS = {
    "acme": ["support-bot", "travel-agent"],
    "globex": ["health-assistant", "concierge"],
    "initech": ["hr-helper"],
}


def _reply(rng: random.Random, name: str) -> str:
    return rng.choice(
        [
            f"Noted, {name}!",
            f"Thanks for telling me, {name}.",
            "Got it, I'll keep that in mind.",
            "Understood.",
            f"Great to know, {name}.",
        ]
    )


def _turn(rng: random.Random, user: str, reply: str) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": user},
        ],
        "completion": {"role": "assistant", "content": reply},
        "prompt_tokens": 20 + len(user) // 4,
        "completion_tokens": 4 + len(reply) // 4,
        "latency_ms": rng.randint(300, 1500),
    }


def session(rng: random.Random, number: int, org: str, agent: str) -> dict:
    name, allergy, city, likes, job, pet, species = PEOPLE[number % len(PEOPLE)]
    statements = [
        f"I'm allergic to {allergy}.",
        f"I live in {city}.",
        f"I love {likes}.",
        f"I don't like {rng.choice(DISLIKES)}.",
        f"I am {job}.",
        f"I have a {species} named {pet}.",
        rng.choice(PLANS) + ".",
        rng.choice(REMEMBER).capitalize() + ".",
    ]
    rng.shuffle(statements)
    turns = [_turn(rng, f"Hi, I'm {name}. {statements.pop(0)}", _reply(rng, name))]
    for _ in range(rng.randint(1, 5)):
        if statements and rng.random() < 0.75:
            text = statements.pop(0)
            if statements and rng.random() < 0.4:
                text += " " + statements.pop(0)
            turns.append(_turn(rng, text, _reply(rng, name)))
        else:
            question, answer = rng.choice(SMALL_TALK)
            turns.append(_turn(rng, question, answer))
    status = "completed"
    if number % 17 == 5:
        status = "active"
    elif number % 19 == 7:
        status = "abandoned"
    return {
        "org": org,
        "agent": agent,
        "session": f"demo-{number:03d}",
        "user": name.lower(),
        "status": status,
        "model": rng.choice(["gpt-4o-mini", "llama-3.1-8b-instruct", "qwen2.5-7b"]),
        "provider": rng.choice(["openai", "vllm", "ollama"]),
        "turns": turns,
    }


def moved(rng: random.Random) -> list[dict]:
    """Two sessions of one user of initech/hr-helper, weeks apart: where she lives and works,
    then a move and a new job. The second session's memories supersede the first's (the
    rules extractor sees them listed as related memories), unless the workers happen to
    extract the second session first."""
    said = [
        ["Hi, I'm Ingrid. I live in Bergen.", "I work at Fjord Shipping."],
        ["Good news, I moved to Oslo!", "And I started a new job at Nordlys Energy."],
    ]
    return [
        {
            "org": "initech",
            "agent": "hr-helper",
            "session": f"demo-{36 + n:03d}",
            "user": "ingrid",
            "status": "completed",
            "model": "gpt-4o-mini",
            "provider": "openai",
            "turns": [_turn(rng, text, _reply(rng, "Ingrid")) for text in texts],
        }
        for n, texts in enumerate(said)
    ]


def main() -> None:
    rng = random.Random(42)
    pairs = [(org, agent) for org, agents in ORGS.items() for agent in agents]
    for number in range(36):
        org, agent = pairs[number % len(pairs)]
        sys.stdout.write(json.dumps(session(rng, number, org, agent), ensure_ascii=False) + "\n")
    for line in moved(rng):
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
