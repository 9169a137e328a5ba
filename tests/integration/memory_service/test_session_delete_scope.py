"""Deleting a session deletes its memories, so it needs ``memory:write`` as well as
``sessions:write``, as ``DELETE /v1/memories/{id}`` does."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.memory_service.helpers import Tenant, make_token


def test_deleting_a_session_needs_memory_write_too(
    http: httpx.Client, db: Any, acme: Tenant
) -> None:
    sessions_only = make_token(db, acme.org_id, ["sessions:read", "sessions:write"])[0]
    both = make_token(db, acme.org_id, ["sessions:write", "memory:write"])[0]
    opened = http.post(
        "/v1/sessions",
        json={"agent": "support-bot", "external_id": "doomed", "create_agent": True},
        headers={"Authorization": f"Bearer {sessions_only}"},
    )
    assert opened.status_code == 201, opened.text
    one = f"/v1/sessions/{opened.json()['id']}"

    refused = http.delete(one, headers={"Authorization": f"Bearer {sessions_only}"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
    assert "memory:write" in refused.json()["error"]["message"]
    # Nothing was deleted.
    kept = http.get(one, headers={"Authorization": f"Bearer {sessions_only}"})
    assert kept.status_code == 200 and kept.json()["status"] == "active"

    # memory:write alone is not enough either.
    assert http.delete(one, headers=acme.headers()).status_code == 403

    assert http.delete(one, headers={"Authorization": f"Bearer {both}"}).status_code == 204
    assert http.get(one, headers={"Authorization": f"Bearer {sessions_only}"}).status_code == 404
