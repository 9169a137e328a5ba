"""/healthz, /readyz, and the ``ibex token`` commands end to end."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from cli import main
from core.migrate import describe_target
from memory_service.app import create_app, make_web_pool
from tests.integration.memory_service.helpers import make_source_session, memory_body


def test_healthz_and_readyz(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ok"
    assert body["checks"] == {"postgres": "ok", "schema": "ok", "redis": "ok", "embeddings": "ok"}
    assert body["details"]["search"] in ("full-text+trigram+semantic", "full-text+semantic")


@pytest.fixture
def unmigrated_url(postgres_server):  # type: ignore[no-untyped-def]
    url = postgres_server.create("readyz")
    yield url
    postgres_server.drop(url)


def test_readyz_is_503_until_the_schema_is_current(settings, redis_client, unmigrated_url) -> None:
    import psycopg2

    from core.migrate import load_migrations, migrate

    last = load_migrations()[-1]
    pool = make_web_pool(unmigrated_url, max_connections=2)
    app = create_app(settings, db=pool, redis_client=redis_client)
    try:
        with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://m") as http:
            # Never migrated.
            ready = http.get("/readyz")
            assert ready.status_code == 503
            body = ready.json()
            assert body["status"] == "unavailable"
            assert body["checks"] == {
                "postgres": "ok",
                "schema": "error: SchemaMissingError",
                "redis": "ok",
            }
            assert "run `ibex migrate`" in body["details"]["schema"]
            target = describe_target(unmigrated_url)
            assert f"the database at {target} has no IBEX schema" in (body["details"]["schema"])
            # Migrated by an older release: the last migration is pending.
            migrate(unmigrated_url)
            conn = psycopg2.connect(unmigrated_url)
            with conn, conn.cursor() as cur:
                cur.execute(
                    "DELETE FROM public.ibex_schema_migrations WHERE version = %s",
                    (last.version,),
                )
            conn.close()
            pending = http.get("/readyz")
            assert pending.status_code == 503
            assert pending.json()["checks"]["schema"] == "error: MigrationsPendingError"
            assert last.name in pending.json()["details"]["schema"]
            # Current.
            conn = psycopg2.connect(unmigrated_url)
            with conn, conn.cursor() as cur:
                cur.execute(
                    "INSERT INTO public.ibex_schema_migrations (version, name, checksum)"
                    " VALUES (%s, %s, %s)",
                    (last.version, last.name, last.checksum),
                )
            conn.close()
            assert http.get("/readyz").status_code == 200
    finally:
        pool.close_all()


def test_api_answers_503_with_the_migrate_hint_until_the_schema_is_current(
    settings, redis_client, unmigrated_url
) -> None:
    from core.migrate import migrate

    target = describe_target(unmigrated_url)
    pool = make_web_pool(unmigrated_url, max_connections=2)
    app = create_app(settings, db=pool, redis_client=redis_client)
    auth = {"Authorization": "Bearer ibex_x"}
    try:
        with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://m") as http:
            for method, path, body in (
                ("GET", "/v1/memories", None),
                ("POST", "/v1/memories/search", {"query": "peanuts", "agent": "bot"}),
                ("POST", "/v1/sessions", {"agent": "bot"}),
            ):
                response = http.request(method, path, headers=auth, json=body)
                assert response.status_code == 503, (path, response.text)
                assert response.headers["content-type"].startswith("application/json")
                error = response.json()["error"]
                assert error["code"] == "SCHEMA_NOT_READY"
                assert error["message"] == (
                    f"the database at {target} has no IBEX schema"
                    " (never migrated): run `ibex migrate`"
                )
            # What does not need the schema still answers.
            assert http.get("/healthz").status_code == 200
            assert http.get("/openapi.json").status_code == 200
            migrate(unmigrated_url)
            # Current: the unknown token is refused as on any migrated database.
            after = http.get("/v1/memories", headers=auth)
            assert after.status_code == 401, after.text
        # Every connection the checks borrowed went back to the pool.
        assert not pool._in_use
    finally:
        pool.close_all()


def test_readyz_is_503_when_postgres_does_not_answer(settings, redis_client) -> None:
    dead_db = make_web_pool("postgresql://postgres@127.0.0.1:1/none", max_connections=1)
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
                "--create-org",
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
    make_source_session(store, org_id, agent_id)

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


def test_token_create_for_an_unknown_org_is_an_error_unless_asked(cli_env, capsys, store) -> None:
    argv = ["token", "create", "--org", "acme", "--scope", "memory:read"]
    assert main(argv) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (
        "ibex token create: no org 'acme'; check the slug, or add --create-org to create it\n"
    )
    assert store.find_org("acme") is None
    assert store.db.execute_sql("SELECT count(*) FROM ibex_memory.api_tokens").fetchone()[0] == 0

    assert main([*argv, "--create-org"]) == 0
    org_id = store.find_org("acme")
    assert org_id is not None
    capsys.readouterr()
    # Now it exists: no flag needed, the same org is used.
    assert main(argv) == 0
    assert store.find_org("acme") == org_id
    capsys.readouterr()
    assert main(["token", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["org_id"] for e in listed] == [str(org_id), str(org_id)]
    assert main(["token", "create", "--service", "--create-org", "--scope", "memory:read"]) == 2
