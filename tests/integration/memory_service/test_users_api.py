"""Users over HTTP (the app on real Postgres and Redis): a user's reads never return another
person's memory on any route, agent-wide memories come with every user's, a read without a user
returns neither user's; a session's user is set once; user-bound tokens reach their user's rows
only; forgetting a user takes their memories out of every read at once."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from memory_service.tokens.store import TokenStore
from tests.integration.memory_service.helpers import Tenant, make_token

ALL_SCOPES = ["memory:read", "memory:write", "sessions:read", "sessions:write"]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def bound_token(db: Any, org_id: uuid.UUID, user_id: uuid.UUID, scopes: list[str]) -> str:
    _, token = TokenStore(db).issue(org_id=org_id, name="bound", scopes=scopes, user_id=user_id)
    return token


class World:
    """acme's agent with Dana's and Grace's sessions and memories, and one agent-wide memory."""

    def __init__(self, http: httpx.Client, db: Any, acme: Tenant) -> None:
        self.http = http
        self.acme = acme
        self.token = make_token(db, acme.org_id, ALL_SCOPES)[0]
        self.admin = make_token(db, acme.org_id, ["memory:read", "memory:admin"])[0]
        opened = http.post(
            "/v1/sessions",
            json={"agent_id": str(acme.agent_id), "external_id": "dana-1", "user": "dana-17"},
            headers=auth(self.token),
        )
        assert opened.status_code == 201, opened.text
        self.dana_session = uuid.UUID(opened.json()["id"])
        self.dana = uuid.UUID(opened.json()["user_id"])
        # Grace's user comes in the header.
        opened = http.post(
            "/v1/sessions",
            json={"agent_id": str(acme.agent_id), "external_id": "grace-1"},
            headers={**auth(self.token), "X-IBEX-User-ID": "grace-04"},
        )
        assert opened.status_code == 201, opened.text
        self.grace_session = uuid.UUID(opened.json()["id"])
        self.grace = uuid.UUID(opened.json()["user_id"])
        self.dana_memory = self.write("The user is allergic to soy.", self.dana_session, "dana-17")
        self.grace_memory = self.write(
            "The user is allergic to latex.", self.grace_session, None, user_id=self.grace
        )
        self.shared_memory = self.write("Support answers allergic questions kindly.", None, None)

    def write(
        self,
        content: str,
        session: uuid.UUID | None,
        user: str | None,
        user_id: uuid.UUID | None = None,
        token: str | None = None,
    ) -> uuid.UUID:
        body: dict[str, Any] = {"agent_id": str(self.acme.agent_id), "content": content}
        if session is not None:
            body["source"] = {"session_id": str(session), "turn_index": 1, "ordinal": 0}
        if user is not None:
            body["user"] = user
        if user_id is not None:
            body["user_id"] = str(user_id)
        answer = self.http.post("/v1/memories", json=body, headers=auth(token or self.token))
        assert answer.status_code == 201, answer.text
        return uuid.UUID(answer.json()["id"])

    def reads(self, token: str | None = None, **who: Any) -> dict[str, set[uuid.UUID]]:
        """The memory ids every read route returns for the same user fields."""
        headers = auth(token or self.token)
        who = {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in who.items()}
        params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in who.items()}
        agent = str(self.acme.agent_id)
        listed = self.http.get(
            "/v1/memories", params={"agent_id": agent, **params}, headers=headers
        )
        assert listed.status_code == 200, listed.text
        searched = self.http.post(
            "/v1/memories/search",
            json={"agent_id": agent, "query": "allergic", **who},
            headers=headers,
        )
        assert searched.status_code == 200, searched.text
        context = self.http.post(
            "/v1/context", json={"agent_id": agent, "query": "allergic", **who}, headers=headers
        )
        assert context.status_code == 200, context.text
        got = set()
        for memory_id in (self.dana_memory, self.grace_memory, self.shared_memory):
            one = self.http.get(f"/v1/memories/{memory_id}", params=params, headers=headers)
            assert one.status_code in (200, 404), one.text
            if one.status_code == 200:
                got.add(memory_id)
        return {
            "list": {uuid.UUID(m["id"]) for m in listed.json()["items"]},
            "search": {uuid.UUID(m["id"]) for m in searched.json()["items"]},
            "context": {uuid.UUID(m["id"]) for m in context.json()["memories"]},
            "get": got,
        }


def every_route(ids: set[uuid.UUID]) -> dict[str, set[uuid.UUID]]:
    return {"list": ids, "search": ids, "context": ids, "get": ids}


