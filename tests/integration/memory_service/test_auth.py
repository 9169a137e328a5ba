"""Tokens, scopes and orgs: who may do what, and that another org's memory does not exist."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from memories.tokens import TokenStore
from tests.integration.memory_service.helpers import Tenant, make_token, memory_body, memory_count


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer ibex_not-a-real-token"],
)
def test_missing_or_unknown_token_is_401(
    http: httpx.Client, acme: Tenant, authorization: str | None, db
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for response in (
        http.post("/v1/memories", json=memory_body(acme.agent_id), headers=headers),
        http.get("/v1/memories", headers=headers),
    ):
        assert response.status_code == 401
        assert error_code(response) == "UNAUTHORIZED"
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert memory_count(db) == 0


def test_revoked_token_is_401_within_the_cache_time(http: httpx.Client, acme: Tenant, db) -> None:
    assert http.get("/v1/memories", headers=acme.headers()).status_code == 200  # now cached
    TokenStore(db).revoke(acme.writer_id)
    deadline = time.monotonic() + 3.0  # the app under test caches for 0.5 s
    while True:
        response = http.get("/v1/memories", headers=acme.headers())
        if response.status_code == 401 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert response.status_code == 401
    assert error_code(response) == "UNAUTHORIZED"
    post = http.post("/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers())
    assert post.status_code == 401
    assert memory_count(db) == 0


def test_read_only_token_cannot_write(http: httpx.Client, acme: Tenant, db) -> None:
    post = http.post(
        "/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers(acme.reader)
    )
    assert (post.status_code, error_code(post)) == (403, "INSUFFICIENT_SCOPE")
    assert memory_count(db) == 0
    assert http.get("/v1/memories", headers=acme.headers(acme.reader)).status_code == 200
    delete = http.delete(f"/v1/memories/{uuid.uuid4()}", headers=acme.headers(acme.reader))
    assert (delete.status_code, error_code(delete)) == (403, "INSUFFICIENT_SCOPE")


def test_write_only_token_cannot_read(http: httpx.Client, acme: Tenant, db) -> None:
    writer, _ = make_token(db, acme.org_id, ["memory:write"])
    response = http.get("/v1/memories", headers=acme.headers(writer))
    assert (response.status_code, error_code(response)) == (403, "INSUFFICIENT_SCOPE")


def test_org_token_naming_another_org_is_403(
    http: httpx.Client, acme: Tenant, globex: Tenant, db
) -> None:
    body = memory_body(globex.agent_id)
    response = http.post("/v1/memories", json=body, headers=acme.headers(org=globex.org_id))
    assert (response.status_code, error_code(response)) == (403, "FORBIDDEN_ORG")
    listing = http.get("/v1/memories", headers=acme.headers(org=globex.org_id))
    assert listing.status_code == 403
    own = http.post(
        "/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers(org=acme.org_id)
    )
    assert own.status_code == 201
    assert memory_count(db, globex.org_id) == 0


def test_cross_org_get_and_delete_are_404(http: httpx.Client, acme: Tenant, globex: Tenant) -> None:
    created = http.post("/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers())
    location = created.headers["Location"]
    assert http.get(location, headers=globex.headers()).status_code == 404
    assert http.delete(location, headers=globex.headers()).status_code == 404
    assert http.get("/v1/memories", headers=globex.headers()).json()["items"] == []
    assert http.get(location, headers=acme.headers()).status_code == 200


def test_service_token_acts_for_the_org_it_names(
    http: httpx.Client, acme: Tenant, globex: Tenant, db
) -> None:
    service, _ = make_token(db, None, ["memory:read", "memory:write"])
    for tenant_ in (acme, globex):
        response = http.post(
            "/v1/memories",
            json=memory_body(tenant_.agent_id),
            headers=tenant_.headers(service, org=tenant_.org_id),
        )
        assert response.status_code == 201
        assert response.json()["org_id"] == str(tenant_.org_id)
    missing = http.post(
        "/v1/memories", json=memory_body(acme.agent_id), headers=acme.headers(service)
    )
    assert (missing.status_code, error_code(missing)) == (400, "ORG_REQUIRED")
    malformed = http.get("/v1/memories", headers=acme.headers(service, org="acme"))
    assert (malformed.status_code, error_code(malformed)) == (400, "INVALID_HEADER")
    unknown_org = http.post(
        "/v1/memories",
        json=memory_body(acme.agent_id),
        headers=acme.headers(service, org=uuid.uuid4()),
    )
    assert (unknown_org.status_code, error_code(unknown_org)) == (403, "FORBIDDEN_ORG")
    # An agent of one org cannot be written into another org, even by a service token.
    crossed = http.post(
        "/v1/memories",
        json=memory_body(acme.agent_id),
        headers=acme.headers(service, org=globex.org_id),
    )
    assert (crossed.status_code, list(crossed.json()["error"]["fields"])) == (422, ["agent_id"])
    assert memory_count(db) == 2


def test_an_empty_org_header_is_malformed_not_absent(http: httpx.Client, acme: Tenant, db) -> None:
    """An org token with ``X-IBEX-Org-ID:`` (empty) is refused, not read as "my own org"; a
    service token gets the same answer, not ORG_REQUIRED."""
    service, _ = make_token(db, None, ["memory:read", "memory:write"])
    for token in (acme.writer, service):
        headers = {"Authorization": f"Bearer {token}", "X-IBEX-Org-ID": ""}
        posted = http.post("/v1/memories", json=memory_body(acme.agent_id), headers=headers)
        assert (posted.status_code, error_code(posted)) == (400, "INVALID_HEADER")
        listed = http.get("/v1/memories", headers={**headers, "X-IBEX-Org-ID": "  "})
        assert (listed.status_code, error_code(listed)) == (400, "INVALID_HEADER")
    assert memory_count(db) == 0
