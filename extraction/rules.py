"""Deterministic offline extraction of first-person statements (``LLM_PROVIDER=rules``).

What it reads: the text of the turn's *new* user messages, i.e. the ``user`` messages after the
last ``assistant`` message of ``turn.messages`` (a harness usually sends the whole history with
every call, and the earlier user messages belong to earlier turns, which are extracted on their
own). Never the assistant's completion, never context turns.

How: the text is split into sentences (questions are dropped) and the sentences into clauses at
", and I ...", "but my name ...", and the like. Each clause has greeting fillers ("Hi,", "By the
way,") removed and is then matched, anchored at its start, against the patterns below, first
match wins. Anchoring is what keeps "Do you think I'm allergic?" or "If I lived in Rome" out,
and negations ("I'm not allergic to ...", "I don't live in ...") simply do not match.

- name: "my name is Dana", "call me Dana", "I'm Dana" (a capitalized word) → fact
- allergies and diet: "I'm allergic to peanuts", "I have a peanut allergy", "I'm vegan" → fact
- preferences: "I love/like/enjoy/prefer/adore X", "I hate/dislike/can't stand/don't like X",
  "my favorite X is Y", "I'm a big fan of X" → preference
- places: "I live in X", "I'm from X", "I work at/for/in X", "I moved to X" → fact
- plans and events: "I'm going to X", "I plan to X", "I'm traveling to X", "my birthday is X",
  "I have a X on DATE" → event
- "remember that X": the patterns applied to X (keeping their kind: "remember that I love tea"
  is a preference), else X itself in the third person → fact
- roles and life: "I'm a nurse", "I work as a nurse", "I'm 34 years old", "I have a dog named
  Rex", "I have two kids" → fact
- diets: "I don't eat meat", "I never eat pork", "I can't eat gluten", "I avoid dairy", "I'm on
  a keto diet", "I follow a vegan diet", "I eat vegan" → fact
- family members: "my <relative> [Name] ..." (daughter, son, wife, husband, mom, dad, sister,
  grandma, ...) followed by "is allergic to X", "is a nurse", "is vegetarian", "is 7", "is
  named X", "is from X", "lives in X", "works at X", "doesn't eat X", "has X" → fact, or
  "loves/likes/enjoys/prefers/hates X" → preference; and "my daughter's name is Sofia" → fact.
  Negated or dated statements about a relative ("my son isn't ...", "my wife is in Rome this
  week") are left out.

- facts that change (the section at the end): "I started a new job at X" → fact; with the
  prompt's related memories, a memory that changes one of them ("I moved to Oslo" against
  "The user lives in Lisbon.") names it in ``replaces``, when the turn says that something
  changed (:func:`mark_replaces`).

Memories are third-person sentences about "the user" built from the user's own words (with
"my" → "their" and the like), trailing punctuation removed and one final period. Same input,
same output, same order; exact duplicates are dropped.

Over 400 lines but one idea: one offline extractor, whose patterns share the clause splitting,
the word lists and the third-person rewriting they are tuned against.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from extraction.result import ExtractedMemory, dedupe
from schema.recall import strip_recalled
from sessions.turns import TurnRecord

#: Recorded as the "model" of a rules result; bump when the wording of memories changes.
RULES_MODEL = "rules-v3"

#: A clause longer than this is prose, not a statement worth a memory.
MAX_CLAUSE_CHARS = 300


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_ABBREVIATIONS = ("mr", "mrs", "ms", "dr", "st", "mt", "jr", "sr", "vs", "prof", "e.g", "i.e")

# Sentence ends: terminators followed by whitespace or the end, and line breaks.
_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+(?=\s|$)|[.!?]+(?=[\"')\]]))?|[.!?]+", re.S)

# First-person openings that start a new statement after a comma or a conjunction.
_FIRST_PERSON = (
    r"(?:i|i'm|im|i've|i'd|i'll|call me|please remember|remember|don't forget|do not forget"
    r"|my (?:name|favou?rite|birthday|anniversary|wedding|dog|cat|pet|\w+'s name)\b)"
)
_CLAUSE_SPLIT = re.compile(
    r"\s*[,;]\s*(?:(?:and|but|so|also|plus|though)\s+)?(?=" + _FIRST_PERSON + r"\b)"
    r"|\s+(?:and|but|so|plus|also|because|though|although|while|whereas)\s+(?="
    + _FIRST_PERSON
    + r"\b)"
    r"|\s+-+\s+|\s*[\u2013\u2014]\s*",
    re.I,
)

_FILLER = re.compile(
    r"^(?:(?:hi|hello|hey|hiya|howdy|there|well|oh|ok|okay|so|also|and|but|btw|by the way"
    r"|actually|yes|yeah|yep|no|nope|fyi|just so you know|just fyi|for the record|honestly"
    r"|anyway|anyways|um|uh|ah|alright|plus|good morning|good afternoon|good evening"
    r"|thanks|thank you|cool|great|sure|oh and|oh also|also,? note)(?:\s*[,!:;-]+\s*|\s+))+",
    re.I,
)

_I_AM = r"(?:i'm|im|i am|i'am)"
_ADVERBS = (
    r"(?:(?:really|truly|absolutely|totally|just|also|still|actually|definitely|genuinely"
    r"|honestly|usually|always|generally|kind of|kinda|sort of|very|so|quite|especially"
    r"|personally|do|currently|now|originally)\s+)*"
)
_TRAILING_FILLER = re.compile(
    r"(?:[\s,]+(?:too|as well|lol|haha|hehe|though|btw|by the way|a lot|so much|very much"
    r"|anyway|right|you know|thanks|thank you|please|lmao|:\)|:-\)|:d))+$",
    re.I,
)
_TRAILING_PUNCT = re.compile(r"[\s.,;:!?…\"'`)\]]+$")

# Words that are not a name after "I'm" even when capitalized ("I'm Sorry", "I'm Happy").
_NOT_NAMES = _words(
    """
    a an the not so very really just also still here there back done ready sure fine good
    great ok okay well sorry glad happy sad excited tired hungry thirsty sick ill busy bored
    curious confused lost new old young free available afraid scared worried nervous stuck
    certain positive interested late early home away out in on at with from into about over
    going trying looking working thinking using planning hoping wondering getting doing
    having making coming leaving moving feeling starting learning taking writing reading
    your yours his her their its this that these those all both each one two three
    finally literally currently only even always never almost pretty kind sort totally
    afraid alone alive awake aware ashamed allergic vegan vegetarian married single divorced
    pregnant retired unemployed employed right wrong correct serious kidding joking
    later anytime tomorrow tonight now soon maybe whenever when if asap whatever anything
    my me i im and or but because please thanks
    """
)

# Demonyms, faiths and diets: "I'm French" is a fact, not the user's name.
_IDENTITY = _words(
    """
    american british english scottish welsh irish canadian mexican brazilian argentinian
    chilean colombian peruvian cuban french german dutch belgian swiss austrian italian
    spanish portuguese greek turkish polish czech slovak hungarian romanian bulgarian
    ukrainian russian swedish norwegian danish finnish icelandic estonian latvian lithuanian
    serbian croatian bosnian slovenian albanian israeli palestinian lebanese syrian iraqi
    iranian persian egyptian moroccan algerian tunisian nigerian ghanaian kenyan ethiopian
    somali south african indian pakistani bangladeshi sri lankan nepali chinese japanese
    korean vietnamese thai filipino indonesian malaysian singaporean australian kiwi
    catholic protestant christian jewish muslim hindu buddhist sikh atheist agnostic mormon
    vegan vegetarian pescatarian diabetic celiac coeliac kosher halal left-handed
    right-handed deaf blind colorblind colourblind autistic dyslexic
    """
)
_DIET_PHRASES = ("gluten-free", "gluten free", "lactose intolerant", "dairy-free", "dairy free")

_ROLE_STOP = _words(
    """
    bit little lot tad few couple while moment second minute question hurry rush mess loss
    position situation problem fan favor favour mood good great huge big real total
    complete sucker
    """
)

_OBJECT_STOP = re.compile(
    r"^(?:it|that|this|them|you|those|these|him|her|yours|everything|anything|nothing"
    r"|something|so|too|very|much|what|how|when|if|your\b.*|this\b.*|that\b.*|it\b.*"
    r"|you\b.*|the idea\b.*|the way you\b.*)$",
    re.I,
)
# "I'm going to ask you ..." is about this conversation, not the user's life.
_CONVERSATIONAL = re.compile(
    r"^(?:ask|tell|say|try|need|check|explain|repeat|rephrase|paste|share|send|show|give"
    r"|be honest|be brief|start over|go|have to ask|copy|upload|read|write you|type|test"
    r"|use you|quote)\b|\byou\b|\byour\b",
    re.I,
)

_PETS = (
    r"(?:dog|cat|puppy|kitten|bird|parrot|hamster|rabbit|bunny|guinea pig|turtle|tortoise"
    r"|fish|goldfish|horse|pony|snake|lizard|ferret|pet|cockatiel|budgie|gecko)"
)
_FAMILY = (
    r"(?:son|daughter|kid|child|baby|brother|sister|sibling|husband|wife|partner|boyfriend"
    r"|girlfriend|fiance|fiancé|fiancee|fiancée|twin|stepson|stepdaughter|grandchild"
    r"|grandson|granddaughter|nephew|niece)"
)
_COUNT = r"(?:a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d{1,2})"
_TIME_NOUN = (
    r"(?:week|weekend|month|year|morning|afternoon|evening|night|summer|winter|spring|fall"
    r"|autumn|semester|term|monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
)
_DATE_WORDS = re.compile(
    r"\b(?:tomorrow|tonight|today|(?:this|next|last)\s+" + _TIME_NOUN + r"|later this"
    r"|in (?:\d+|a|an|one|two|three|a few|a couple of) (?:days?|weeks?|months?|years?)"
    r"|at \d{1,2}(?::\d\d)?\s*(?:am|pm)?|on the \d{1,2}(?:st|nd|rd|th)?"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday|january|february|march|april"
    r"|may|june|july|august|september|october|november|december|weekend"
    r"|\d{1,2}(?:st|nd|rd|th)|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?)\b",
    re.I,
)

_NAME_WORD = r"[^\W\d_](?:[^\W\d_]|['\-](?=[^\W\d_]))*"

# Pronoun rewrites for words quoted from the user, longest first.
_THIRD_PERSON = [
    (re.compile(r"\bi'm\b|\bi am\b|\bim\b", re.I), "they're"),
    (re.compile(r"\bi've\b", re.I), "they've"),
    (re.compile(r"\bi'd\b", re.I), "they'd"),
    (re.compile(r"\bi'll\b", re.I), "they'll"),
    (re.compile(r"\bi was\b", re.I), "they were"),
    (re.compile(r"\bmyself\b", re.I), "themselves"),
    (re.compile(r"\bmine\b", re.I), "theirs"),
    (re.compile(r"\bmy\b", re.I), "their"),
    (re.compile(r"\bme\b", re.I), "them"),
    (re.compile(r"\bours\b", re.I), "theirs"),
    (re.compile(r"\bour\b", re.I), "their"),
    (re.compile(r"\bwe're\b", re.I), "they're"),
    (re.compile(r"\bwe\b", re.I), "they"),
    (re.compile(r"\bus\b"), "them"),  # lower-case only: "the US" stays
    (re.compile(r"\bi\b", re.I), "they"),
]
# For "remember that X" when X is not about the user as a subject: "Dana is my sister".
_POSSESSIVE_USER = [
    (re.compile(r"\bmy\b", re.I), "the user's"),
    (re.compile(r"\bmine\b", re.I), "the user's"),
    (re.compile(r"\bmyself\b", re.I), "the user"),
    (re.compile(r"\bme\b", re.I), "the user"),
    (re.compile(r"\bi\b", re.I), "the user"),
]

_IRREGULAR = {"have": "has", "be": "is", "am": "is", "do": "does", "go": "goes", "can": "can"}
_MODALS = _words(
    "can could will would shall should may might must don't doesn't didn't can't won't"
    " wouldn't shouldn't never always usually often also just still really only"
    " sometimes rarely definitely"
)


# -- text helpers ---------------------------------------------------------------------------


def message_text(message: Any) -> str:
    """The text of one chat message: a string, or the text parts of a list of parts."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "\n".join(parts)
    return ""


