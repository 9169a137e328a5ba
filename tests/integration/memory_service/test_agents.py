"""``GET /v1/agents/{agent}``: the org's agent by slug or id, for callers that hold a slug and
need the id the memory routes take; another org's agent, or a typo, is 404 UNKNOWN_AGENT."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from ibex_client import IbexClient, NotFoundError
from tests.integration.memory_service.helpers import Tenant, make_token


def test_an_agent_by_slug_or_id_and_never_another_orgs(
    app: Any, http: httpx.Client, db: Any, acme: Tenant, globex: Tenant
) -> None:
    reader = make_token(db, acme.org_id, ["memory:write"])[0]  # any scope of the org will do
    headers = {"Authorization": f"Bearer {reader}"}
    slug = db.execute_sql(
        "SELECT slug FROM ibex_core.agents WHERE id = %s", (str(acme.agent_id),)
    ).fetchone()[0]

    by_slug = http.get(f"/v1/agents/{slug}", headers=headers)
    assert by_slug.status_code == 200, by_slug.text
    assert by_slug.json() == {"id": str(acme.agent_id), "slug": slug}
    by_id = http.get(f"/v1/agents/{acme.agent_id}", headers=headers)
    assert by_id.json() == by_slug.json()

    for unknown in (f"{slug}-typo", str(globex.agent_id), str(uuid.uuid4())):
        missing = http.get(f"/v1/agents/{unknown}", headers=headers)
        assert missing.status_code == 404, unknown
        assert missing.json()["error"]["code"] == "UNKNOWN_AGENT"
    assert http.get(f"/v1/agents/{slug}").status_code == 401

    with IbexClient("http://ibex", reader, transport=httpx.WSGITransport(app=app)) as ibex:
        assert ibex.get_agent(slug).id == acme.agent_id
        with pytest.raises(NotFoundError) as caught:
            ibex.get_agent(f"{slug}-typo")
        assert caught.value.code == "UNKNOWN_AGENT"
