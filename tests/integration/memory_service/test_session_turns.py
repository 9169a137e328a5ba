"""``GET /v1/sessions/{id}/turns``: each turn as recorded, its extraction state and its usage,
paged with the turns list's own cursor, behind the user boundary (a bound token gets for
another person's session exactly what it gets for an unknown one)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx

from memories.tokens import TokenStore
from memory_service.cursor import encode_cursor
from schema.sessions import TurnPageSchema
from sessions.store import SessionStore
from tests.integration.memory_service.helpers import Tenant, make_token
from tests.integration.memory_service.test_sessions import (
    SESSION_SCOPES,
    append,
    auth,
    open_session,
    turn,
)


def turns_of(http: httpx.Client, token: str, session_id: str, **params: Any) -> httpx.Response:
    return http.get(f"/v1/sessions/{session_id}/turns", params=params, headers=auth(token))


def set_pipeline_state(db: Any, org_id: uuid.UUID, session_id: str) -> None:
    """As the pipeline leaves them (owner connection): turn 1 done with two memories and its
    usage, turn 2 done with none, turn 3 dead-lettered, turn 4 failed once and to be retried,
    turn 5 under a live claim, turn 6 not yet recorded."""
    rows = [
        (1, "done", '{"memories": [{"content": "a", "kind": "fact"}, '
         '{"content": "b", "kind": "fact", "supersedes": ["x"]}]}', 2, None, None),
        (2, "done", '{"memories": []}', 0, None, None),
        (3, "failed", None, None, "LLMRejectedError: 400 with the answer quoted", None),
        (4, "pending", None, None, "LLMUnavailableError: 503", None),
        (5, "pending", None, None, None, "now() + interval '1 minute'"),
    ]  # fmt: skip
    for index, state, result, count, error, claim in rows:
        db.execute_sql(
            "INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index, state,"
            " result, memory_count, last_error, claim_token, claim_expires_at)"
            f" VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s, %s, {claim or 'NULL'})",
            (str(org_id), session_id, index, state, result, count, error,
             str(uuid.uuid4()) if claim else None),
        )  # fmt: skip
    agent = db.execute_sql(
        "SELECT agent_id FROM ibex_core.sessions WHERE id = %s", (session_id,)
    ).fetchone()[0]
    db.execute_sql(
        "INSERT INTO ibex_core.turn_usage (org_id, agent_id, session_id, turn_index, provider,"
        " model, llm_calls, input_tokens, output_tokens, embedding_tokens, latency_ms)"
        " VALUES (%s, %s, %s, 1, 'openai', 'gpt-4o-mini', 1, 1000000, 1000000, 0, 812)",
        (str(org_id), str(agent), session_id),
    )


def test_turns_come_back_as_recorded_with_their_state_and_usage(
    http: httpx.Client, db: Any, acme: Tenant
) -> None:
    token = make_token(db, acme.org_id, SESSION_SCOPES)[0]
    session_id = open_session(http, token)
    assert append(http, token, session_id, *(turn(i) for i in range(1, 7))).status_code == 201
    set_pipeline_state(db, acme.org_id, session_id)
    response = turns_of(http, token, session_id)
    assert response.status_code == 200, response.text
    page = TurnPageSchema().load(response.json())
    items = page["items"]
    assert [t["turn_index"] for t in items] == [1, 2, 3, 4, 5, 6]
    assert [t["state"] for t in items] == [
        "extracted", "empty", "dead_lettered", "failed", "extracting", "pending",
    ]  # fmt: skip
    assert items[0]["messages"] == turn(1)["messages"]
    assert items[0]["completion"] == turn(1)["completion"]
    assert (items[0]["memories"], items[0]["superseding"]) == (2, 1)
    # The reason is the failure's class, never its message.
    assert [t["reason"] for t in items] == [
        None, None, "LLMRejectedError", "LLMUnavailableError", None, None,
    ]  # fmt: skip
    usage = items[0]["usage"]
    assert usage["llm_calls"] == 1 and usage["latency_ms"] == 812
    assert usage["cost"] == 0.15 + 0.60  # gpt-4o-mini, one million tokens each way
    assert all(t["usage"] is None for t in items[1:])
    assert page["next_cursor"] is None


def test_turns_page_with_their_own_cursor(http: httpx.Client, db: Any, acme: Tenant) -> None:
    token = make_token(db, acme.org_id, SESSION_SCOPES)[0]
    session_id = open_session(http, token)
    append(http, token, session_id, *(turn(i) for i in range(1, 6)))
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = turns_of(http, token, session_id, **params).json()
        seen.extend(t["turn_index"] for t in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [1, 2, 3, 4, 5]
    # A cursor of the memories and sessions lists, or anything made up, is not a turns cursor.
    other_list = encode_cursor(dt.datetime.now(dt.UTC), uuid.uuid4())
    for bad in (other_list, "bm90IGEgY3Vyc29y", "dHVybnwwMQ", "dHVybnwtMQ"):
        answer = turns_of(http, token, session_id, cursor=bad)
        assert answer.status_code == 400, bad
        assert answer.json()["error"]["code"] == "INVALID_CURSOR", bad
    assert turns_of(http, token, session_id, limit=0).status_code == 422


def test_a_bound_token_gets_for_another_persons_session_what_it_gets_for_an_unknown_one(
    http: httpx.Client, db: Any, store: Any, acme: Tenant, globex: Tenant
) -> None:
    org_token = make_token(db, acme.org_id, SESSION_SCOPES)[0]
    users = SessionStore(db, bind_models=False)
    dana = users.resolve_user(acme.org_id, external_id="dana")
    sam = users.resolve_user(acme.org_id, external_id="sam")
    tokens = TokenStore(db)
    dana_token = tokens.issue(org_id=acme.org_id, name="d", scopes=SESSION_SCOPES, user_id=dana)[1]
    sam_token = tokens.issue(org_id=acme.org_id, name="s", scopes=SESSION_SCOPES, user_id=sam)[1]
    dana_session = open_session(http, dana_token, "dana-conv")
    append(http, dana_token, dana_session, turn(1))
    shared = open_session(http, org_token, "agent-wide")
    append(http, org_token, shared, turn(1))

    assert turns_of(http, dana_token, dana_session).status_code == 200
    assert turns_of(http, org_token, dana_session).status_code == 200
    unknown = turns_of(http, sam_token, str(uuid.uuid4()))
    for other in (dana_session, shared):
        answer = turns_of(http, sam_token, other)
        assert (answer.status_code, answer.json()) == (unknown.status_code, unknown.json())
    assert unknown.status_code == 404
    # Another org's session is unknown too.
    globex_token = make_token(db, globex.org_id, SESSION_SCOPES)[0]
    assert turns_of(http, globex_token, dana_session).json() == unknown.json()
    # Reading needs sessions:read.
    no_scope = make_token(db, acme.org_id, ["memory:read"])[0]
    assert turns_of(http, no_scope, dana_session).status_code == 403