def new_user_texts(turn: TurnRecord) -> list[str]:
    """The text of the user messages after the last assistant message of the turn, without
    recalled-memories blocks."""
    messages = turn.messages if isinstance(turn.messages, list) else []
    last_assistant = -1
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            last_assistant = i
    # Recalled <memories> blocks (our own context fed back) are never extracted again.
    return [
        strip_recalled(message_text(m))
        for m in messages[last_assistant + 1 :]
        if isinstance(m, dict) and m.get("role") == "user"
    ]


def _normalize(text: str) -> str:
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("`", "'")
    text = text.replace("\u201c", '"').replace("\u201d", '"')
    return re.sub(r"[ \t\r\f\v]+", " ", text)


def sentences(text: str) -> Iterator[str]:
    """Sentences of ``text`` with their terminators; abbreviations do not end a sentence."""
    pending = ""
    for match in _SENTENCE.finditer(_normalize(text)):
        piece = match.group(0)
        pending = f"{pending} {piece.strip()}" if pending else piece.strip()
        last_word = re.search(r"([A-Za-z.]+)\.$", pending)
        if last_word and last_word.group(1).lower().rstrip(".") in _ABBREVIATIONS:
            continue
        if pending:
            yield pending
        pending = ""
    if pending:
        yield pending


def clauses(sentence: str) -> list[str]:
    parts = _CLAUSE_SPLIT.split(sentence)
    return [p.strip() for p in parts if p and p.strip()]


