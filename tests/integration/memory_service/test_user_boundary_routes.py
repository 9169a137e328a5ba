"""The user boundary, route by route: what a token gets for another person's object (or, for a
user-bound token, an agent-wide one) is exactly what it gets for an id nobody has, on every
route that names a session, a memory or a user. So no answer tells a person that someone else
holds an external id, a session or a memory: not by status, not by code, not by message.

Alice's token is bound to alice; bob owns a session and a memory; the agent also has an
agent-wide session and memory. Each case asks the same route three ways (bob's object, the
agent-wide object where the rule covers it, and a fresh id) and compares the answers with the
ids taken out."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.memory_service.helpers import Tenant, make_token
from tests.integration.memory_service.test_users_api import auth, bound_token

ALL_SCOPES = ["memory:read", "memory:write", "sessions:read", "sessions:write", "users:delete"]


class People:
    """bob's session and memory, an agent-wide session and memory, and alice's bound token."""

    def __init__(self, http: httpx.Client, db: Any, acme: Tenant) -> None:
        self.http = http
        self.agent = str(acme.agent_id)
        self.org = make_token(db, acme.org_id, ALL_SCOPES)[0]
        bob = self.open("bob-conv", user="bob")
        self.bob_session, self.bob = bob["id"], bob["user_id"]
        self.shared_session = self.open("shared-conv")["id"]
        alice = self.open("alice-conv", user="alice")
        self.alice_session, self.alice = alice["id"], alice["user_id"]
        self.alice_token = bound_token(db, acme.org_id, uuid.UUID(self.alice), ALL_SCOPES)
        self.bob_memory = self.remember("Bob is allergic to shellfish.", self.bob_session, "bob")
        self.shared_memory = self.remember("Support answers in English.", self.shared_session)

    def open(self, external_id: str, user: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"agent_id": self.agent, "external_id": external_id}
        if user is not None:
            body["user"] = user
        answer = self.http.post("/v1/sessions", json=body, headers=auth(self.org))
        assert answer.status_code == 201, answer.text
        turn = {
            "turn_index": 1,
            "messages": [{"role": "user", "content": f"hello from {external_id}"}],
            "completion": {"role": "assistant", "content": "hi"},
        }
        appended = self.http.post(
            f"/v1/sessions/{answer.json()['id']}/turns",
            json={"turns": [turn]},
            headers=auth(self.org),
        )
        assert appended.status_code == 201, appended.text
        return dict(answer.json())

    def remember(self, content: str, session: str, user: str | None = None) -> str:
        body: dict[str, Any] = {
            "agent_id": self.agent,
            "content": content,
            "source": {"session_id": session, "turn_index": 1, "ordinal": 0},
        }
        if user is not None:
            body["user"] = user
        answer = self.http.post("/v1/memories", json=body, headers=auth(self.org))
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])


@pytest.fixture
def people(http: httpx.Client, db: Any, acme: Tenant) -> People:
    return People(http, db, acme)


def answer(response: httpx.Response, *ids: str) -> tuple[int, Any]:
    """Status and body with the given ids replaced by one placeholder."""
    text = response.text
    for value in ids:
        text = text.replace(value, "<id>")
    try:
        return response.status_code, json.loads(text)
    except ValueError:
        return response.status_code, text


def same_for_all(call: Any, *objects: str) -> tuple[int, Any]:
    """``call(id)`` for each object and for a fresh id: one answer, whatever the id."""
    fresh = str(uuid.uuid4())
    answers = [answer(call(x), x) for x in (*objects, fresh)]
    assert all(a == answers[-1] for a in answers), answers
    return answers[-1]


def test_session_routes_answer_a_bound_token_as_for_an_unknown_session(people: People) -> None:
    http, token = people.http, auth(people.alice_token)
    turn = {
        "turn_index": 2,
        "messages": [{"role": "user", "content": "mine now"}],
        "completion": {"role": "assistant", "content": "no"},
    }
    for method, suffix, body in [
        ("GET", "", None),
        ("GET", "/turns", None),
        ("POST", "/turns", {"turns": [turn]}),
        ("POST", "/complete", None),
        ("POST", "/abandon", None),
        ("DELETE", "", None),
    ]:
        status, _ = same_for_all(
            lambda s, m=method, x=suffix, b=body: http.request(
                m, f"/v1/sessions/{s}{x}", json=b, headers=token
            ),
            people.bob_session,
            people.shared_session,
        )
        assert status == 404, (method, suffix)
    # Nothing was changed through those calls: bob's and the shared session are as they were.
    for session in (people.bob_session, people.shared_session):
        got = http.get(f"/v1/sessions/{session}", headers=auth(people.org)).json()
        assert got["turn_count"] == 1 and got["status"] == "active"


def test_an_external_id_opens_a_bound_tokens_own_session_whoever_else_uses_it(
    people: People,
) -> None:
    http, token = people.http, auth(people.alice_token)
    answers = []
    for external_id in ("bob-conv", "shared-conv", f"unused-{uuid.uuid4().hex[:8]}"):
        body = {"agent_id": people.agent, "external_id": external_id}
        opened = http.post("/v1/sessions", json=body, headers=token)
        body = opened.json()
        answers.append((opened.status_code, body["user_id"], body["turn_count"], body["status"]))
        assert body["id"] not in (people.bob_session, people.shared_session)
    assert answers == [(201, people.alice, 0, "active")] * 3
    # The header does the same; listing by external id shows alice her own only.
    opened = http.post(
        "/v1/sessions",
        json={"agent_id": people.agent},
        headers={**token, "X-IBEX-Session-ID": "bob-conv"},
    )
    assert opened.status_code == 200 and opened.json()["user_id"] == people.alice
    listed = http.get("/v1/sessions", params={"external_id": "bob-conv"}, headers=token).json()
    assert [s["user_id"] for s in listed["items"]] == [people.alice]
    # The agent-wide session was not claimed, bob's kept its user.
    shared = http.get(f"/v1/sessions/{people.shared_session}", headers=auth(people.org)).json()
    assert shared["user_id"] is None
    bobs = http.get(f"/v1/sessions/{people.bob_session}", headers=auth(people.org)).json()
    assert bobs["user_id"] == people.bob


def test_memory_routes_answer_as_for_an_unknown_memory(people: People) -> None:
    http = people.http
    for token, objects in [
        # alice's token: bob's memory, and the agent-wide one for changes
        (auth(people.alice_token), (people.bob_memory,)),
        # an org token that names no user: a person's memory is not its to read or delete
        (auth(people.org), (people.bob_memory,)),
    ]:
        for method, suffix in [("GET", ""), ("GET", "/history"), ("DELETE", "")]:
            status, _ = same_for_all(
                lambda m, x=suffix, meth=method, t=token: http.request(
                    meth, f"/v1/memories/{m}{x}", headers=t
                ),
                *objects,
            )
            assert status == 404, (method, suffix)
    # A bound token deletes its own memories only, not the agent-wide ones everyone shares.
    status, _ = same_for_all(
        lambda m: http.delete(f"/v1/memories/{m}", headers=auth(people.alice_token)),
        people.shared_memory,
    )
    assert status == 404
    # Nothing was deleted: bob reads his memory, everyone the agent-wide one.
    kept = http.get(
        f"/v1/memories/{people.bob_memory}", params={"user": "bob"}, headers=auth(people.org)
    )
    assert kept.status_code == 200
    assert http.get(f"/v1/memories/{people.shared_memory}", headers=auth(people.org)).is_success
    # Naming the person (or memory:admin) is what lets an org token delete a person's memory.
    gone = http.delete(
        f"/v1/memories/{people.bob_memory}", params={"user": "bob"}, headers=auth(people.org)
    )
    assert gone.status_code == 204


def test_a_write_naming_another_persons_objects_is_answered_as_naming_unknown_ones(
    people: People,
) -> None:
    http, token = people.http, auth(people.alice_token)

    def with_source(session: str) -> httpx.Response:
        body = {
            "agent_id": people.agent,
            "content": f"A note {uuid.uuid4().hex[:6]}.",
            "source": {"session_id": session, "turn_index": 1, "ordinal": 0},
        }
        return http.post("/v1/memories", json=body, headers=token)

    status, body = same_for_all(with_source, people.bob_session, people.shared_session)
    assert status == 422 and body["error"]["fields"] == {
        "source": {"session_id": ["unknown session for this org"]}
    }

    def superseding(memory: str) -> httpx.Response:
        body = {"agent_id": people.agent, "content": "A fact.", "supersedes": [memory]}
        return http.post("/v1/memories", json=body, headers=token)

    status, _ = same_for_all(superseding, people.bob_memory, people.shared_memory)
    assert status == 422


def test_forgetting_another_user_is_answered_as_an_unknown_user(people: People) -> None:
    http, token = people.http, auth(people.alice_token)
    status, _ = same_for_all(lambda u: http.delete(f"/v1/users/{u}", headers=token), "bob")
    assert status == 404
    assert http.get(f"/v1/sessions/{people.bob_session}", headers=auth(people.org)).is_success


def test_reads_of_a_bound_token_never_hold_another_persons_memory(people: People) -> None:
    http, token = people.http, auth(people.alice_token)
    mine = http.post(
        "/v1/memories",
        json={"agent_id": people.agent, "content": "Alice is allergic to shellfish too."},
        headers=token,
    )
    assert mine.status_code == 201, mine.text
    for path, body in [
        ("/v1/memories/search", {"agent_id": people.agent, "query": "allergic to shellfish"}),
        ("/v1/context", {"agent_id": people.agent, "query": "allergic to shellfish"}),
    ]:
        got = http.post(path, json=body, headers=token)
        assert got.status_code == 200, got.text
        items = got.json().get("items") or got.json().get("memories")
        assert {m["user_id"] for m in items} <= {people.alice, None}
        assert people.bob_memory not in {m["id"] for m in items}
    listed = http.get(
        "/v1/memories",
        params={"agent_id": people.agent, "session_id": people.bob_session},
        headers=token,
    )
    assert listed.status_code == 200 and listed.json()["items"] == []
