"""The sessions API in-process over the real Postgres and Redis: opening, appending turns
(replay, conflict, gap), status changes, reads with progress, deletion with the session's
memories, tenancy, scopes and concurrent appends."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import pytest

from core.db import make_database, tenant
from memories.canonical import content_hash
from memories.store import MemoryStore, NewMemory
from schema.memory import ErrorSchema
from schema.sessions import SessionPageSchema, SessionSchema, TurnsAppendedSchema
from sessions.store import SessionStore
from sessions.turns import content_digest
from tests.integration.memory_service.helpers import BASE_URL, Tenant, make_token
from tests.integration.pipeline.helpers import wait_for

SESSION_SCOPES = ["sessions:read", "sessions:write", "memory:read", "memory:write"]


def turn(i: int, text: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "turn_index": i,
        "messages": [{"role": "user", "content": text or f"I like colour number {i}."}],
        "completion": {"role": "assistant", "content": f"Noted: {i}."},
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "latency_ms": 100,
        **extra,
    }


def auth(token: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **headers}


@pytest.fixture
def acme_token(db: Any, acme: Tenant) -> str:
    return make_token(db, acme.org_id, SESSION_SCOPES)[0]


@pytest.fixture
def globex_token(db: Any, globex: Tenant) -> str:
    return make_token(db, globex.org_id, SESSION_SCOPES)[0]


def open_session(http: httpx.Client, token: str, external_id: str | None = "conv-1") -> str:
    body: dict[str, Any] = {
        "agent": "support-bot",
        "external_id": external_id,
        "create_agent": True,
    }
    response = http.post("/v1/sessions", json=body, headers=auth(token))
    assert response.status_code in (200, 201), response.text
    return str(response.json()["id"])


def append(http: httpx.Client, token: str, session_id: str, *turns: dict[str, Any]):  # type: ignore[no-untyped-def]
    return http.post(
        f"/v1/sessions/{session_id}/turns", json={"turns": list(turns)}, headers=auth(token)
    )


def stored_turns(db: Any, session_id: str) -> list[tuple[int, str, str, Any]]:
    """Checkpoints with their archived content, as the owner sees them."""
    return [
        (int(r[0]), r[1], r[2], r[3])
        for r in db.execute_sql(
            "SELECT c.turn_index, c.messages_hash, c.completion_hash, p.messages"
            "  FROM ibex_core.checkpoints c"
            "  JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id"
            " WHERE c.session_id = %s ORDER BY c.turn_index",
            (session_id,),
        ).fetchall()
    ]


def test_open_creates_once_per_external_id(http: httpx.Client, acme: Tenant, acme_token: str):  # type: ignore[no-untyped-def]
    first = http.post(
        "/v1/sessions",
        json={
            "agent": "support-bot",
            "create_agent": True,
            "external_id": "conv-42",
            "model": "gpt-4o-mini",
        },
        headers=auth(acme_token),
    )
    assert first.status_code == 201, first.text
    session = SessionSchema().load(first.json())
    assert session["status"] == "active" and session["turn_count"] == 0
    assert session["progress"] == {"done": 0, "pending": 0, "failed": 0, "pointer": 0}
    assert first.headers["Location"] == f"/v1/sessions/{session['id']}"
    # The same external id, in the header this time, and the agent by id: the same session.
    again = http.post(
        "/v1/sessions",
        json={"agent_id": str(session["agent_id"])},
        headers=auth(acme_token, **{"X-IBEX-Session-ID": "conv-42"}),
    )
    assert again.status_code == 200, again.text
    assert again.json()["id"] == str(session["id"])
    # Without an external id, every call opens a new session.
    assert open_session(http, acme_token, None) != open_session(http, acme_token, None)


@pytest.mark.parametrize(
    ("body", "headers", "field"),
    [
        ({"external_id": "x"}, {}, "agent"),
        ({"agent": "bot", "agent_id": str(uuid.uuid4())}, {}, "agent"),
        ({"agent": "Not A Slug"}, {}, "agent"),
        ({"agent": "bot", "create_agent": "maybe"}, {}, "create_agent"),
        ({"agent": "bot", "external_id": "a"}, {"X-IBEX-Session-ID": "b"}, "external_id"),
        ({"agent": "bot", "external_id": "bad\u0000id"}, {}, "external_id"),
        ({"agent": "bot", "surprise": 1}, {}, "surprise"),
    ],
)
def test_open_rejects_field_by_field(  # type: ignore[no-untyped-def]
    http: httpx.Client, acme_token: str, body: dict[str, Any], headers: dict[str, str], field: str
):
    response = http.post("/v1/sessions", json=body, headers=auth(acme_token, **headers))
    assert response.status_code == 422, response.text
    error = ErrorSchema().load(response.json())["error"]
    assert error["code"] == "VALIDATION_FAILED" and field in error["fields_"]


def test_an_unknown_agent_is_refused_unless_asked_to_create_it(
    http: httpx.Client, db: Any, acme: Tenant, acme_token: str
) -> None:
    def agents() -> list[str]:
        return sorted(
            r[0]
            for r in db.execute_sql(
                "SELECT slug FROM ibex_core.agents WHERE org_id = %s", (str(acme.org_id),)
            ).fetchall()
        )

    before = agents()
    for body in (
        {"agent": "suport-bot", "external_id": "typo"},
        {"agent": "suport-bot", "create_agent": False},
        {"agent_id": str(uuid.uuid4())},
    ):
        response = http.post("/v1/sessions", json=body, headers=auth(acme_token))
        assert response.status_code == 404, response.text
        error = ErrorSchema().load(response.json())["error"]
        assert error["code"] == "UNKNOWN_AGENT"
        named = body.get("agent", body.get("agent_id"))
        assert error["message"] == f"no agent {named!r} in this org"
    assert agents() == before  # the typo created nothing
    # An existing agent by slug needs no flag; a new one is made when asked.
    existing = http.post("/v1/sessions", json={"agent": "bot"}, headers=auth(acme_token))
    assert existing.status_code == 201 and existing.json()["agent_id"] == str(acme.agent_id)
    made = http.post(
        "/v1/sessions", json={"agent": "new-bot", "create_agent": True}, headers=auth(acme_token)
    )
    assert made.status_code == 201, made.text
    assert agents() == sorted([*before, "new-bot"])
    # Reading the sessions of an agent the org does not have is a 404 too, not an empty page.
    listed = http.get(
        "/v1/sessions", params={"agent_id": str(uuid.uuid4())}, headers=auth(acme_token)
    )
    assert (listed.status_code, listed.json()["error"]["code"]) == (404, "UNKNOWN_AGENT")


def test_append_replay_conflict_gap_table(http: httpx.Client, db: Any, acme_token: str) -> None:
    """Each row is one request against the same session, in order: what it answers and how
    many turns the session then holds."""
    session_id = open_session(http, acme_token)
    table: list[tuple[list[dict[str, Any]], int, str | None, dict[str, Any], int]] = [
        ([turn(1), turn(2)], 201, None, {"turns_added": 2}, 2),
        ([turn(1), turn(2)], 200, None, {"turns_added": 0}, 2),  # a retry: a replay
        ([turn(2), turn(3)], 201, None, {"turns_added": 1}, 3),  # overlap: only 3 is new
        ([turn(2, "I like something else.")], 409, "TURN_CONFLICT", {"turn_index": 2}, 3),
        ([turn(4), turn(3)], 422, "VALIDATION_FAILED", {}, 3),  # out of order
        ([turn(5)], 409, "TURN_GAP", {"expected_turn_index": 4}, 3),
        ([turn(0)], 422, "VALIDATION_FAILED", {}, 3),
        ([turn(4, "nul \u0000 here")], 422, "VALIDATION_FAILED", {}, 3),
        ([turn(4, is_complete=False, is_streaming=True)], 201, None, {"turns_added": 1}, 4),
        ([turn(3), turn(4, "edited 4")], 409, "TURN_CONFLICT", {"turn_index": 4}, 4),
    ]
    for number, (turns, status, code, extra, count) in enumerate(table):
        response = append(http, acme_token, session_id, *turns)
        assert response.status_code == status, (number, response.text)
        body = response.json()
        if code is None:
            loaded = TurnsAppendedSchema().load(body)
            assert loaded["turns_added"] == extra["turns_added"], number
            assert loaded["session"]["turn_count"] == count, number
            replayed = response.headers.get("Idempotent-Replayed")
            assert replayed == ("true" if extra["turns_added"] == 0 else None), number
        else:
            error = ErrorSchema().load(body)["error"]
            assert error["code"] == code, (number, body)
            for name, value in extra.items():
                assert error[name] == value, (number, body)
        stored = stored_turns(db, session_id)
        assert [t[0] for t in stored] == list(range(1, count + 1)), number
    # What is stored is what was sent first, hashed as the importer hashes it.
    for turn_index, messages_hash, completion_hash, messages in stored_turns(db, session_id):
        sent = turn(turn_index)
        assert messages == sent["messages"]
        assert messages_hash == content_digest(sent["messages"])
        assert completion_hash == content_digest(sent["completion"])
    flags = db.execute_sql(
        "SELECT is_complete, is_streaming FROM ibex_core.checkpoints"
        " WHERE session_id = %s AND turn_index = 4",
        (session_id,),
    ).fetchone()
    assert flags == (False, True)


def test_fifty_concurrent_appends_of_one_batch_store_it_once(  # type: ignore[no-untyped-def]
    app, db: Any, acme_token: str
) -> None:
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as client:
        session_id = open_session(client, acme_token)
    batch = [turn(1), turn(2), turn(3)]
    statuses: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(50)

    def post() -> None:
        with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as client:
            start.wait()
            response = append(client, acme_token, session_id, *batch)
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=post) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a request thread did not finish"
    assert sorted(statuses) == [200] * 49 + [201]
    assert [t[0] for t in stored_turns(db, session_id)] == [1, 2, 3]
    count = db.execute_sql(
        "SELECT turn_count, prompt_tokens FROM ibex_core.sessions WHERE id = %s", (session_id,)
    ).fetchone()
    assert count == (3, 30)  # the token totals were added once too


def test_complete_and_abandon_are_idempotent(http: httpx.Client, acme_token: str) -> None:
    session_id = open_session(http, acme_token)
    first = http.post(f"/v1/sessions/{session_id}/complete", headers=auth(acme_token))
    again = http.post(f"/v1/sessions/{session_id}/complete", headers=auth(acme_token))
    assert first.status_code == again.status_code == 200
    assert first.json()["status"] == again.json()["status"] == "completed"
    assert first.json()["completed_at"] == again.json()["completed_at"] is not None
    # Repeating the change changes nothing at all, updated_at included.
    assert first.json()["updated_at"] == again.json()["updated_at"]
    other = open_session(http, acme_token, "conv-2")
    for _ in range(2):
        response = http.post(f"/v1/sessions/{other}/abandon", headers=auth(acme_token))
        assert response.status_code == 200 and response.json()["status"] == "abandoned"
        assert response.json()["completed_at"] is None


def test_get_and_list_with_progress(http: httpx.Client, db: Any, acme: Tenant, acme_token: str):  # type: ignore[no-untyped-def]
    session_id = open_session(http, acme_token, "conv-progress")
    assert append(http, acme_token, session_id, turn(1), turn(2), turn(3)).status_code == 201
    http.post(f"/v1/sessions/{session_id}/complete", headers=auth(acme_token))
    # The pipeline's own state, as the stages leave it: turn 1 done (pointer 1), 2 failed.
    with tenant(db, acme.org_id):
        db.execute_sql(
            "INSERT INTO ibex_core.extraction_turns"
            " (org_id, session_id, turn_index, state, result, memory_count)"
            " VALUES (%s, %s, 1, 'done', '{\"memories\": []}', 0),"
            " (%s, %s, 2, 'failed', NULL, NULL), (%s, %s, 3, 'pending', NULL, NULL)",
            (str(acme.org_id), session_id) * 3,
        )
        db.execute_sql(
            "UPDATE ibex_core.sessions SET last_extracted_turn = 1 WHERE id = %s", (session_id,)
        )
    response = http.get(f"/v1/sessions/{session_id}", headers=auth(acme_token))
    assert response.status_code == 200
    session = SessionSchema().load(response.json())
    assert session["progress"] == {"done": 1, "pending": 1, "failed": 1, "pointer": 1}
    assert session["last_extracted_turn"] == 1 and session["turn_count"] == 3

    others = [open_session(http, acme_token, f"conv-{i}") for i in range(3)]
    pages: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, "agent_id": session["agent_id"]}
        if cursor:
            params["cursor"] = cursor
        page = http.get("/v1/sessions", params=params, headers=auth(acme_token))
        assert page.status_code == 200, page.text
        loaded = SessionPageSchema().load(page.json())
        pages.extend(str(s["id"]) for s in loaded["items"])
        cursor = loaded["next_cursor"]
        if cursor is None:
            break
    assert pages == list(reversed([session_id, *others]))  # newest first, each once
    completed = http.get(
        "/v1/sessions", params={"status": "completed"}, headers=auth(acme_token)
    ).json()
    # acme's fixture session (the memories' source) is completed too, with another agent.
    assert [s["id"] for s in completed["items"]] == [session_id, str(acme.session_id)]
    by_external = http.get(
        "/v1/sessions",
        params={"external_id": "conv-1", "agent_id": session["agent_id"]},
        headers=auth(acme_token),
    ).json()
    assert [s["id"] for s in by_external["items"]] == [others[1]]
    bad = http.get("/v1/sessions", params={"cursor": "nope"}, headers=auth(acme_token))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_CURSOR"
    bad = http.get("/v1/sessions", params={"status": "sleeping"}, headers=auth(acme_token))
    assert bad.status_code == 422 and "status" in bad.json()["error"]["fields"]


def write_memory(http: httpx.Client, token: str, agent_id: str, session_id: str, text: str) -> str:
    body = {
        "agent_id": agent_id,
        "content": text,
        "source": {"session_id": session_id, "turn_index": 1, "ordinal": 0},
    }
    response = http.post("/v1/memories", json=body, headers=auth(token))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_delete_removes_the_session_and_its_memories(  # type: ignore[no-untyped-def]
    http: httpx.Client, db: Any, acme_token: str
) -> None:
    doomed = http.post(
        "/v1/sessions",
        json={"agent": "bot-d", "external_id": "doomed", "create_agent": True},
        headers=auth(acme_token),
    ).json()
    kept = open_session(http, acme_token, "kept")
    agent_id = doomed["agent_id"]
    gone = write_memory(http, acme_token, agent_id, doomed["id"], "Dana is allergic to peanuts.")
    also_gone = write_memory(http, acme_token, agent_id, doomed["id"], "Dana lives in Lisbon.")
    stays = write_memory(http, acme_token, agent_id, kept, "Dana is allergic to shellfish.")

    response = http.delete(f"/v1/sessions/{doomed['id']}", headers=auth(acme_token))
    assert response.status_code == 204
    h = auth(acme_token)
    assert http.get(f"/v1/sessions/{doomed['id']}", headers=h).status_code == 404
    listed = [s["id"] for s in http.get("/v1/sessions", headers=h).json()["items"]]
    assert doomed["id"] not in listed and kept in listed
    for memory_id in (gone, also_gone):
        assert http.get(f"/v1/memories/{memory_id}", headers=h).status_code == 404
    assert http.get(f"/v1/memories/{stays}", headers=h).status_code == 200
    memories = http.get("/v1/memories", params={"agent_id": agent_id}, headers=h).json()
    assert [m["id"] for m in memories["items"]] == [stays]
    hits = http.post(
        "/v1/memories/search", json={"query": "Dana allergic", "agent_id": agent_id}, headers=h
    ).json()["items"]
    assert [hit["id"] for hit in hits] == [stays]
    # Gone for every other route too; deleting again finds nothing.
    assert http.delete(f"/v1/sessions/{doomed['id']}", headers=h).status_code == 404
    assert append(http, acme_token, doomed["id"], turn(1)).status_code == 404
    assert http.post(f"/v1/sessions/{doomed['id']}/complete", headers=h).status_code == 404
    reopened = http.post(
        "/v1/sessions",
        json={"agent": "bot-d", "external_id": "doomed", "create_agent": True},
        headers=h,
    )
    assert reopened.status_code == 409 and reopened.json()["error"]["code"] == "SESSION_DELETED"
    # A memory written afterwards for the deleted session (its extraction was in flight) is
    # accepted, so the writer does not retry it, and stored deleted.
    late = write_memory(http, acme_token, agent_id, doomed["id"], "Dana has a cat.")
    assert http.get(f"/v1/memories/{late}", headers=h).status_code == 404
    memories = http.get("/v1/memories", params={"agent_id": agent_id}, headers=h).json()
    assert [m["id"] for m in memories["items"]] == [stays]
    # Soft deletes: the rows are there, marked, in the same transaction's time.
    rows = db.execute_sql(
        "SELECT (SELECT deleted_at FROM ibex_core.sessions WHERE id = %s),"
        "       array_agg(DISTINCT deleted_at) FROM ibex_memory.memories WHERE session_id = %s",
        (doomed["id"], doomed["id"]),
    ).fetchone()
    assert rows[0] is not None and len(rows[1]) == 2 and rows[0] in rows[1]
    assert None not in rows[1]


def test_another_orgs_session_is_404_on_every_route(  # type: ignore[no-untyped-def]
    http: httpx.Client, acme_token: str, globex_token: str, acme: Tenant, globex: Tenant
) -> None:
    session_id = open_session(http, acme_token, "private")
    assert append(http, acme_token, session_id, turn(1)).status_code == 201
    memory_id = write_memory(
        http, acme_token, str(acme.agent_id), session_id, "Dana is allergic to peanuts."
    )
    theirs = auth(globex_token)
    one = f"/v1/sessions/{session_id}"
    answers = {
        "get": http.get(one, headers=theirs),
        "turns": append(http, globex_token, session_id, turn(2)),
        "complete": http.post(f"{one}/complete", headers=theirs),
        "abandon": http.post(f"{one}/abandon", headers=theirs),
        "delete": http.delete(one, headers=theirs),
        "memory": http.get(f"/v1/memories/{memory_id}", headers=theirs),
    }
    assert {k: r.status_code for k, r in answers.items()} == dict.fromkeys(answers, 404)
    assert all(r.json()["error"]["code"] == "NOT_FOUND" for r in answers.values())
    listed = http.get("/v1/sessions", headers=theirs).json()["items"]
    assert {s["org_id"] for s in listed} == {str(globex.org_id)}  # their own fixture session
    # Nor can an acme agent be named by id from globex.
    named = http.post("/v1/sessions", json={"agent_id": str(acme.agent_id)}, headers=theirs)
    assert (named.status_code, named.json()["error"]["code"]) == (404, "UNKNOWN_AGENT")
    # And acme's session is untouched.
    mine = http.get(one, headers=auth(acme_token)).json()
    assert mine["status"] == "active" and mine["turn_count"] == 1


def test_scopes(http: httpx.Client, db: Any, acme: Tenant, acme_token: str) -> None:
    session_id = open_session(http, acme_token)
    one = f"/v1/sessions/{session_id}"
    writes = [
        ("POST", "/v1/sessions", {"agent": "bot"}),
        ("POST", f"{one}/turns", {"turns": [turn(1)]}),
        ("POST", f"{one}/complete", None),
        ("POST", f"{one}/abandon", None),
        ("DELETE", one, None),
    ]
    reads = [("GET", "/v1/sessions", None), ("GET", one, None)]
    reader = make_token(db, acme.org_id, ["sessions:read"])[0]
    for token, allowed, refused in (
        (acme.writer, [], writes + reads),  # memory scopes only
        (reader, reads, writes),
    ):
        for method, path, body in refused:
            response = http.request(method, path, json=body, headers=auth(token))
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
        for method, path, body in allowed:
            assert http.request(method, path, json=body, headers=auth(token)).status_code == 200
    assert http.get(one).status_code == 401
    # A service token acting for an org that does not exist creates nothing.
    service = make_token(db, None, ["sessions:write"])[0]
    nowhere = auth(service, **{"X-IBEX-Org-ID": str(uuid.uuid4())})
    response = http.post("/v1/sessions", json={"agent": "ghost"}, headers=nowhere)
    assert response.status_code == 403 and response.json()["error"]["code"] == "FORBIDDEN_ORG"


def new_memory(agent_id: str, session_id: str, text: str) -> NewMemory:
    return NewMemory(
        agent_id=uuid.UUID(agent_id),
        content=text,
        content_hash=content_hash(text),
        kind="fact",
        metadata={},
        session_id=uuid.UUID(session_id),
        turn_index=1,
        ordinal=0,
        idempotency_key=None,
        fingerprint="",
    )


def lock_waiters(db: Any) -> int:
    """Backends of this database waiting on a lock now."""
    row = db.execute_sql(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0])


def test_a_memory_written_while_its_session_is_deleted_is_deleted_too(  # type: ignore[no-untyped-def]
    app, http: httpx.Client, database_url: str, acme: Tenant, acme_token: str, db
) -> None:
    """Both interleavings of a memory write (an extraction in flight) with DELETE, each held
    open at its commit point on its own connection: the memory ends up deleted either way."""
    opened = http.post(
        "/v1/sessions",
        json={"agent": "bot-r", "external_id": "race", "create_agent": True},
        headers=auth(acme_token),
    ).json()
    agent_id, session_id = opened["agent_id"], opened["id"]
    h = auth(acme_token)
    other = make_database(database_url)
    answers: list[int] = []

    def in_thread(call: Any) -> threading.Thread:
        def run() -> None:
            with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as c:
                answers.append(call(c).status_code)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    # 1. The write has inserted and not committed when DELETE comes: DELETE waits for it.
    with other.atomic():
        written = MemoryStore(other).create(
            acme.org_id, new_memory(agent_id, session_id, "Dana has a cat.")
        )
        assert written.row is not None
        deleting = in_thread(lambda c: c.delete(f"/v1/sessions/{session_id}", headers=h))
        # DELETE blocks on the write's lock of the session row.
        wait_for(lambda: lock_waiters(db) == 1, "DELETE to wait on the write's lock")
        assert deleting.is_alive()
    deleting.join(10)
    assert not deleting.is_alive()
    assert answers == [204]
    assert http.get(f"/v1/memories/{written.row.id}", headers=h).status_code == 404

    # 2. A deletion has run its statements and not committed when the write comes: the write
    # waits for it, then stores its memory deleted.
    second = http.post(
        "/v1/sessions",
        json={"agent": "bot-r", "external_id": "race-2", "create_agent": True},
        headers=h,
    ).json()["id"]
    sessions = SessionStore(other, bind_models=False)
    with tenant(other, acme.org_id):
        # (its memories are soft-deleted by the same statement's trigger)
        assert sessions.delete_live_session(acme.org_id, uuid.UUID(second))
        body = {
            "agent_id": agent_id,
            "content": "Dana has a dog.",
            "source": {"session_id": second, "turn_index": 1, "ordinal": 0},
        }
        writing = in_thread(lambda c: c.post("/v1/memories", json=body, headers=h))
        # The write blocks on the deletion's lock of the session row.
        wait_for(lambda: lock_waiters(db) == 1, "the write to wait on the deletion's lock")
        assert writing.is_alive()
    writing.join(10)
    assert not writing.is_alive()
    assert answers == [204, 201]
    listed = http.get("/v1/memories", params={"agent_id": agent_id}, headers=h).json()
    assert listed["items"] == []
    other.close()
