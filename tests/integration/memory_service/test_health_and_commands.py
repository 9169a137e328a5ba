"""/healthz, /readyz, and the ``ibex token`` commands end to end."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from core.cli import main
from memory_service.app import create_app, make_pool
from tests.integration.memory_service.helpers import memory_body


def test_healthz_and_readyz(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ok"
    assert body["checks"] == {"postgres": "ok", "redis": "ok"}
    assert body["details"]["search"] in ("full-text+trigram", "full-text")


def test_readyz_is_503_when_postgres_does_not_answer(settings, redis_client) -> None:
    dead_db = make_pool("postgresql://postgres@127.0.0.1:1/none", max_connections=1)
    app = create_app(settings, db=dead_db, redis_client=redis_client)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://m") as http:
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"] == {
            "postgres": "error: DatabaseUnavailableError",
            "redis": "ok",
        }
        # Any API call that needs Postgres answers 503 with Retry-After, not 500.
        response = http.get("/v1/memories", headers={"Authorization": "Bearer ibex_x"})
        assert (response.status_code, response.json()["error"]["code"]) == (503, "UNAVAILABLE")
        assert response.headers["Retry-After"] == "1"


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str, redis_url: str, db) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)


def test_token_create_list_revoke(cli_env, capsys, settings, app_db, redis_client, store) -> None:
    assert (
        main(
            [
                "token",
                "create",
                "--org",
                "initech",
                "--scope",
                "memory:write",
                "--scope",
                "memory:read",
                "--name",
                "pipeline",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    token = out.out.strip()
    assert token.startswith("ibex_") and len(token) > 40
    assert token not in out.err
    org_id = store.find_org("initech")
    assert org_id is not None
    agent_id = store.ensure_agent(org_id, "bot")

    assert main(["token", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 1
    (entry,) = listed
    assert entry["org_id"] == str(org_id)
    assert entry["scopes"] == ["memory:read", "memory:write"]
    assert entry["prefix"] == token[:12]
    assert entry["revoked_at"] is None
    assert token not in json.dumps(listed) and "token_hash" not in entry

    app = create_app(settings, db=app_db, redis_client=redis_client, token_cache_seconds=0)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://m") as http:
        headers = {"Authorization": f"Bearer {token}"}
        assert (
            http.post("/v1/memories", json=memory_body(agent_id), headers=headers).status_code
            == 201
        )
        assert main(["token", "revoke", entry["id"]]) == 0
        assert http.get("/v1/memories", headers=headers).status_code == 401
    capsys.readouterr()
    assert main(["token", "list"]) == 0
    assert "revoked" in capsys.readouterr().out
    stored = store.db.execute_sql("SELECT token_hash FROM ibex_memory.api_tokens").fetchone()[0]
    assert stored != token and len(stored) == 64


def test_token_create_service_and_errors(cli_env, capsys) -> None:
    assert main(["token", "create", "--service", "--scope", "memory:write"]) == 0
    capsys.readouterr()
    assert main(["token", "list", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert (entry["org_id"], entry["is_service"]) == (None, True)
    assert main(["token", "revoke", str(uuid.uuid4())]) == 1
    assert main(["token", "revoke", "nope"]) == 1
    assert main(["token", "create", "--org", "Bad Slug", "--scope", "memory:read"]) == 1
    with pytest.raises(SystemExit) as usage:
        main(["token", "create", "--org", "a", "--service", "--scope", "memory:read"])
    assert usage.value.code == 2
    with pytest.raises(SystemExit) as no_scope:
        main(["token", "create", "--org", "a"])
    assert no_scope.value.code == 2
