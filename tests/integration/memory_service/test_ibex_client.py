"""IbexClient against the real memory service in-process (WSGITransport over the real Postgres
and Redis): memories created, listed, read, searched, packed into context and deleted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ibex_client import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DuplicateContentError,
    IbexClient,
    InvalidRequestError,
    MemorySource,
    NotFoundError,
    PermissionDeniedError,
)
from tests.integration.memory_service.helpers import BASE_URL, Tenant, make_token


def client(app: Any, token: str, **kwargs: Any) -> IbexClient:
    return IbexClient(BASE_URL, token, transport=httpx.WSGITransport(app=app), **kwargs)


@pytest.fixture
def ibex(app: Any, acme: Tenant) -> Iterator[IbexClient]:
    with client(app, acme.writer) as c:
        yield c


def test_memories_round_trip_through_the_service(ibex: IbexClient, acme: Tenant) -> None:
    source = MemorySource(acme.session_id, turn_index=3, ordinal=0)
    allergy = ibex.create_memory(
        acme.agent_id,
        "Dana is allergic to peanuts.",
        source=source,
        metadata={"lang": "en"},
        idempotency_key="client-key-1",
    )
    assert allergy.org_id == acme.org_id and allergy.agent_id == acme.agent_id
    assert allergy.source == source and allergy.metadata == {"lang": "en"}
    # The same call again (a retry whose first answer was lost) is the same memory.
    again = ibex.create_memory(
        acme.agent_id,
        "Dana is allergic to peanuts.",
        source=source,
        metadata={"lang": "en"},
        idempotency_key="client-key-1",
    )
    assert again == allergy
    with pytest.raises(ConflictError) as conflict:
        ibex.create_memory(acme.agent_id, "Something else.", idempotency_key="client-key-1")
    assert conflict.value.code == "IDEMPOTENCY_CONFLICT"
    with pytest.raises(DuplicateContentError) as duplicate:
        ibex.create_memory(acme.agent_id, "  dana is ALLERGIC to peanuts. ")
    assert duplicate.value.existing_id == allergy.id

    lisbon = ibex.create_memory(acme.agent_id, "Dana lives in Lisbon.", kind="fact")
    tea = ibex.create_memory(acme.agent_id, "The user prefers tea.", kind="preference")

    assert ibex.get_memory(lisbon.id) == lisbon
    first = ibex.list_memories(agent_id=acme.agent_id, limit=2)
    assert len(first.items) == 2 and first.next_cursor is not None
    listed = list(ibex.iter_memories(agent_id=acme.agent_id, page_size=1))
    assert {m.id for m in listed} == {allergy.id, lisbon.id, tea.id} and len(listed) == 3
    assert [m.id for m in ibex.iter_memories(session_id=acme.session_id)] == [allergy.id]

    hits = ibex.search("what is Dana allergic to?", agent_id=acme.agent_id)
    assert hits[0].memory == allergy
    assert 0 < hits[0].score <= 1 and hits[0].signals.text > 0
    assert "<mark>" in hits[0].snippet
    # The kinds filter: the preference is not a fact. What a ranked search still shows are
    # the facts nearest "tea" by meaning, sharing no word with it, at a low score; a caller
    # who wants only relevant hits asks for a min_score.
    facts = ibex.search("tea", agent_id=acme.agent_id, kinds=["fact"])
    assert tea.id not in {h.memory.id for h in facts}
    assert all(h.memory.kind == "fact" and h.signals.text == 0 for h in facts)
    assert all(h.score < 0.3 for h in facts)
    assert ibex.search("tea", agent_id=acme.agent_id, kinds=["fact"], min_score=0.3) == ()
    assert ibex.search("tea", agent_id=acme.agent_id)[0].memory.id == tea.id

    context = ibex.context(acme.agent_id, query="What is Dana allergic to?", max_tokens=400)
    assert context.context.startswith("<memories>\n- Dana is allergic to peanuts.")
    assert context.memories[0].memory.id == allergy.id
    assert 0 < context.tokens <= 400
    by_messages = ibex.context(
        acme.agent_id, messages=[{"role": "user", "content": "What is Dana allergic to?"}]
    )
    assert by_messages.memories[0].memory.id == allergy.id

    assert ibex.delete_memory(allergy.id) is True
    assert ibex.delete_memory(allergy.id) is False
    with pytest.raises(NotFoundError):
        ibex.get_memory(allergy.id)
    assert allergy.id not in {m.id for m in ibex.iter_memories(agent_id=acme.agent_id)}
    assert allergy.id not in {h.memory.id for h in ibex.search("peanuts", agent_id=acme.agent_id)}


def test_another_orgs_memory_is_not_found(app: Any, acme: Tenant, globex: Tenant) -> None:
    with client(app, acme.writer) as mine, client(app, globex.writer) as theirs:
        memory = mine.create_memory(acme.agent_id, "Dana is allergic to peanuts.")
        with pytest.raises(NotFoundError):
            theirs.get_memory(memory.id)
        assert theirs.delete_memory(memory.id) is False
        assert mine.get_memory(memory.id) == memory


def test_a_service_token_acts_for_the_org_named_by_the_client(
    app: Any, store: Any, acme: Tenant
) -> None:
    token, _ = make_token(store.db, None, ["memory:read", "memory:write"])
    with client(app, token, org_id=acme.org_id) as service:
        memory = service.create_memory(acme.agent_id, "Dana lives in Lisbon.")
        assert memory.org_id == acme.org_id
    with client(app, token) as no_org, pytest.raises(BadRequestError) as caught:
        no_org.get_memory(memory.id)
    assert caught.value.code == "ORG_REQUIRED"


def test_server_errors_arrive_typed_with_their_code(app: Any, acme: Tenant) -> None:
    with client(app, acme.reader) as reader, pytest.raises(PermissionDeniedError) as scope:
        reader.create_memory(acme.agent_id, "Dana is allergic to peanuts.")
    assert scope.value.code == "INSUFFICIENT_SCOPE"
    with client(app, "ibex_not_a_token") as stranger, pytest.raises(AuthenticationError):
        stranger.search("peanuts", agent_id=acme.agent_id)
    with client(app, acme.writer) as ibex, pytest.raises(InvalidRequestError) as invalid:
        ibex.create_memory(uuid.uuid4(), "Dana is allergic to peanuts.")
    assert invalid.value.fields == {"agent_id": ["unknown agent for this org"]}


def test_supersession_through_the_client(ibex: IbexClient, acme: Tenant) -> None:
    lisbon = ibex.create_memory(acme.agent_id, "Dana lives in Lisbon.")
    assert lisbon.current and lisbon.valid_from is not None
    # The body without supersedes is the body of before: no supersedes key is sent.
    oslo = ibex.create_memory(acme.agent_id, "Dana lives in Oslo.", supersedes=[lisbon.id])
    assert [m.id for m in ibex.list_memories(agent_id=acme.agent_id).items] == [oslo.id]
    every = {m.id: m for m in ibex.iter_memories(agent_id=acme.agent_id, include_superseded=True)}
    assert every[lisbon.id].superseded_by == oslo.id
    assert [m.id for m in ibex.history(lisbon.id)] == [lisbon.id, oslo.id]
    hits = ibex.search("Dana lives", agent_id=acme.agent_id, include_superseded=True)
    assert {h.memory.id for h in hits} >= {lisbon.id, oslo.id}
    context = ibex.context(acme.agent_id, query="Where does Dana live?")
    assert "Lisbon" not in context.context
    with pytest.raises(InvalidRequestError):
        ibex.create_memory(acme.agent_id, "Dana lives in Rome.", supersedes=[lisbon.id])
    with pytest.raises(DuplicateContentError) as caught:
        ibex.create_memory(acme.agent_id, "dana lives in oslo")
    assert caught.value.existing_id == oslo.id
