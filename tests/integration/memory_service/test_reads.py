"""GET /v1/memories (filters, cursor pagination, limit), GET and DELETE /v1/memories/{id}."""

from __future__ import annotations

import base64
import uuid

import httpx
import pytest

from schema.memory import MemoryPageSchema
from tests.integration.memory_service.helpers import Tenant, make_source_session, memory_body


def seed(http: httpx.Client, tenant_: Tenant, count: int, session: uuid.UUID) -> list[str]:
    ids = []
    for i in range(count):
        body = memory_body(tenant_.agent_id, content=f"Fact number {i}.")
        body["source"]["session_id"] = str(session)
        response = http.post("/v1/memories", json=body, headers=tenant_.headers())
        assert response.status_code == 201
        ids.append(response.json()["id"])
    return ids


def test_pages_cover_everything_once_newest_first(http: httpx.Client, acme: Tenant) -> None:
    ids = seed(http, acme, 7, acme.session_id)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        response = http.get("/v1/memories", params=params, headers=acme.headers())
        assert response.status_code == 200
        page = MemoryPageSchema().load(response.json())
        seen.extend(str(m["id"]) for m in page["items"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(ids))


def test_filters(http: httpx.Client, acme: Tenant, store) -> None:
    other_agent = store.ensure_agent(acme.org_id, "helper")
    session_a = acme.session_id
    session_b = make_source_session(store, acme.org_id, other_agent)
    a = seed(http, acme, 2, session_a)
    body = memory_body(other_agent, content="Fact number 0.")
    body["source"]["session_id"] = str(session_b)
    b = http.post("/v1/memories", json=body, headers=acme.headers()).json()["id"]

    def listed(**params: str) -> list[str]:
        response = http.get("/v1/memories", params=params, headers=acme.headers())
        return [m["id"] for m in response.json()["items"]]

    assert sorted(listed(session_id=str(session_a))) == sorted(a)
    assert listed(agent_id=str(other_agent)) == [b]
    assert listed(agent_id=str(acme.agent_id), session_id=str(session_b)) == []
    assert len(listed()) == 3


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "201"},
        {"limit": "many"},
        {"agent_id": "x"},
        {"colour": "red"},
    ],
)
def test_bad_query_is_422(http: httpx.Client, acme: Tenant, params: dict[str, str]) -> None:
    response = http.get("/v1/memories", params=params, headers=acme.headers())
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "VALIDATION_FAILED"
    assert set(response.json()["error"]["fields"]) == set(params)


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


SOME_ID = "8b9f2a52-3f57-4bd1-9c1e-2c1a8f0d6b11"
MALFORMED_CURSORS = [
    "%%%",  # not base64 at all
    "a",  # base64 of an impossible length
    "====",
    "é",  # not ASCII
    _b64("not a cursor"),  # valid base64 of garbage
    _b64(b"\xff\xfe\x00"),  # not text
    _b64("2024-01-01T00:00:00+00:00"),  # no id
    _b64("2024-01-01T00:00:00+00:00|not-a-uuid"),
    _b64(f"2024-01-01T00:00:00|{SOME_ID}"),  # naive timestamp
    _b64(f"|{SOME_ID}"),
    _b64(f"2024-01-01T00:00:00+00:00|{SOME_ID}\x00"),
    _b64(f"0001-01-01T00:00:00+14:00|{SOME_ID}"),  # before year 1 in UTC
    _b64(f"9999-12-31T23:59:59-14:00|{SOME_ID}"),  # after year 9999 in UTC
    _b64(f"2024-01-01T00:00:00+23:59:59.999999|{SOME_ID}"),  # an odd offset
    _b64(f"12345|{SOME_ID}"),
    _b64("[1, 2]"),
    _b64(f"2024-01-01T00:00:00+00:00|{SOME_ID}|extra"),
    _b64(f"2024-01-01T00:00:00+00:00|{SOME_ID}") + "x" * 600,  # huge
    "A" * 6000,  # huge base64 of zeros
]


