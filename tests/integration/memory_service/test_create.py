"""POST /v1/memories: the 201 shape, normalisation, and every request-level rejection."""

from __future__ import annotations

import hashlib
import json
import uuid

import falcon.testing
import httpx
import pytest

from schema.memory import ErrorSchema, MemorySchema
from tests.integration.memory_service.helpers import Tenant, memory_body, memory_count


def error_of(response: httpx.Response) -> dict:
    ErrorSchema().load(response.json())  # every error body has the documented shape
    return response.json()["error"]


def test_201_returns_the_memory_and_its_location(http: httpx.Client, acme: Tenant, db) -> None:
    body = memory_body(acme.agent_id, metadata={"lang": "en", "score": 0.5})
    response = http.post("/v1/memories", json=body, headers=acme.headers(key="k-1"))
    assert response.status_code == 201, response.text
    memory = response.json()
    MemorySchema().load(memory)
    assert memory["org_id"] == str(acme.org_id)
    assert memory["agent_id"] == str(acme.agent_id)
    assert memory["content"] == body["content"]
    assert memory["kind"] == "fact"
    assert memory["source"] == body["source"]
    assert memory["metadata"] == {"lang": "en", "score": 0.5}
    assert response.headers["Location"] == f"/v1/memories/{memory['id']}"
    assert "Idempotent-Replayed" not in response.headers
    fetched = http.get(response.headers["Location"], headers=acme.headers())
    assert fetched.status_code == 200
    assert fetched.json() == memory
    assert memory_count(db) == 1


def test_content_hash_is_over_the_normalised_content(http: httpx.Client, acme: Tenant) -> None:
    body = memory_body(
        acme.agent_id,
        content="  Dana\tIS   allergic\n to \uff30\uff25\uff21\uff2e\uff35\uff34\uff33. ",
    )
    response = http.post("/v1/memories", json=body, headers=acme.headers())
    assert response.status_code == 201
    expected = hashlib.sha256(b"dana is allergic to peanuts.").hexdigest()
    assert response.json()["content_hash"] == expected
    assert response.json()["content"] == body["content"]  # stored as written


def test_defaults_apply_and_source_is_optional(http: httpx.Client, acme: Tenant) -> None:
    body = {"agent_id": str(acme.agent_id), "content": "Likes tea."}
    response = http.post("/v1/memories", json=body, headers=acme.headers())
    assert response.status_code == 201
    assert (response.json()["kind"], response.json()["source"], response.json()["metadata"]) == (
        "fact",
        None,
        {},
    )


@pytest.mark.parametrize(
    "raw",
    [b"{", b"", b"not json", b'{"a": NaN}', b'{"a": 1e999}', b"\xff\xfe", b"[" * 100_000],
)
def test_malformed_json_is_400(http: httpx.Client, acme: Tenant, raw: bytes, db) -> None:
    response = http.post(
        "/v1/memories",
        content=raw[:4000],
        headers={**acme.headers(), "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == "MALFORMED_JSON"
    assert memory_count(db) == 0


def test_validation_is_422_field_by_field(http: httpx.Client, acme: Tenant, db) -> None:
    body = {
        "agent_id": "not-a-uuid",
        "content": "   ",
        "kind": "gossip",
        "source": {"turn_index": 0, "ordinal": -1},
        "metadata": [],
        "extra": 1,
    }
    response = http.post("/v1/memories", json=body, headers=acme.headers())
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "VALIDATION_FAILED"
    assert set(error["fields"]) == {"agent_id", "content", "kind", "source", "metadata", "extra"}
    assert set(error["fields"]["source"]) == {"session_id", "turn_index", "ordinal"}
    assert memory_count(db) == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("content", "a\x00b"),
        ("content", "x" * 4001),
        ("content", 5),
        ("metadata", {"k": "a\x00b"}),
        ("metadata", {"deep": [[[[[[[[[[[[[[[[[["too deep"]]]]]]]]]]]]]]]]]]}),
    ],
)
def test_unstorable_values_are_422(http: httpx.Client, acme: Tenant, field: str, value) -> None:
    body = memory_body(acme.agent_id, **{field: value})
    response = http.post("/v1/memories", json=body, headers=acme.headers())
    assert response.status_code in (413, 422)
    assert error_of(response)["code"] in ("VALIDATION_FAILED", "BODY_TOO_LARGE")