def strip_filler(clause: str) -> str:
    previous = None
    while previous != clause:
        previous = clause
        clause = _FILLER.sub("", clause).strip()
    return clause


def clean_object(text: str) -> str:
    """Words quoted from the user: trailing fillers and punctuation removed."""
    previous = None
    text = text.strip()
    while previous != text:
        previous = text
        text = _TRAILING_PUNCT.sub("", text)
        text = _TRAILING_FILLER.sub("", text)
        text = text.strip()
    return re.sub(r"\s+", " ", text)


def third_person(text: str) -> str:
    """``text`` with the user's first-person pronouns turned into "they/their/them"."""
    for pattern, replacement in _THIRD_PERSON:
        text = pattern.sub(replacement, text)
    return text


def _user_as_object(text: str) -> str:
    for pattern, replacement in _POSSESSIVE_USER:
        text = pattern.sub(replacement, text)
    return text


def conjugate(verb: str) -> str:
    """Third person singular of a present-tense verb: like → likes, go → goes, try → tries."""
    lower = verb.lower()
    if lower in _IRREGULAR:
        return _IRREGULAR[lower]
    if lower in _MODALS or not lower.isalpha():
        return verb
    if re.search(r"(?:s|sh|ch|x|z|o)$", lower):
        return verb + "es"
    if re.search(r"[^aeiou]y$", lower):
        return verb[:-1] + "ies"
    return verb + "s"


def sentence(text: str) -> str:
    """One sentence: first letter upper-case, one final period."""
    text = clean_object(text)
    return text[:1].upper() + text[1:] + "."


def format_name(raw: str) -> str:
    words = raw.split()
    out = []
    for word in words:
        if word.islower() or (word.isupper() and len(word) > 1):
            word = "-".join(p[:1].upper() + p[1:].lower() for p in word.split("-"))
        out.append(word)
    return " ".join(out)


# -- patterns ---------------------------------------------------------------------------------

Memory = tuple[str, str]  # (content, kind)
Rule = Callable[[str], list[Memory]]


def _obj(text: str) -> str | None:
    """A usable object phrase, in the third person, or None."""
    cleaned = clean_object(text)
    if not cleaned or len(cleaned) > MAX_CLAUSE_CHARS or _OBJECT_STOP.match(cleaned):
        return None
    return third_person(cleaned)


_NAME_AT = re.compile(_NAME_WORD)
_NEXT_NAME_WORD = re.compile(r"\s+(" + _NAME_WORD + r")")


def _name_from(words: str, *, require_capital: bool) -> tuple[str, str] | None:
    """The name at the start of ``words`` and what follows it: the first word, then up to two
    more capitalized words ("Dana Scully"). None when the first word cannot be a name."""
    match = _NAME_AT.match(words)
    if not match:
        return None
    first = match.group(0)
    if first.lower() in _NOT_NAMES or len(first) < 2:
        return None
    if require_capital and not first[0].isupper():
        return None
    name = [first]
    pos = match.end()
    while len(name) < 3:
        more = _NEXT_NAME_WORD.match(words, pos)
        if not more:
            break
        word = more.group(1)
        if not word[0].isupper() or word.lower() in _NOT_NAMES:
            break
        name.append(word)
        pos = more.end()
    return format_name(" ".join(name)), words[pos:].strip()