@pytest.fixture
def world(http: httpx.Client, db: Any, acme: Tenant) -> World:
    return World(http, db, acme)


def test_each_user_reads_their_own_and_the_agent_wide_memories_on_every_route(
    world: World,
) -> None:
    dana, grace, shared = world.dana_memory, world.grace_memory, world.shared_memory
    assert world.reads(user="dana-17") == every_route({dana, shared})
    assert world.reads(user_id=world.dana) == every_route({dana, shared})
    assert world.reads(user="grace-04") == every_route({grace, shared})
    assert world.reads(user="dana-17", include_shared=False) == every_route({dana})
    # No user: the agent-wide memories only, never a person's.
    assert world.reads() == every_route({shared})
    # A key no user has (never created by a read) and an id of nobody: the agent-wide ones.
    assert world.reads(user="nobody-yet") == every_route({shared})
    assert world.reads(user="nobody-yet", include_shared=False) == every_route(set())
    assert world.reads(user_id=uuid.uuid4()) == every_route({shared})
    # Every user's: only with memory:admin.
    assert world.reads(world.admin, all_users=True) == every_route({dana, grace, shared})
    refused = world.http.post(
        "/v1/memories/search",
        json={"agent_id": str(world.acme.agent_id), "query": "allergic", "all_users": True},
        headers=auth(world.token),
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "INSUFFICIENT_SCOPE"


def test_memories_and_sessions_answer_with_their_user(world: World) -> None:
    one = world.http.get(
        f"/v1/memories/{world.dana_memory}", params={"user": "dana-17"}, headers=auth(world.token)
    )
    assert one.json()["user_id"] == str(world.dana)
    shared = world.http.get(f"/v1/memories/{world.shared_memory}", headers=auth(world.token))
    assert shared.json()["user_id"] is None
    session = world.http.get(f"/v1/sessions/{world.grace_session}", headers=auth(world.token))
    assert session.json()["user_id"] == str(world.grace)


def test_an_external_id_names_a_session_per_user_and_a_memory_of_it_carries_that_user(
    world: World,
) -> None:
    again = world.http.post(
        "/v1/sessions",
        json={"agent_id": str(world.acme.agent_id), "external_id": "dana-1", "user": "dana-17"},
        headers=auth(world.token),
    )
    assert again.status_code == 200
    other = world.http.post(
        "/v1/sessions",
        json={"agent_id": str(world.acme.agent_id), "external_id": "dana-1", "user": "grace-04"},
        headers=auth(world.token),
    )
    # An external id names a session per user: Grace's "dana-1" is a session of her own.
    assert other.status_code == 201, other.text
    assert other.json()["id"] != again.json()["id"]
    assert other.json()["user_id"] != again.json()["user_id"]
    differs = world.http.post(
        "/v1/sessions",
        json={"agent_id": str(world.acme.agent_id), "external_id": "x", "user": "dana-17"},
        headers={**auth(world.token), "X-IBEX-User-ID": "grace-04"},
    )
    assert differs.status_code == 422
    unknown = world.http.post(
        "/v1/sessions",
        json={"agent_id": str(world.acme.agent_id), "user_id": str(uuid.uuid4())},
        headers=auth(world.token),
    )
    assert unknown.status_code == 422 and "user_id" in unknown.json()["error"]["fields"]
    # A memory of Dana's session that names Grace (or nobody) is refused.
    for user in ({"user": "grace-04"}, {}):
        wrong = world.http.post(
            "/v1/memories",
            json={
                "agent_id": str(world.acme.agent_id),
                "content": "Something else entirely.",
                "source": {"session_id": str(world.dana_session), "turn_index": 2},
                **user,
            },
            headers=auth(world.token),
        )
        assert wrong.status_code == 422, wrong.text


def test_the_same_key_with_another_user_conflicts_and_with_the_same_user_replays(
    world: World,
) -> None:
    body = {"agent_id": str(world.acme.agent_id), "content": "Likes green tea.", "user": "dana-17"}
    headers = {**auth(world.token), "X-Idempotency-Key": "tea-1"}
    first = world.http.post("/v1/memories", json=body, headers=headers)
    assert first.status_code == 201 and first.json()["user_id"] == str(world.dana)
    by_id = {**body, "user": None, "user_id": str(world.dana)}
    replay = world.http.post("/v1/memories", json=by_id, headers=headers)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    other = world.http.post("/v1/memories", json={**body, "user": "grace-04"}, headers=headers)
    assert other.status_code == 409 and other.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"


def test_a_user_bound_token_reaches_only_its_users_rows(world: World, db: Any) -> None:
    dana = bound_token(db, world.acme.org_id, world.dana, [*ALL_SCOPES, "users:delete"])
    headers = auth(dana)
    dana_only, shared = world.dana_memory, world.shared_memory
    # Every read acts as if Dana were named, naming her is fine.
    assert world.reads(dana) == every_route({dana_only, shared})
    assert world.reads(dana, user="dana-17") == every_route({dana_only, shared})
    assert world.reads(dana, include_shared=False) == every_route({dana_only})
    # Naming anyone else, or everyone, is refused.
    for who in ({"user": "grace-04"}, {"user_id": str(world.grace)}, {"all_users": True}):
        refused = world.http.post(
            "/v1/memories/search",
            json={"agent_id": str(world.acme.agent_id), "query": "allergic", **who},
            headers=headers,
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "FORBIDDEN_USER"
    # Grace's memory and session are not found on any route.
    memory = f"/v1/memories/{world.grace_memory}"
    session = f"/v1/sessions/{world.grace_session}"
    assert world.http.get(memory, headers=headers).status_code == 404
    assert world.http.delete(memory, headers=headers).status_code == 404
    assert world.http.delete(f"/v1/memories/{shared}", headers=headers).status_code == 404
    assert world.http.get(session, headers=headers).status_code == 404
    assert world.http.delete(session, headers=headers).status_code == 404
    for action in ("complete", "abandon"):
        assert world.http.post(f"{session}/{action}", headers=headers).status_code == 404
    turn = {
        "turn_index": 1,
        "messages": [{"role": "user", "content": "hi"}],
        "completion": {"role": "assistant", "content": "hello"},
    }
    appended = world.http.post(f"{session}/turns", json={"turns": [turn]}, headers=headers)
    assert appended.status_code == 404
    listed = world.http.get("/v1/sessions", headers=headers).json()["items"]
    assert {s["id"] for s in listed} == {str(world.dana_session)}
    own = world.http.get(f"/v1/sessions/{world.dana_session}", headers=headers)
    assert own.status_code == 200
    # A memory written with the token is Dana's; another user's name is refused.
    written = world.write("Prefers email over phone.", None, None, token=dana)
    assert world.http.get(f"/v1/memories/{written}", headers=headers).json()["user_id"] == str(
        world.dana
    )
    forged = world.http.post(
        "/v1/memories",
        json={"agent_id": str(world.acme.agent_id), "content": "x y z", "user": "grace-04"},
        headers=headers,
    )
    assert forged.status_code == 403
    # It may forget its own user only: Grace is not found.
    assert world.http.delete("/v1/users/grace-04", headers=headers).status_code == 404
    assert world.reads(user="grace-04")["list"] == {world.grace_memory, shared}
    # Still there: Grace's memories unchanged, the session untouched.
    assert world.http.get(session, headers=auth(world.token)).json()["status"] == "active"


def test_forgetting_a_user_takes_their_memories_out_of_every_read_at_once(
    world: World, db: Any
) -> None:
    dana_token = bound_token(db, world.acme.org_id, world.dana, ["memory:read"])
    forgetter = make_token(db, world.acme.org_id, ["users:delete"])[0]
    assert world.http.delete("/v1/users/dana-17", headers=auth(world.token)).status_code == 403
    answer = world.http.delete("/v1/users/dana-17", headers=auth(forgetter))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"user_id": str(world.dana), "sessions": 1, "memories": 1, "tokens": 1}
    shared = world.shared_memory
    assert world.reads(user_id=world.dana) == every_route({shared})
    assert world.reads(user="dana-17") == every_route({shared})
    assert world.reads(world.admin, all_users=True) == every_route({world.grace_memory, shared})
    gone = world.http.get(f"/v1/sessions/{world.dana_session}", headers=auth(world.token))
    assert gone.status_code == 404
    # Again: no such user (by key or by id). Her token is revoked (after the auth cache).
    assert world.http.delete("/v1/users/dana-17", headers=auth(forgetter)).status_code == 404
    assert world.http.delete(f"/v1/users/{world.dana}", headers=auth(forgetter)).status_code == 404
    time.sleep(0.6)
    revoked = world.http.get("/v1/memories", headers=auth(dana_token))
    assert revoked.status_code == 401
    # Grace by id: forgotten too; the agent-wide memory stays.
    by_id = world.http.delete(f"/v1/users/{world.grace}", headers=auth(forgetter))
    assert by_id.status_code == 200 and by_id.json()["memories"] == 1
    assert world.reads(world.admin, all_users=True) == every_route({shared})
