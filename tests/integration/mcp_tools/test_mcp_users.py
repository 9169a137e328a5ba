"""Users over MCP, on both transports: a user-bound token reaches its user's memories and the
agent-wide ones only (another user's are never returned, and NOT_FOUND to forget), and
``user`` (the argument, or IBEX_USER over stdio) scopes an unbound token's calls the same way.
"""

from __future__ import annotations

import uuid
from typing import Any

from memories.tokens import TokenStore
from tests.integration.mcp_tools.conftest import Connect, run
from tests.integration.memory_service.helpers import make_tenant

DANA = "The user is allergic to peanuts."
GRACE = "The user is allergic to latex."
SHARED = "The clinic is allergic-safe and opens at nine."


def _user_id(db: Any, org_id: uuid.UUID, key: str) -> uuid.UUID:
    row = db.execute_sql(
        "SELECT id FROM ibex_core.users WHERE org_id = %s AND external_id = %s",
        (str(org_id), key),
    ).fetchone()
    assert row is not None, key
    return uuid.UUID(str(row[0]))


def _memory_user(db: Any, memory_id: str) -> uuid.UUID | None:
    row = db.execute_sql(
        "SELECT user_id FROM ibex_memory.memories WHERE id = %s", (memory_id,)
    ).fetchone()
    return None if row[0] is None else uuid.UUID(str(row[0]))


def test_another_users_memories_are_never_returned(connect: Connect, store: Any) -> None:
    acme = make_tenant(store, "acme")
    agent = str(acme.agent_id)

    async def write() -> dict[str, str]:
        ids = {}
        async with connect(acme.writer, agent=agent, user="dana") as dana:
            ids["dana"] = (await dana.ok("remember", content=DANA))["memory"]["id"]
        async with connect(acme.writer, agent=agent, user="grace") as grace:
            ids["grace"] = (await grace.ok("remember", content=GRACE))["memory"]["id"]
        async with connect(acme.writer, agent=agent) as everyone:
            ids["shared"] = (await everyone.ok("remember", content=SHARED))["memory"]["id"]
        return ids

    ids = run(write())
    dana_id = _user_id(store.db, acme.org_id, "dana")
    assert _memory_user(store.db, ids["dana"]) == dana_id
    assert _memory_user(store.db, ids["grace"]) == _user_id(store.db, acme.org_id, "grace")
    assert _memory_user(store.db, ids["shared"]) is None
    _, bound = TokenStore(store.db).issue(
        org_id=acme.org_id, name="dana", scopes=["memory:read", "memory:write"], user_id=dana_id
    )

    async def read(token: str, user: str | None) -> None:
        async with connect(token, agent=agent, user=user) as reader:
            hits = (await reader.ok("recall", query="allergic"))["hits"]
            assert {h["memory"]["id"] for h in hits} == {ids["dana"], ids["shared"]}
            packed = await reader.ok("context", query="allergic")
            assert GRACE not in packed["context"] and DANA in packed["context"]
            page = await reader.ok("list_memories")
            assert {m["id"] for m in page["memories"]} == {ids["dana"], ids["shared"]}
            refused = await reader.error("forget", memory_id=ids["grace"])
            assert refused.startswith("NOT_FOUND"), refused

    run(read(bound, None))  # the bound token alone
    run(read(acme.writer, "dana"))  # an unbound token for the user dana

    async def bound_write() -> str:
        async with connect(bound, agent=agent) as dana:
            return (await dana.ok("remember", content="The user hikes on Sundays."))["memory"]["id"]

    assert _memory_user(store.db, run(bound_write())) == dana_id
    assert _memory_user(store.db, ids["grace"]) is not None  # never forgotten by dana
