"""Facts that change through the API: supersession (POST supersedes, current-only reads,
include_superseded, history) and near-duplicates (409 DUPLICATE_CONTENT with existing_id)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from memories.canonical import canonical_request
from schema.memory import MemoryHistorySchema, MemorySchema
from tests.integration.memory_service.helpers import Tenant, memory_body


def post(
    http: httpx.Client, tenant_: Tenant, content: str, *, key: str | None = None, **extra: Any
) -> httpx.Response:
    return http.post(
        "/v1/memories",
        json=memory_body(tenant_.agent_id, content=content, **extra),
        headers=tenant_.headers(key=key),
    )


def created(http: httpx.Client, tenant_: Tenant, content: str, **extra: Any) -> str:
    response = post(http, tenant_, content, **extra)
    assert response.status_code == 201, response.text
    MemorySchema().load(response.json())
    return str(response.json()["id"])


def listed(http: httpx.Client, tenant_: Tenant, **params: Any) -> list[dict[str, Any]]:
    response = http.get(
        "/v1/memories",
        params={"agent_id": str(tenant_.agent_id), **params},
        headers=tenant_.headers(tenant_.reader),
    )
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def test_a_changed_fact_supersedes_the_old_one(http: httpx.Client, acme: Tenant) -> None:
    lisbon = created(http, acme, "Dana lives in Lisbon.")
    allergy = created(http, acme, "Dana is allergic to peanuts.")
    response = post(http, acme, "Dana lives in Oslo.", supersedes=[lisbon])
    assert response.status_code == 201, response.text
    oslo = response.json()["id"]
    assert response.json()["superseded_by"] is None

    # Reads return current memories by default.
    assert {m["content"] for m in listed(http, acme)} == {
        "Dana lives in Oslo.",
        "Dana is allergic to peanuts.",
    }
    every = {m["id"]: m for m in listed(http, acme, include_superseded="true")}
    assert every[lisbon]["superseded_by"] == oslo
    assert every[lisbon]["superseded_at"] is not None
    assert every[oslo]["superseded_by"] is None
    # The superseded memory is still there, never deleted, and says what replaced it.
    got = http.get(f"/v1/memories/{lisbon}", headers=acme.headers(acme.reader)).json()
    assert got["superseded_by"] == oslo

    # Context and search: the current fact only, unless asked for the others.
    context = http.post(
        "/v1/context",
        json={"agent_id": str(acme.agent_id), "query": "Where does Dana live?"},
        headers=acme.headers(acme.reader),
    ).json()
    # Both current memories are standing facts: the allergy (a constraint) first, then home.
    assert [m["id"] for m in context["memories"]] == [allergy, oslo]
    assert "Lisbon" not in context["context"]
    body = {"agent_id": str(acme.agent_id), "query": "where Dana lives"}
    hits = http.post("/v1/memories/search", json=body, headers=acme.headers(acme.reader))
    assert hits.json()["items"][0]["id"] == oslo
    assert lisbon not in [h["id"] for h in hits.json()["items"]]
    hits = http.post(
        "/v1/memories/search",
        json={**body, "include_superseded": True},
        headers=acme.headers(acme.reader),
    )
    found = {h["id"]: h["superseded_by"] for h in hits.json()["items"]}
    assert found[oslo] is None
    assert found[lisbon] == oslo

    # History: the chain, oldest first, from either end.
    for member in (lisbon, oslo):
        response = http.get(f"/v1/memories/{member}/history", headers=acme.headers(acme.reader))
        assert response.status_code == 200, response.text
        MemoryHistorySchema().load(response.json())
        assert [m["id"] for m in response.json()["items"]] == [lisbon, oslo]


def test_a_chain_of_three_and_a_fact_stated_again(http: httpx.Client, acme: Tenant) -> None:
    lisbon = created(http, acme, "Dana lives in Lisbon.")
    oslo = created(http, acme, "Dana lives in Oslo.", supersedes=[lisbon])
    # Back in Lisbon: the same words as a superseded memory are current again, not a duplicate.
    again = created(http, acme, "Dana lives in Lisbon.", supersedes=[oslo])
    assert again != lisbon
    response = http.get(f"/v1/memories/{oslo}/history", headers=acme.headers(acme.reader))
    assert [m["id"] for m in response.json()["items"]] == [lisbon, oslo, again]
    assert [m["id"] for m in listed(http, acme)] == [again]


def test_supersedes_must_name_current_memories_of_the_scope(
    http: httpx.Client, acme: Tenant, globex: Tenant
) -> None:
    lisbon = created(http, acme, "Dana lives in Lisbon.")
    oslo = created(http, acme, "Dana lives in Oslo.", supersedes=[lisbon])
    theirs = created(http, globex, "Someone lives in Rome.")

    def refused(supersedes: list[str], **extra: Any) -> None:
        response = post(http, acme, "Dana lives in Bergen.", supersedes=supersedes, **extra)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "VALIDATION_FAILED"
        assert "supersedes" in response.json()["error"]["fields"]

    refused([lisbon])  # superseded already
    refused([str(uuid.uuid4())])  # unknown
    refused([theirs])  # another org's: unknown here
    http.delete(f"/v1/memories/{oslo}", headers=acme.headers())
    refused([oslo])  # deleted
    # Nothing was stored by the refusals.
    assert [m["content"] for m in listed(http, acme)] == []

    # stale_supersedes=skip (the pipeline's): a no-longer-current id is skipped, the memory
    # stored; an unknown id too (it may have been erased).
    skipped = created(
        http, acme, "Dana lives in Bergen.", supersedes=[lisbon, oslo], stale_supersedes="skip"
    )
    every = {m["id"]: m for m in listed(http, acme, include_superseded="true")}
    assert every[lisbon]["superseded_by"] == oslo  # left as it was
    assert every[skipped]["superseded_by"] is None


def test_supersedes_is_scoped_to_the_agent(http: httpx.Client, acme: Tenant, store) -> None:  # type: ignore[no-untyped-def]
    lisbon = created(http, acme, "Dana lives in Lisbon.")
    other_agent = store.ensure_agent(acme.org_id, "other-bot")
    body = memory_body(other_agent, content="Dana lives in Oslo.", supersedes=[lisbon])
    body["source"] = None
    for stale in ("reject", "skip"):
        response = http.post(
            "/v1/memories", json={**body, "stale_supersedes": stale}, headers=acme.headers()
        )
        assert response.status_code == 422, response.text
    assert listed(http, acme)[0]["superseded_by"] is None


def test_the_replay_of_a_supersession_is_the_first_answer(http: httpx.Client, acme: Tenant) -> None:
    lisbon = created(http, acme, "Dana lives in Lisbon.")
    first = post(http, acme, "Dana lives in Oslo.", key="k-oslo", supersedes=[lisbon])
    assert first.status_code == 201
    # Superseded later itself: the replay still answers the first bytes.
    created(http, acme, "Dana lives in Bergen.", supersedes=[first.json()["id"]])
    again = post(http, acme, "Dana lives in Oslo.", key="k-oslo", supersedes=[lisbon])
    assert again.status_code == 201
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.content == first.content
    # The same key with other supersedes is another request.
    conflict = post(http, acme, "Dana lives in Oslo.", key="k-oslo")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"


def test_the_fingerprint_of_a_body_without_supersedes_is_unchanged() -> None:
    validated = {
        "agent_id": uuid.UUID(int=1),
        "content": "x",
        "kind": "fact",
        "metadata": {},
        "source": None,
    }
    assert set(canonical_request(validated)) == {
        "agent_id",
        "content",
        "kind",
        "metadata",
        "source",
    }
    ids = [uuid.UUID(int=3), uuid.UUID(int=2), uuid.UUID(int=3)]
    with_ids = canonical_request({**validated, "supersedes": ids})
    assert with_ids["supersedes"] == [str(uuid.UUID(int=2)), str(uuid.UUID(int=3))]


def test_a_near_duplicate_is_refused_with_the_existing_id(http: httpx.Client, acme: Tenant) -> None:
    first = created(http, acme, "The user is allergic to peanuts.")
    for text in ("User is allergic to peanuts.", "The user is allergic to peanuts!"):
        response = post(http, acme, text)
        assert response.status_code == 409, response.text
        assert response.json()["error"] == {
            "code": "DUPLICATE_CONTENT",
            "message": "a memory with the same content exists for this agent",
            "existing_id": first,
        }
    # Similar but not near-identical: stored.
    created(http, acme, "The user is allergic to peanuts and to shellfish.")
    metrics = http.get("/metrics").text
    assert "ibex_memory_near_duplicates_total 2.0" in metrics


def test_a_superseding_memory_is_never_a_near_duplicate_of_what_it_replaces(
    http: httpx.Client, acme: Tenant
) -> None:
    old = created(http, acme, "Dana lives in Lisbon, Portugal.")
    # Near-identical by trigram (punctuation and case differ only), so without supersedes
    # it is refused...
    refused = post(http, acme, "dana lives in lisbon portugal")
    assert refused.status_code == 409
    assert refused.json()["error"]["existing_id"] == old
    # ...but a memory that supersedes it is stored.
    new = created(http, acme, "dana lives in lisbon portugal", supersedes=[old])
    assert [m["id"] for m in listed(http, acme)] == [new]


def test_a_near_duplicate_of_a_superseded_memory_is_stored(
    http: httpx.Client, acme: Tenant
) -> None:
    old = created(http, acme, "The user works at Acme Corporation.")
    created(http, acme, "The user works at Globex.", supersedes=[old])
    created(http, acme, "The user works at Acme Corporation!")
    assert len(listed(http, acme)) == 2
