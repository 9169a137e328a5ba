"""POST /v1/context: the best memories in a budget, as a <memories> block."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from core.config import Settings
from memories.search.context import estimate_tokens
from schema.search import ContextResultSchema
from tests.integration.memory_service.helpers import Tenant
from tests.integration.memory_service.test_search import write


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    """The service with its near-duplicate refusal off, so near-identical memories can be
    stored and the packing's own rule (never the same words twice in one block) is what is
    tested here; the refusal has its tests in test_change.py."""
    return Settings.from_env(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "MEMORY_MAX_BODY_BYTES": "4096",
            "MEMORY_NEAR_DUPLICATE_THRESHOLD": "0",
        }
    )


@pytest.fixture
def session_id(store, acme: Tenant) -> uuid.UUID:  # type: ignore[no-untyped-def]
    return store.create_session(acme.org_id, acme.agent_id, "conv-context").id


def context(http: httpx.Client, tenant_: Tenant, **body: Any) -> dict[str, Any]:
    full = {"agent_id": str(tenant_.agent_id), **body}
    response = http.post("/v1/context", json=full, headers=tenant_.headers(tenant_.reader))
    assert response.status_code == 200, response.text
    ContextResultSchema().load(response.json())
    result: dict[str, Any] = response.json()
    return result


def test_packs_the_best_memories_once_within_the_budget(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    write(http, acme, "dana is allergic to peanuts!", session_id)
    # A near-duplicate written later: it is the newer standing fact, and the older copy is
    # then left out.
    allergy = write(http, acme, "Dana is allergic to peanuts.", session_id)
    lives = write(http, acme, "Dana lives in Lisbon.", session_id)
    tea = write(http, acme, "The user prefers tea.", session_id)
    result = context(http, acme, query="What is Dana allergic to?", max_tokens=400)
    # All of the scope's memories fit: all of them, the standing facts first (the allergy,
    # then where she lives), then the others.
    assert result["context"] == (
        "<memories>\n- Dana is allergic to peanuts.\n- Dana lives in Lisbon.\n"
        "- The user prefers tea.\n</memories>"
    )
    assert [m["id"] for m in result["memories"]] == [allergy, lives, tea]
    assert result["tokens"] == estimate_tokens(result["context"])
    assert result["dropped"] == 1
    assert context(http, acme, query="What is Dana allergic to?", max_tokens=400) == result

    # Not all fit: the allergy (too long for the standing facts' share of 15) comes in as
    # the query's best hit; its near-duplicate and Lisbon, hits too, are left out.
    tight = context(http, acme, query="What is Dana allergic to?", max_tokens=15)
    assert tight["context"] == "<memories>\n- Dana is allergic to peanuts.\n</memories>"
    assert tight["tokens"] <= 15
    assert tight["dropped"] == 2
    assert context(http, acme, query="Dana", max_tokens=3) == {
        "context": "",
        "memories": [],
        "tokens": 0,
        "dropped": 3,
    }


def test_messages_make_the_query_without_recalled_blocks(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    cello = write(http, acme, "Marcus plays the cello.", session_id)
    lives = write(http, acme, "Dana lives in Lisbon.", session_id)
    messages = [
        {"role": "system", "content": "<memories>\n- Dana lives in Lisbon.\n</memories>"},
        {"role": "user", "content": "<memories>\n- Dana lives in Lisbon.\n</memories>hi"},
        {"role": "assistant", "content": "Hello!"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Which instrument does Marcus play?"}],
        },
    ]
    result = context(http, acme, messages=messages)
    # Both fit: where Dana lives is a standing fact, packed first whatever was asked; the
    # query holds no word of the recalled blocks, so only the cello matches its words.
    assert [m["id"] for m in result["memories"]] == [lives, cello]
    signals = {m["id"]: m["signals"] for m in result["memories"]}
    assert signals[cello]["text"] > 0
    assert signals[lives]["text"] == 0 and signals[lives]["trigram"] < 0.5


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "query"),
        ({"query": "x", "messages": [{"role": "user", "content": "x"}]}, "query"),
        ({"query": "x", "max_tokens": 0}, "max_tokens"),
        ({"query": "x", "max_tokens": 32001}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
    ],
)
def test_bad_bodies_are_422(
    http: httpx.Client, acme: Tenant, body: dict[str, Any], field: str
) -> None:
    full = {"agent_id": str(acme.agent_id), **body}
    response = http.post("/v1/context", json=full, headers=acme.headers())
    assert response.status_code == 422, response.text
    assert field in response.json()["error"]["fields"]


def test_another_orgs_memories_are_never_packed(
    http: httpx.Client, acme: Tenant, globex: Tenant, store
) -> None:  # type: ignore[no-untyped-def]
    theirs = store.create_session(globex.org_id, globex.agent_id, "conv-g").id
    write(http, globex, "Dana is allergic to peanuts.", theirs)
    body = {"agent_id": str(globex.agent_id), "query": "Dana peanuts"}
    response = http.post("/v1/context", json=body, headers=acme.headers())
    assert (response.status_code, response.json()["error"]["code"]) == (404, "UNKNOWN_AGENT")
    # Nor by the slug of globex's agent: acme has an agent of that slug, with nothing stored.
    body = {"agent": "bot", "query": "Dana peanuts"}
    response = http.post("/v1/context", json=body, headers=acme.headers())
    assert response.status_code == 200
    assert response.json() == {"context": "", "memories": [], "tokens": 0, "dropped": 0}


def test_the_agent_by_slug_or_id_and_an_unknown_one(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    write(http, acme, "Dana is allergic to peanuts.", session_id)
    by_id = {"agent_id": str(acme.agent_id), "query": "Dana peanuts"}
    by_slug = {"agent": "bot", "query": "Dana peanuts"}
    got = http.post("/v1/context", json=by_slug, headers=acme.headers(acme.reader))
    assert got.status_code == 200, got.text
    assert got.json()["context"] == "<memories>\n- Dana is allergic to peanuts.\n</memories>"
    assert got.json() == http.post("/v1/context", json=by_id, headers=acme.headers()).json()
    for named in ({"agent": "suport-bot"}, {"agent_id": str(uuid.uuid4())}):
        body = {"query": "Dana peanuts", **named}
        response = http.post("/v1/context", json=body, headers=acme.headers(acme.reader))
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "UNKNOWN_AGENT"
    both = {**by_slug, "agent_id": str(acme.agent_id)}
    response = http.post("/v1/context", json=both, headers=acme.headers())
    assert response.status_code == 422 and "agent" in response.json()["error"]["fields"]


def test_the_person_then_the_moment_when_not_all_fit(
    http: httpx.Client, acme: Tenant, session_id: uuid.UUID
) -> None:
    """More memories than the budget holds: the standing facts (chosen without the query)
    lead, within their share; then the query's hits above the relevance bar. A question
    nothing answers gets the same block whatever it is: the person, nothing random."""
    cello = write(http, acme, "Marcus plays the cello in a string quartet.", session_id)
    for n in range(30):
        write(http, acme, f"Ticket {n + 100} about the office printer was closed.", session_id)
    allergy = write(http, acme, "Dana is allergic to peanuts.", session_id)
    home = write(http, acme, "Dana lives in Lisbon.", session_id)
    blocks = [
        context(http, acme, query=q, max_tokens=120)
        for q in ("How many ounces are in a pound?", "Write a haiku about autumn leaves.")
    ]
    assert blocks[0]["context"] == blocks[1]["context"]
    ids = [m["id"] for m in blocks[0]["memories"]]
    assert ids[:2] == [allergy, home] and cello not in ids
    assert blocks[0]["tokens"] <= 120 and len(ids) < 33

    asked = context(http, acme, query="Who plays the cello?", max_tokens=120)
    ids = [m["id"] for m in asked["memories"]]
    assert ids[:2] == [allergy, home] and ids[-1] == cello
    assert asked["memories"][-1]["score"] >= 0.35  # the local model's relevance bar
