"""Small builders for foundation tests."""

from __future__ import annotations

from sessions.store import SessionStore
from sessions.turns import TurnInput


def turn(text: str, reply: str = "ok") -> TurnInput:
    return TurnInput(
        messages=[{"role": "user", "content": text}],
        completion={"role": "assistant", "content": reply},
        prompt_tokens=10,
        completion_tokens=2,
        latency_ms=100,
    )


def make_session(
    store: SessionStore,
    org: str,
    agent: str = "bot",
    turns: int = 2,
    external_id: str = "s1",
    status: str = "completed",
):
    org_id = store.ensure_org(org)
    agent_id = store.ensure_agent(org_id, agent)
    session = store.create_session(org_id, agent_id, external_id, status=status)
    if turns:
        store.append_turns(org_id, session.id, [turn(f"turn {i}") for i in range(1, turns + 1)])
    return org_id, agent_id, session.id
