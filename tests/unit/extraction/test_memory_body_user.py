"""The write stage's POST body carries the session's user, when it has one, and nothing else
changes: an agent-wide session's body is what it was before users existed."""

from __future__ import annotations

import uuid

from extraction.stages import memory_body
from extraction.values import PersistedResult, StoredMemory, TurnRef

REF = TurnRef(uuid.uuid4(), uuid.uuid4(), 2)
AGENT = uuid.uuid4()
RESULT = PersistedResult((StoredMemory("Dana likes tea.", "preference"),), "openai", "m", 1, 1)


def test_an_agent_wide_session_sends_no_user() -> None:
    body = memory_body(AGENT, REF, 0, RESULT)
    assert body == memory_body(AGENT, REF, 0, RESULT, None)
    assert set(body) == {"agent_id", "content", "kind", "source", "metadata"}


def test_a_users_session_sends_the_user_beside_the_same_fields() -> None:
    user = uuid.uuid4()
    body = memory_body(AGENT, REF, 0, RESULT, user)
    assert body.pop("user_id") == str(user)
    assert body == memory_body(AGENT, REF, 0, RESULT)
