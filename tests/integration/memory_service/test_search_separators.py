"""The search's word boundaries: ``regexp_replace`` with
:data:`~memories.search.store.SEPARATOR_CLASS` makes the separators spaces exactly as
``translate`` with :data:`~memories.search.store.SEPARATORS` did, for each separator (those
with a meaning inside a bracket expression included), next to letters of every width."""

from __future__ import annotations

import random
from typing import Any

from memories.search.store import SEPARATOR_CLASS, SEPARATORS

SAME_SQL = (
    "SELECT translate(%(s)s, %(separators)s, %(spaces)s),"
    " regexp_replace(%(s)s, %(class)s, ' ', 'g')"
)


def test_the_separator_class_replaces_what_translate_replaced(db: Any) -> None:
    rng = random.Random(5)
    alphabet = [*SEPARATORS, "a", "Z", "0", " ", "é", "ß", "日", "本", "🙂", "\\\\", "[]", "^-"]
    texts = [SEPARATORS, SEPARATORS[::-1], "plain words", ""]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    params = {"separators": SEPARATORS, "spaces": " " * len(SEPARATORS), "class": SEPARATOR_CLASS}
    for text in texts:
        translated, replaced = db.execute_sql(SAME_SQL, {**params, "s": text}).fetchone()
        assert replaced == translated, text
    (spaces,) = db.execute_sql(
        "SELECT regexp_replace(%s, %s, ' ', 'g')", (SEPARATORS, SEPARATOR_CLASS)
    ).fetchone()
    assert spaces == " " * len(SEPARATORS)
