"""/openapi.json: valid OpenAPI 3, covering every route and method, and a schemathesis fuzz of
the live app (in-process) that finds no server error and no undocumented answer."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import uuid
from collections import Counter
from typing import Any

import falcon.inspect
import httpx
import hypothesis
import schemathesis
from hypothesis import HealthCheck, given
from openapi_spec_validator import validate
from schemathesis import checks

from memory_service.app import create_app
from tests.conftest import examples
from tests.integration.memory_service.helpers import Tenant, make_token

CONSOLE = "/console"


def test_the_document_is_valid_openapi(http: httpx.Client) -> None:
    response = http.get("/openapi.json")
    assert response.status_code == 200
    validate(response.json())


def test_every_route_and_method_is_documented(http: httpx.Client, app) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    documented = {(p, m.upper()) for p, ops in paths.items() for m in ops}
    served = set()
    for route in falcon.inspect.inspect_app(app).routes:
        if route.path == CONSOLE or route.path.startswith(CONSOLE + "/"):
            continue  # HTML pages for people, not part of the JSON API (docs/console.md)
        path = re.sub(r"\{(\w+):uuid\}", r"{\1}", route.path)
        for method in route.methods:
            if method.internal:  # Falcon's automatic 405 responders
                continue
            served.add((path, method.method))
    assert served == documented


def test_every_error_answer_has_the_error_body(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    errors = 0
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if path.startswith("/v1/") and int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (path, status)
                    errors += 1
    assert errors >= 20
    codes = document["components"]["schemas"]["ErrorDetail"]["properties"]["code"]["enum"]
    assert {"IDEMPOTENCY_CONFLICT", "IDEMPOTENCY_IN_PROGRESS", "DUPLICATE_CONTENT"} <= set(codes)


def test_fuzz_finds_no_server_error(settings, app_db, redis_client, acme: Tenant, db) -> None:
    """Generated requests for every operation (schemathesis strategies run by hypothesis),
    authenticated with a service token for acme unless the case names another org, and POST
    bodies pointed at acme's real agent so the insert path runs too. Checks: no 5xx, and every
    status, content type and body is the documented one."""
    scopes = ["memory:read", "memory:write", "sessions:read", "sessions:write"]
    token = make_token(db, None, scopes)[0]
    # The shipped body limit (the fixture's 4096 bytes would make most generated writes,
    # whose vector is 256 numbers, a 413 and leave the validation path unvisited).
    app = create_app(
        dataclasses.replace(settings, memory_max_body_bytes=65536),
        db=app_db,
        redis_client=redis_client,
    )
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    seen: Counter[tuple[str, int]] = Counter()
    assert len(operations) >= 6  # schemathesis skips the document's own route
    for operation in operations:
        # The writes get more examples: the validation path needs its share.
        writes = ("POST /v1/sessions", "POST /v1/memories")

        @given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=examples(80 if operation.label in writes else 25),
            deadline=None,
            database=None,
            # The same examples every run: the coverage asserted below cannot come and go.
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            if not case.headers or "X-IBEX-Org-ID" not in case.headers:
                headers["X-IBEX-Org-ID"] = str(acme.org_id)
            if isinstance(case.body, dict) and isinstance(case.body.get("agent_id"), str):
                with contextlib.suppress(ValueError):
                    uuid.UUID(case.body["agent_id"])
                    case.body["agent_id"] = str(acme.agent_id)
                    # The agent by id, so not also by slug (the sessions API takes one).
                    case.body.pop("agent", None)
                writes = ("POST /v1/sessions", "POST /v1/memories")
                if case.operation.label in writes and isinstance(case.body, dict):
                    # Random users (an unknown id, an unprintable key, a header that differs)
                    # would keep the fuzz from ever opening a session or storing a memory
                    # (one not its session's user's); the users API has its
                    # own tests (test_users_api.py).
                    for name in ("user", "user_id"):
                        case.body.pop(name, None)
                    if case.headers:
                        case.headers.pop("X-IBEX-User-ID", None)
            response = case.call_and_validate(
                headers=headers,
                checks=[
                    checks.not_a_server_error,
                    checks.status_code_conformance,
                    checks.content_type_conformance,
                    checks.response_schema_conformance,
                ],
            )
            seen[(case.operation.label, response.status_code)] += 1

        run()
    # The fuzz reached the insert and the validation paths, not just the auth checks.
    assert seen[("POST /v1/memories", 201)] >= 1, seen
    assert seen[("POST /v1/memories", 422)] >= 1, seen
    assert seen[("GET /v1/memories", 200)] >= 1, seen
    assert seen[("POST /v1/sessions", 201)] >= 1, seen
    assert seen[("POST /v1/sessions", 422)] >= 1, seen
    assert seen[("GET /v1/sessions", 200)] >= 1, seen
    assert seen[("POST /v1/sessions/{session_id}/turns", 422)] >= 1, seen