@pytest.mark.parametrize("cursor", MALFORMED_CURSORS)
def test_malformed_cursor_is_400(http: httpx.Client, acme: Tenant, cursor: str) -> None:
    response = http.get("/v1/memories", params={"cursor": cursor}, headers=acme.headers())
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_CURSOR"
    assert set(error["fields"]) == {"cursor"}


def test_a_repeated_cursor_is_400(http: httpx.Client, acme: Tenant) -> None:
    (memory_id,) = seed(http, acme, 2, acme.session_id)[:1]
    first = http.get("/v1/memories", params={"limit": "1"}, headers=acme.headers()).json()
    cursor = first["next_cursor"]
    assert cursor
    response = http.get(
        "/v1/memories", params=[("cursor", cursor), ("cursor", cursor)], headers=acme.headers()
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_CURSOR"
    # The same cursor once is a good one.
    again = http.get("/v1/memories", params={"cursor": cursor}, headers=acme.headers())
    assert again.status_code == 200
    assert [item["id"] for item in again.json()["items"]] == [memory_id]


def test_limit_default_and_maximum(http: httpx.Client, acme: Tenant) -> None:
    seed(http, acme, 3, acme.session_id)
    response = http.get("/v1/memories", params={"limit": "200"}, headers=acme.headers())
    assert response.status_code == 200
    assert len(response.json()["items"]) == 3
    assert response.json()["next_cursor"] is None


def test_delete_is_soft_and_frees_the_content(http: httpx.Client, acme: Tenant, db) -> None:
    (memory_id,) = seed(http, acme, 1, acme.session_id)
    location = f"/v1/memories/{memory_id}"
    assert http.delete(location, headers=acme.headers()).status_code == 204
    assert http.get(location, headers=acme.headers()).status_code == 404
    assert http.delete(location, headers=acme.headers()).status_code == 404
    assert http.get("/v1/memories", headers=acme.headers()).json()["items"] == []
    row = db.execute_sql(
        "SELECT deleted_at IS NOT NULL FROM ibex_memory.memories WHERE id = %s", (memory_id,)
    ).fetchone()
    assert row == (True,)
    again = http.post(
        "/v1/memories",
        json=memory_body(acme.agent_id, content="Fact number 0."),
        headers=acme.headers(),
    )
    assert again.status_code == 201
    assert again.json()["id"] != memory_id


def test_unknown_id_is_404(http: httpx.Client, acme: Tenant) -> None:
    response = http.get(f"/v1/memories/{uuid.uuid4()}", headers=acme.headers())
    assert (response.status_code, response.json()["error"]["code"]) == (404, "NOT_FOUND")


def test_listing_by_an_agent_the_org_does_not_have_is_404(
    http: httpx.Client, acme: Tenant, globex: Tenant
) -> None:
    for agent_id in (uuid.uuid4(), globex.agent_id):  # no such agent; another org's
        response = http.get(
            "/v1/memories", params={"agent_id": str(agent_id)}, headers=acme.headers()
        )
        assert response.status_code == 404, response.text
        assert response.json()["error"] == {
            "code": "UNKNOWN_AGENT",
            "message": f"no agent '{agent_id}' in this org",
        }
    # The org's own agent with nothing stored yet is an empty page, as before.
    mine = http.get("/v1/memories", params={"agent_id": str(acme.agent_id)}, headers=acme.headers())
    assert mine.status_code == 200 and mine.json()["items"] == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/memories/not-an-id"),
        ("DELETE", "/v1/memories/123"),
        ("GET", "/v1/memories/not-an-id/history"),
        ("GET", "/v1/sessions/conv-42"),
        ("POST", "/v1/sessions/conv-42/complete"),
    ],
)
def test_a_malformed_id_in_the_path_is_400_not_404(
    http: httpx.Client, acme: Tenant, method: str, path: str
) -> None:
    answer = http.request(method, path, headers=acme.headers())
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "MALFORMED_ID"
    # A path that names no route at all is still 404.
    assert http.get("/v1/nothing-here", headers=acme.headers()).status_code == 404