def test_lone_surrogate_is_422_not_500(http: httpx.Client, acme: Tenant) -> None:
    raw = json.dumps(memory_body(acme.agent_id)).replace("peanuts", "\\ud800").encode()
    response = http.post(
        "/v1/memories", content=raw, headers={**acme.headers(), "Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert "content" in error_of(response)["fields"]


def test_unknown_agent_is_422_on_agent_id(
    http: httpx.Client, acme: Tenant, globex: Tenant, db
) -> None:
    for agent in (uuid.uuid4(), globex.agent_id):  # random, and another org's agent
        response = http.post(
            "/v1/memories", json=memory_body(agent), headers=acme.headers(key=f"k-{agent}")
        )
        assert response.status_code == 422
        assert list(error_of(response)["fields"]) == ["agent_id"]
    assert memory_count(db) == 0


def test_a_source_session_outside_the_org_is_422_on_source_session_id(
    http: httpx.Client, acme: Tenant, globex: Tenant, db
) -> None:
    for session in (uuid.uuid4(), globex.session_id):  # no session at all, another org's
        body = memory_body(acme.agent_id)
        body["source"]["session_id"] = str(session)
        key = f"k-{session}"
        response = http.post("/v1/memories", json=body, headers=acme.headers(key=key))
        assert response.status_code == 422, response.text
        error = error_of(response)
        assert error["code"] == "VALIDATION_FAILED"
        assert error["fields"] == {"source": {"session_id": ["unknown session for this org"]}}
        assert "source.session_id" in error["message"]
        # A refusal does not consume the key: the corrected body goes through under it.
        fixed = http.post(
            "/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers(key=key)
        )
        assert fixed.status_code == 201
        assert (
            http.delete(f"/v1/memories/{fixed.json()['id']}", headers=acme.headers()).status_code
            == 204
        )
    assert memory_count(db) == 2
    live = db.execute_sql("SELECT count(*) FROM ibex_memory.memories WHERE deleted_at IS NULL")
    assert live.fetchone()[0] == 0


def test_a_memory_without_a_source_needs_no_session(http: httpx.Client, acme: Tenant, db) -> None:
    response = http.post(
        "/v1/memories", json=memory_body(acme.agent_id, source=None), headers=acme.headers()
    )
    assert response.status_code == 201, response.text
    assert response.json()["source"] is None
    assert memory_count(db) == 1


def test_body_over_the_limit_is_413(http: httpx.Client, app, acme: Tenant, db) -> None:
    body = memory_body(acme.agent_id, metadata={"pad": "x" * 5000})  # the test limit is 4096
    response = http.post("/v1/memories", json=body, headers=acme.headers())
    assert response.status_code == 413
    assert error_of(response)["code"] == "BODY_TOO_LARGE"

    # A de-chunked body of unknown length (gunicorn sets wsgi.input_terminated) is bounded too.
    raw = json.dumps(body).encode()
    environ = falcon.testing.create_environ(
        method="POST", path="/v1/memories", headers=acme.headers(), body=raw
    )
    del environ["CONTENT_LENGTH"]
    environ["wsgi.input_terminated"] = True
    seen: list[str] = []
    result = b"".join(app(environ, lambda status, headers: seen.append(status)))
    assert [s.split()[0] for s in seen] == ["413"]
    assert json.loads(result)["error"]["code"] == "BODY_TOO_LARGE"
    assert memory_count(db) == 0


@pytest.mark.parametrize("key", ["", "k" * 256, "tab\tkey"])
def test_bad_idempotency_key_is_400(http: httpx.Client, acme: Tenant, key: str) -> None:
    response = http.post(
        "/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers(key=key)
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == "INVALID_HEADER"


def test_a_255_character_key_is_accepted(http: httpx.Client, acme: Tenant) -> None:
    key = "k" * 255
    response = http.post(
        "/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers(key=key)
    )
    assert response.status_code == 201


def test_unknown_routes_and_methods_use_the_error_body(http: httpx.Client, acme: Tenant) -> None:
    missing = http.get("/v1/nothing", headers=acme.headers())
    assert missing.status_code == 404
    assert error_of(missing)["code"] == "NOT_FOUND"
    not_a_uuid = http.get("/v1/memories/not-a-uuid", headers=acme.headers())
    assert (not_a_uuid.status_code, error_of(not_a_uuid)["code"]) == (400, "MALFORMED_ID")
    method = http.put("/v1/memories", headers=acme.headers())
    assert method.status_code == 405
    assert error_of(method)["code"] == "METHOD_NOT_ALLOWED"
