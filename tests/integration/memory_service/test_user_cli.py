"""``ibex token create --user``, ``ibex search --user`` and ``ibex user forget`` on a real
database: a bound token names its user, a search keeps to one user and the agent-wide
memories, and a forget takes the user's memories out of every search."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from cli import main
from memories.store import MemoryStore, NewMemory
from memories.tokens import TokenStore, hash_token


def _write(store: Any, org_id: uuid.UUID, agent_id: uuid.UUID, content: str, user: Any) -> str:
    row = (
        MemoryStore(store.db)
        .create(
            org_id,
            NewMemory(
                agent_id=agent_id,
                content=content,
                content_hash=uuid.uuid4().hex * 2,
                kind="fact",
                metadata={},
                session_id=None,
                turn_index=None,
                ordinal=None,
                idempotency_key=None,
                fingerprint="",
                user_id=user,
            ),
        )
        .row
    )
    assert row is not None
    return str(row.id)


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch, database_url: str, store) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DATABASE_URL", database_url)
    org_id = store.ensure_org("acme")
    agent_id = store.ensure_agent(org_id, "bot")
    dana = store.resolve_user(org_id, external_id="dana-17")
    grace = store.resolve_user(org_id, external_id="grace-04")
    return {
        "dana": dana,
        "grace": grace,
        "dana_memory": _write(store, org_id, agent_id, "The user is allergic to soy.", dana),
        "grace_memory": _write(store, org_id, agent_id, "The user is allergic to latex.", grace),
        "shared": _write(store, org_id, agent_id, "Allergic questions go to the nurse.", None),
    }


def _search(capsys: pytest.CaptureFixture[str], *extra: str) -> set[str]:
    code = main(["search", "allergic", "--org", "acme", "--agent", "bot", "--json", *extra])
    assert code == 0
    return {item["id"] for item in json.loads(capsys.readouterr().out)["items"]}


def test_search_per_user(seeded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    dana, grace, shared = seeded["dana_memory"], seeded["grace_memory"], seeded["shared"]
    assert _search(capsys, "--user", "dana-17") == {dana, shared}
    assert _search(capsys, "--user", str(seeded["grace"])) == {grace, shared}
    assert _search(capsys, "--user", "dana-17", "--no-shared") == {dana}
    assert _search(capsys) == {shared}
    assert _search(capsys, "--all-users") == {dana, grace, shared}
    # A user the org does not have is named, not answered with an empty list.
    assert main(["search", "allergic", "--org", "acme", "--agent", "bot", "--user", "nobody"]) == 1
    assert "no user 'nobody' in org 'acme'" in capsys.readouterr().err


def test_a_token_bound_to_a_user_and_forgetting_the_user(
    seeded: dict[str, Any], capsys: pytest.CaptureFixture[str], db: Any
) -> None:
    args = ["token", "create", "--org", "acme", "--user", "dana-17", "--scope", "memory:read"]
    assert main(args) == 0
    token = capsys.readouterr().out.strip()
    row = TokenStore(db).lookup(hash_token(token))
    assert row is not None and row.user_id == seeded["dana"]
    # A new key is created as a user; a user without an org is a usage error.
    assert main([*args[:5], "ivy-9", *args[6:]]) == 0
    capsys.readouterr()
    assert main(["token", "create", "--service", "--user", "x", "--scope", "memory:read"]) == 2

    assert main(["user", "forget", "--org", "acme", "dana-17", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts == {"user_id": str(seeded["dana"]), "sessions": 0, "memories": 1, "tokens": 1}
    forgotten = ["search", "allergic", "--org", "acme", "--agent", "bot", "--user"]
    assert main([*forgotten, str(seeded["dana"])]) == 1  # forgotten: no such user any more
    assert "no user" in capsys.readouterr().err
    assert _search(capsys, "--all-users") == {seeded["grace_memory"], seeded["shared"]}
    looked_up = TokenStore(db).lookup(hash_token(token))
    assert looked_up is not None and looked_up.revoked_at is not None
    # Again, or unknown: an error, nothing created.
    assert main(["user", "forget", "--org", "acme", "dana-17"]) == 1
    assert "no user" in capsys.readouterr().err
    assert main(["user", "forget", "--org", "nope", "dana-17"]) == 1