def _rule_name(clause: str) -> list[Memory]:
    match = re.match(
        r"^(?:my name is|my name's|my first name is|the name's|call me|you can call me"
        r"|please call me|everyone calls me|people call me)\s+(?P<rest>.+)$",
        clause,
        re.I,
    )
    if match:
        found = _name_from(match.group("rest"), require_capital=False)
        return [(f"The user's name is {found[0]}.", "fact")] if found else []
    match = re.match(r"^" + _I_AM + r"\s+(?P<rest>.+)$", clause, re.I)
    if not match:
        return []
    found = _name_from(match.group("rest"), require_capital=True)
    if not found or found[0].lower() in _IDENTITY:
        return []
    name, after = found
    out: list[Memory] = [(f"The user's name is {name}.", "fact")]
    if not after or re.match(r"^(?:here|by the way|btw)\b", after, re.I):
        return out
    from_place = re.match(r"^,?\s*(?:and\s+)?(?:i'm\s+|i am\s+)?from\s+(?P<x>.+)$", after, re.I)
    if from_place and (place := _obj(from_place.group("x"))):
        out.append((f"The user is from {place}.", "fact"))
        return out
    return out if after.startswith(",") else []


def _rule_allergy(clause: str) -> list[Memory]:
    match = re.match(
        r"^(?:"
        + _I_AM
        + r"|i've been|i have been)\s+"
        + _ADVERBS
        + r"(?:(?:severely|deathly|highly|mildly|slightly|extremely|super|a bit|a little)\s+)?"
        r"allergic to\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match and (x := _obj(match.group("x"))):
        return [(f"The user is allergic to {x}.", "fact")]
    match = re.match(
        r"^(?:i have|i've got|i got)\s+(?:an?\s+)?(?:(?:severe|serious|mild|bad|deadly)\s+)?"
        r"(?:(?P<what>[\w\s-]+?)\s+allergy|allergy to\s+(?P<x>.+)|(?P<x2>[\w\s-]+?)\s+allergies)$",
        clause,
        re.I,
    )
    if match:
        if match.group("x") and (x := _obj(match.group("x"))):
            return [(f"The user is allergic to {x}.", "fact")]
        what = match.group("what") or match.group("x2")
        if what and (w := _obj(what)):
            return [(f"The user has a {w} allergy.", "fact")]
    match = re.match(r"^" + _I_AM + r"\s+" + _ADVERBS + r"(?:a\s+)?(?P<x>[\w\s-]+)$", clause, re.I)
    if match:
        x = clean_object(match.group("x"))
        lower = x.lower()
        words = lower.split()
        if lower in _DIET_PHRASES or (len(words) in (1, 2) and all(w in _IDENTITY for w in words)):
            return [(f"The user is {x}.", "fact")]
    return []


_LIKE_VERBS = {
    "love": "loves",
    "like": "likes",
    "enjoy": "enjoys",
    "prefer": "prefers",
    "adore": "adores",
    "hate": "hates",
    "dislike": "dislikes",
    "detest": "detests",
    "despise": "despises",
    "loathe": "loathes",
}


def _rule_preference(clause: str) -> list[Memory]:
    match = re.match(
        r"^i\s+" + _ADVERBS + r"(?P<verb>love|like|enjoy|prefer|adore|hate|dislike|detest"
        r"|despise|loathe)\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match and (x := _obj(match.group("x"))):
        return [(f"The user {_LIKE_VERBS[match.group('verb').lower()]} {x}.", "preference")]
    match = re.match(
        r"^i\s+" + _ADVERBS + r"(?:don't|do not|dont|can't|cannot|can not|really don't)\s+"
        r"(?:really\s+)?(?P<verb>like|enjoy|stand|bear|care for)\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match and (x := _obj(match.group("x"))):
        verb = match.group("verb").lower()
        if verb in ("stand", "bear"):
            return [(f"The user can't stand {x}.", "preference")]
        return [(f"The user dislikes {x}.", "preference")]
    match = re.match(
        r"^my\s+(?:(?:all-time|all time|absolute|very)\s+)?favou?rite\s+(?P<what>[\w\s'-]+?)"
        r"\s+(?P<verb>is|are|was|has to be|would be)\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match and (x := _obj(match.group("x"))):
        what = third_person(clean_object(match.group("what")))
        return [(f"The user's favorite {what} {match.group('verb').lower()} {x}.", "preference")]
    match = re.match(
        r"^" + _I_AM + r"\s+" + _ADVERBS + r"(?:an?\s+)?(?P<size>(?:big|huge|massive|great"
        r"|real|total)\s+)?fan of\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match and (x := _obj(match.group("x"))):
        size = (match.group("size") or "").strip().lower()
        return [(f"The user is {'a ' + size if size else 'a'} fan of {x}.", "preference")]
    return []


def _rule_place(clause: str) -> list[Memory]:
    patterns: list[tuple[str, str]] = [
        (
            r"^i\s+"
            + _ADVERBS
            + r"live\s+(?P<prep>in|near|on|at|outside|outside of|by)\s+(?P<x>.+)$",
            "The user lives {prep} {x}.",
        ),
        (
            r"^" + _I_AM + r"\s+" + _ADVERBS + r"living\s+(?P<prep>in|near|on|at)\s+(?P<x>.+)$",
            "The user lives {prep} {x}.",
        ),
        (
            r"^(?:"
            + _I_AM
            + r"\s+"
            + _ADVERBS
            + r"|i\s+"
            + _ADVERBS
            + r"come\s+)from\s+(?P<x>.+)$",
            "The user is from {x}.",
        ),
        (
            r"^i\s+" + _ADVERBS + r"(?:was born|grew up)\s+(?P<prep>in|on|near)\s+(?P<x>.+)$",
            "The user grew up {prep} {x}.",
        ),
        (
            r"^i\s+" + _ADVERBS + r"work\s+(?P<prep>at|for|in)\s+(?P<x>.+)$",
            "The user works {prep} {x}.",
        ),
        (r"^i\s+" + _ADVERBS + r"work\s+as\s+(?P<x>an?\s+.+)$", "The user works as {x}."),
        (
            r"^(?:i\s+|i've\s+|i have\s+)" + _ADVERBS + r"(?:just\s+|recently\s+)?moved\s+"
            r"(?P<prep>to|from)\s+(?P<x>.+)$",
            "The user moved {prep} {x}.",
        ),
        (r"^i\s+" + _ADVERBS + r"(?:study|studied)\s+(?P<x>.+)$", "The user studies {x}."),
    ]
    for pattern, template in patterns:
        match = re.match(pattern, clause, re.I)
        if match and (x := _obj(match.group("x"))):
            prep = (match.groupdict().get("prep") or "").lower()
            if "studied" in clause.lower().split():
                template = "The user studied {x}."
            return [(template.format(prep=prep, x=x), "fact")]
    return []


def _rule_event(clause: str) -> list[Memory]:
    match = re.match(
        r"^" + _I_AM + r"\s+" + _ADVERBS + r"(?P<verb>going to|gonna|planning to|planning on"
        r"|about to|traveling|travelling|flying|heading|driving|visiting|moving|getting"
        r"|starting|having|attending|leaving|taking)\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match:
        verb = match.group("verb").lower()
        verb = "going to" if verb == "gonna" else verb
        x_raw = clean_object(match.group("x"))
        if verb in ("going to", "about to", "planning to") and _CONVERSATIONAL.search(x_raw):
            return []
        if verb in ("having", "getting", "taking", "starting") and not (
            _DATE_WORDS.search(x_raw)
            or (
                verb in ("getting", "starting")
                and re.match(
                    r"^(?:married|a new job|an? \w+ job|school|college|university|"
                    r"a new|my new)\b",
                    x_raw,
                    re.I,
                )
            )
        ):
            return []
        if x := _obj(x_raw):
            return [(f"The user is {verb} {x}.", "event")]
        return []
    match = re.match(
        r"^i\s+" + _ADVERBS + r"(?P<verb>plan|intend|hope|want)\s+to\s+(?P<x>.+)$", clause, re.I
    )
    if match:
        x_raw = clean_object(match.group("x"))
        verb = match.group("verb").lower()
        if verb in ("want", "hope") and (
            _CONVERSATIONAL.search(x_raw) or not _DATE_WORDS.search(x_raw)
        ):
            return []
        if _CONVERSATIONAL.search(x_raw):
            return []
        if x := _obj(x_raw):
            return [(f"The user {conjugate(verb)} to {x}.", "event")]
        return []
    match = re.match(
        r"^(?P<be>i'll be|i will be|" + _I_AM + r")\s+(?P<x>(?:in|at|visiting|traveling|travelling"
        r"|away|out of|off)\b.+)$",
        clause,
        re.I,
    )
    if match and _DATE_WORDS.search(match.group("x")) and (x := _obj(match.group("x"))):
        be = "will be" if "be" in match.group("be").lower().split() else "is"
        return [(f"The user {be} {x}.", "event")]
    match = re.match(
        r"^my\s+(?P<what>birthday|bday|anniversary|wedding|wedding anniversary|graduation"
        r"|due date|exam|interview|surgery|flight)\s+(?:is|will be|'s|falls)\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match is None:
        match = re.match(
            r"^my\s+(?P<what>birthday|bday|anniversary|wedding|graduation|due date|exam"
            r"|interview|surgery|flight)'s\s+(?P<x>.+)$",
            clause,
            re.I,
        )
    if match and (x := _obj(match.group("x"))):
        what = "birthday" if match.group("what").lower() == "bday" else match.group("what").lower()
        return [(f"The user's {what} is {x}.", "event")]
    match = re.match(
        r"^(?:i have|i've got|i have got|i got)\s+(?P<det>an?|my|the)\s+(?P<x>.+)$", clause, re.I
    )
    if (
        match
        and _DATE_WORDS.search(match.group("x"))
        and not re.search(r"\bnamed\b|\bcalled\b", match.group("x"), re.I)
    ):
        x = _obj(match.group("x"))
        det = match.group("det").lower()
        det = "their" if det == "my" else det
        if x and not re.match(
            r"^(?:question|problem|issue|idea|doubt|request|error|bug|exception|typo)\b", x, re.I
        ):
            return [(f"The user has {det} {x}.", "event")]
    return []


def _rule_life(clause: str) -> list[Memory]:
    match = re.match(
        r"^(?:i have|i've got|i have got|i got|i own)\s+(?P<count>" + _COUNT + r")\s+"
        r"(?P<what>(?:[\w-]+\s+){0,2}?" + _PETS + r"s?)\s+(?:named|called)\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match and (x := _obj(match.group("x"))):
        what = clean_object(match.group("what"))
        return [(f"The user has {match.group('count').lower()} {what} named {x}.", "fact")]
    match = re.match(
        r"^my\s+(?P<what>(?:[\w-]+\s+){0,2}?" + _PETS + r")(?:'s name is|\s+is\s+(?:named|called)"
        r"|\s+is named)\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if match and (x := _obj(match.group("x"))):
        return [(f"The user has a {clean_object(match.group('what'))} named {x}.", "fact")]
    match = re.match(
        r"^(?:i have|i've got|i have got|i got|i own)\s+(?P<count>" + _COUNT + r")\s+"
        r"(?P<what>(?:[\w-]+\s+){0,2}?(?:" + _PETS + r"|" + _FAMILY + r")(?:s|ren|es)?)"
        r"(?P<rest>\s+(?:who|that|and|aged|age)\b.*)?$",
        clause,
        re.I,
    )
    if match and not _DATE_WORDS.search(match.group("what")):
        rest = _obj(match.group("rest") or "") or ""
        what = clean_object(match.group("what"))
        count = match.group("count").lower()
        return [(f"The user has {count} {what}{' ' + rest if rest else ''}.", "fact")]
    match = re.match(
        r"^(?:" + _I_AM + r")\s+(?P<n>\d{1,3})(?:\s+years?\s+old|\s+y/?o|\s+yrs? old)?$",
        clause,
        re.I,
    )
    if match and 0 < int(match.group("n")) < 130:
        return [(f"The user is {int(match.group('n'))} years old.", "fact")]
    match = re.match(
        r"^(?:" + _I_AM + r")\s+" + _ADVERBS + r"(?P<det>an?)\s+(?P<x>[\w-]+(?:\s.+)?)$",
        clause,
        re.I,
    )
    if match:
        first = match.group("x").split()[0].lower()
        if first in _ROLE_STOP or first in ("fan",):
            return []
        if x := _obj(match.group("x")):
            if _CONVERSATIONAL.search(x) or len(x.split()) > 12:
                return []
            return [(f"The user is {match.group('det').lower()} {x}.", "fact")]
    return []


def _rule_remember(clause: str) -> list[Memory]:
    match = re.match(
        r"^(?:please\s+)?(?:remember|don't forget|do not forget|note|keep in mind|make a note)"
        r"(?:\s+that|\s*:|\s*,)?\s+(?P<x>.+)$",
        clause,
        re.I,
    )
    if not match:
        return []
    inner = strip_filler(match.group("x").strip())
    found = _match_clause(inner, allow_remember=False)
    if found:
        return [(content, "fact" if kind == "other" else kind) for content, kind in found]
    x = clean_object(inner)
    if not x or len(x) > MAX_CLAUSE_CHARS:
        return []
    subject = re.match(
        r"^(?:i|i'm|i am|im)\s+(?P<adverbs>(?:(?:always|usually|never|often|sometimes|rarely"
        r"|really|also|just|still|only|definitely|generally|normally)\s+)*)(?P<verb>[\w']+)"
        r"(?P<rest>.*)$",
        x,
        re.I,
    )
    if subject:
        if re.match(r"^(?:i'm|i am|im)\b", x, re.I):
            text = "The user is " + x.split(None, 2 if x.lower().startswith("i am") else 1)[-1]
            return [(sentence(third_person(text)), "fact")]
        verb = conjugate(subject.group("verb"))
        rest = third_person(subject.group("rest"))
        return [(sentence(f"The user {subject.group('adverbs')}{verb}{rest}"), "fact")]
    if re.match(r"^my\b", x, re.I):
        return [(sentence("The user's" + third_person(x[2:])), "fact")]
    return [(sentence(_user_as_object(x)), "fact")]


_DIET_VERBS = re.compile(
    r"^(?:i|we)\s+(?:(?:really|strictly|also|just|usually|generally|personally)\s+)*"
    r"(?P<verb>don't eat|do not eat|never eat|can't eat|cannot eat|can not eat|avoid|stay away"
    r" from|don't drink|do not drink|never drink)\s+(?P<x>.+)$",
    re.I,
)
_DIET_NEGATIONS = {
    "don't eat": "doesn't eat",
    "do not eat": "doesn't eat",
    "never eat": "never eats",
    "can't eat": "can't eat",
    "cannot eat": "can't eat",
    "can not eat": "can't eat",
    "avoid": "avoids",
    "stay away from": "stays away from",
    "don't drink": "doesn't drink",
    "do not drink": "doesn't drink",
    "never drink": "never drinks",
}
_DIET_NAME = r"(?P<diet>[\w-]+(?:\s+[\w-]+)?)"


def _rule_diet(clause: str) -> list[Memory]:
    match = _DIET_VERBS.match(clause)
    if match and (x := _obj(match.group("x"))) and len(x.split()) <= 6:
        return [(f"The user {_DIET_NEGATIONS[match.group('verb').lower()]} {x}.", "fact")]
    match = re.match(
        r"^(?:" + _I_AM + r"\s+" + _ADVERBS + r"on|i\s+" + _ADVERBS + r"(?:follow|keep|eat))"
        r"\s+(?:an?\s+|the\s+)?" + _DIET_NAME + r"\s+diet$",
        clause,
        re.I,
    )
    if match and (diet := _obj(match.group("diet"))):
        return [(f"The user follows a {diet.lower()} diet.", "fact")]
    match = re.match(r"^i\s+" + _ADVERBS + r"eat\s+(?P<x>[\w\s-]+)$", clause, re.I)
    if match:
        x = clean_object(match.group("x")).lower()
        if x in _DIET_PHRASES or x in ("vegan", "vegetarian", "pescatarian", "kosher", "halal"):
            return [(f"The user eats {x}.", "fact")]
    return []


_RELATIVE = (
    r"(?:" + _FAMILY[3:-1] + r"|mom|mum|mother|dad|father|parents|grandmother|grandma|granny"
    r"|grandfather|grandpa|aunt|uncle|cousin|mother-in-law|father-in-law|sister-in-law"
    r"|brother-in-law|son-in-law|daughter-in-law|stepmother|stepfather|stepmom|stepdad"
    r"|kids|children|sons|daughters|brothers|sisters)"
)
_RELATIVE_NAME = re.compile(
    r"^my\s+(?:(?:older|younger|little|big|eldest|oldest|youngest|baby|twin|late|"
    r"\d{1,2}[- ]year[- ]old)\s+)?(?P<rel>" + _RELATIVE + r")'s\s+name\s+is\s+(?P<x>.+)$",
    re.I,
)
_RELATIVE_FACT = re.compile(
    r"^my\s+(?P<adj>(?:older|younger|little|big|eldest|oldest|youngest|baby|twin|"
    r"\d{1,2}[- ]year[- ]old)\s+)?(?P<rel>" + _RELATIVE + r")"
    r"(?:,?\s+(?P<name>" + _NAME_WORD + r"),?)?\s+(?P<rest>.+)$",
    re.I,
)
_RELATIVE_PREFERENCE = re.compile(
    r"^(?:(?:really|also|just|absolutely|totally)\s+)*(?:loves?|likes?|enjoys?|prefers?"
    r"|adores?|hates?|dislikes?|can't stand|is (?:a big |a huge )?fan of)\s+.+$",
    re.I,
)
_RELATIVE_IS = re.compile(
    r"^(?:is|are|'s)\s+(?:(?:severely|very|mildly|also|really)\s+)?"
    r"(?:allergic to\s+.+|an?\s+[\w-]+.*|named\s+.+|called\s+.+|from\s+.+|\d{1,3}"
    r"(?:\s+years?\s+old|\s+months?\s+old)?|[\w-]+(?:\s+[\w-]+)?)$",
    re.I,
)
_RELATIVE_DOES = re.compile(
    r"^(?:(?:also|still|now|currently)\s+)?(?:lives?\s+in|works?\s+(?:at|for|in|as)|studies"
    r"|goes\s+to|has|have|plays|was born|doesn't eat|does not eat|can't eat|never eats"
    r"|eats|speaks|teaches|owns)\b.+$",
    re.I,
)
_NEGATED = re.compile(r"\b(?:not|isn't|aren't|wasn't|never)\b|n't\b", re.I)


def _relative_kind(rest: str) -> str | None:
    """``preference`` or ``fact`` for what is said of a relative; None: not a lasting fact."""
    if _DATE_WORDS.search(rest) or len(rest.split()) > 12 or _CONVERSATIONAL.search(rest):
        return None
    if _RELATIVE_PREFERENCE.match(rest):
        return None if _NEGATED.search(rest) else "preference"
    if _NEGATED.search(rest) and not re.match(
        r"^(?:doesn't eat|does not eat|can't eat|never eats)\b", rest, re.I
    ):
        return None
    if _RELATIVE_DOES.match(rest):
        return "fact"
    match = _RELATIVE_IS.match(rest)
    if not match:
        return None
    word = rest.split(None, 1)[1].split()[0].lower() if " " in rest else ""
    lasting = (
        word in ("allergic", "a", "an", "named", "called", "from")
        or word.isdigit()
        or word in _IDENTITY
        or any(rest.lower().endswith(" " + p) for p in _DIET_PHRASES)
        or word in ("married", "single", "divorced", "retired", "pregnant", "engaged")
    )
    return "fact" if lasting else None


def _rule_family(clause: str) -> list[Memory]:
    match = _RELATIVE_NAME.match(clause)
    if match and (named := _name_from(match.group("x"), require_capital=False)):
        return [(f"The user's {match.group('rel').lower()}'s name is {named[0]}.", "fact")]
    match = _RELATIVE_FACT.match(clause)
    if not match:
        return []
    name = match.group("name")
    rest = match.group("rest")
    if name and (name.lower() in _NOT_NAMES or not name[0].isupper()):
        # "my son is ...": the word after the relative is the verb, not a name.
        rest = f"{name} {rest}"
        name = None
    rest = clean_object(rest)
    kind = _relative_kind(rest)
    if kind is None or not rest:
        return []
    for pattern, replacement in _POSSESSIVE_USER:
        rest = pattern.sub(replacement, rest)
    who = f"{(match.group('adj') or '').lower()}{match.group('rel').lower()}"
    return [(sentence(f"The user's {who}{' ' + name if name else ''} {rest}"), kind)]


_RULES: tuple[Rule, ...] = (
    _rule_family,
    _rule_diet,
    _rule_allergy,
    _rule_preference,
    _rule_place,
    _rule_event,
    _rule_life,
    _rule_name,
)


def _match_clause(clause: str, *, allow_remember: bool = True) -> list[Memory]:
    clause = strip_filler(clause)
    if not clause or len(clause) > MAX_CLAUSE_CHARS:
        return []
    clause = _TRAILING_PUNCT.sub("", clause).strip()
    if allow_remember:
        remembered = _rule_remember(clause)
        if remembered:
            return remembered
    # "my name is" and "call me" first: they are unambiguous. "I'm <Name>" comes last.
    if re.match(
        r"^(?:my name|my first name|the name's|call me|you can call me|please call me)\b",
        clause,
        re.I,
    ):
        return _rule_name(clause)
    for rule in _RULES:
        found = rule(clause)
        if found:
            return found
    return []


def _is_question(sentence_text: str) -> bool:
    stripped = sentence_text.rstrip(" \"')]")
    return stripped.endswith("?")


def extract_text(text: str) -> list[ExtractedMemory]:
    """Memories from the first-person statements in ``text`` (one user message)."""
    out: list[ExtractedMemory] = []
    for sent in sentences(text):
        if _is_question(sent):
            continue
        for clause in clauses(sent):
            for content, kind in _match_clause(clause):
                out.append(ExtractedMemory(content=content, kind=kind))
    return dedupe(out)


def extract_rules(turn: TurnRecord) -> list[ExtractedMemory]:
    """Memories from the first-person statements in the turn's new user messages."""
    memories: list[ExtractedMemory] = []
    for text in new_user_texts(turn):
        memories.extend(extract_text(text))
    return dedupe(memories)


# -- Facts that change: which listed memory a new one replaces ------------------------------
#
# The prompt's related memories (extraction/prompt.py) come to the rules extractor as (ref,
# content) pairs. A new memory is marked as replacing one of them only when the turn says that
# something changed ("I moved to Oslo", "I live in Oslo now", "I started a new job at Globex",
# "I don't like tea anymore", "I no longer ...") and the listed memory holds the same slot with
# another value: where the user lives, where they work, their job, one of their favorites, and
# a like that became a dislike (or back). Without a word of change nothing is replaced: an
# agent-wide scope holds the facts of many people, and "I live in Turin" from one of them does
# not make another's "lives in Lisbon" untrue.

#: Words that say a fact changed.
_CHANGE = re.compile(
    r"\b(?:now|anymore|any more|no longer|these days|nowadays|moved|new job|new role"
    r"|started|switched|changed|relocated)\b",
    re.I,
)
#: A word of change at the end of a memory ("lives in Oslo now."), dropped from its wording.
_TRAILING_CHANGE = re.compile(r"\s+(?:now|anymore|any more|these days|nowadays)(?=\.$)", re.I)
_NEW_JOB = re.compile(
    r"^i\s+" + _ADVERBS + r"(?:just\s+|recently\s+)?(?:started|got|took|began|landed)\s+"
    r"(?:a\s+)?new\s+(?:job|position|role)\s+(?:at|with|in)\s+(?P<x>.+)$",
    re.I,
)
_POSITIVE = ("loves", "likes", "enjoys", "adores", "prefers", "is a fan of", "is a big fan of")
_NEGATIVE = ("dislikes", "hates", "detests", "despises", "loathes", "can't stand")
_SLOTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "home",
        re.compile(
            r"^the user (?:lives (?:in|near|on|at|outside of|outside|by)|moved to) (?P<v>.+?)\.$",
            re.I,
        ),
    ),
    ("work", re.compile(r"^the user works (?:at|for) (?P<v>.+?)\.$", re.I)),
    (
        "job",
        re.compile(
            r"^the user (?:works as|is) (?P<v>an? (?!fan\b|big\b)[\w-]+(?: [\w-]+)?)\.$", re.I
        ),
    ),
    (
        "favorite",
        re.compile(r"^the user's favou?rite (?P<what>.+?) (?:is|are) (?P<v>.+?)\.$", re.I),
    ),
    (
        "taste",
        re.compile(
            r"^the user (?P<v>" + "|".join(re.escape(v) for v in _POSITIVE + _NEGATIVE) + r")"
            r" (?P<what>.+?)\.$",
            re.I,
        ),
    ),
)


def slot_of(content: str) -> tuple[str, str] | None:
    """The slot a memory fills and its value (``("home", "oslo")``), or None: a memory that
    does not hold one value at a time. A taste is keyed by its object, its value the polarity."""
    for name, pattern in _SLOTS:
        match = pattern.match(content.strip())
        if not match:
            continue
        value = match.group("v").lower()
        what = match.groupdict().get("what")
        if name == "taste":
            return f"taste:{(what or '').lower()}", "+" if value in _POSITIVE else "-"
        if what is not None:
            return f"{name}:{what.lower()}", value
        return name, value
    return None


def _changed_wording(memory: ExtractedMemory) -> ExtractedMemory:
    content = _TRAILING_CHANGE.sub("", memory.content)
    return ExtractedMemory(content, memory.kind) if content != memory.content else memory


def mark_replaces(
    memories: list[ExtractedMemory], related: Sequence[tuple[str, str]], said: str
) -> list[ExtractedMemory]:
    """``memories`` with ``replaces`` set to the refs of the ``related`` (ref, content) pairs
    each one changes, when ``said`` (the turn's new user text) says that something changed."""
    if not related or not _CHANGE.search(said):
        return memories
    out = []
    for memory in memories:
        slot = slot_of(memory.content)
        refs: tuple[str, ...] = ()
        if slot is not None:
            refs = tuple(
                ref
                for ref, content in related
                if (theirs := slot_of(content)) is not None
                and theirs[0] == slot[0]
                and theirs[1] != slot[1]
            )
        out.append(ExtractedMemory(memory.content, memory.kind, refs) if refs else memory)
    return out


def extract_changes(
    turn: TurnRecord, related: Sequence[tuple[str, str]] = ()
) -> list[ExtractedMemory]:
    """:func:`extract_rules`, plus "I started a new job at X", without the words of change in
    the memories' wording, and with ``replaces`` (:func:`mark_replaces`): what the rules
    provider answers."""
    said = " ".join(new_user_texts(turn))
    memories = [_changed_wording(m) for m in extract_rules(turn)]
    for sent in sentences(said):
        for clause in clauses(sent):
            clause = _TRAILING_PUNCT.sub("", strip_filler(clause)).strip()
            match = _NEW_JOB.match(clause)
            if match and (x := _obj(match.group("x"))):
                memories.append(ExtractedMemory(f"The user works at {x}.", "fact"))
    return mark_replaces(dedupe(memories), related, said)


__all__ = [
    "RULES_MODEL",
    "extract_changes",
    "extract_rules",
    "extract_text",
    "mark_replaces",
    "new_user_texts",
    "slot_of",
]
