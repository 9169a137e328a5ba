"""``GET /v1/usage`` and ``ibex usage``: an org's usage from the ledger, priced by the price
table; the scope it needs, the refusal of a user-bound token, and one org never seeing
another's figures."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from cli import main
from memories.tokens import TokenStore
from sessions.store import SessionStore
from tests.integration.memory_service.helpers import Tenant, make_token


def ledger_row(db: Any, tenant: Tenant, turn: int, model: str, **figures: Any) -> None:
    values = {
        "llm_calls": 1,
        "input_tokens": 0,
        "output_tokens": 0,
        "embedding_tokens": 0,
        "created_at": "2026-03-01 10:00+00",
        **figures,
    }
    db.execute_sql(
        "INSERT INTO ibex_core.turn_usage (org_id, agent_id, session_id, turn_index, provider,"
        " model, embedding_model, llm_calls, input_tokens, output_tokens, embedding_tokens,"
        " created_at) VALUES (%s, %s, %s, %s, 'openai', %s, 'openai:text-embedding-3-small',"
        " %s, %s, %s, %s, %s)",
        (
            str(tenant.org_id), str(tenant.agent_id), str(tenant.session_id), turn, model,
            values["llm_calls"], values["input_tokens"], values["output_tokens"],
            values["embedding_tokens"], values["created_at"],
        ),
    )  # fmt: skip


@pytest.fixture
def seeded(db: Any, acme: Tenant, globex: Tenant) -> None:
    ledger_row(db, acme, 1, "gpt-4o-mini", input_tokens=2_000_000, output_tokens=1_000_000)
    ledger_row(db, acme, 2, "gpt-4o-mini", llm_calls=0, created_at="2026-03-02 09:00+00")
    ledger_row(
        db, acme, 3, "my-local-model", input_tokens=500, embedding_tokens=1_000_000,
        created_at="2026-03-02 11:00+00",
    )  # fmt: skip
    ledger_row(db, globex, 1, "gpt-4o", input_tokens=7, output_tokens=7)


def usage(http: httpx.Client, token: str, **params: str) -> httpx.Response:
    return http.get("/v1/usage", params=params, headers={"Authorization": f"Bearer {token}"})


def test_the_org_reads_its_usage_once_per_turn_and_priced(
    http: httpx.Client, db: Any, acme: Tenant, seeded: None
) -> None:
    token = make_token(db, acme.org_id, ["usage:read"])[0]
    answer = usage(http, token)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["org"] == str(acme.org_id)
    assert (data["turns"], data["llm_calls"]) == (3, 2)
    assert (data["input_tokens"], data["output_tokens"]) == (2_000_500, 1_000_000)
    assert data["embedding_tokens"] == 1_000_000
    # gpt-4o-mini: 2 x 0.15 + 0.60; the embeddings: 0.02 per million; my-local-model: unpriced.
    assert data["cost"] == pytest.approx(0.30 + 0.60 + 0.02)
    assert data["unpriced_models"] == ["my-local-model"]
    assert [d["day"] for d in data["by_day"]] == ["2026-03-01", "2026-03-02"]
    assert {m["model"]: m["turns"] for m in data["by_model"]} == {
        "gpt-4o-mini": 2,
        "my-local-model": 1,
    }
    since = usage(http, token, since="2026-03-02").json()
    assert (since["turns"], since["llm_calls"]) == (2, 1)
    assert usage(http, token, since="2026-03-02T00:00").status_code == 422
    assert usage(http, token, since="yesterday").status_code == 422


def test_usage_needs_its_scope_and_is_refused_to_a_bound_token(
    http: httpx.Client, db: Any, acme: Tenant, seeded: None
) -> None:
    assert usage(http, make_token(db, acme.org_id, ["memory:read"])[0]).status_code == 403
    assert usage(http, make_token(db, acme.org_id, ["memory:admin"])[0]).status_code == 200
    dana = SessionStore(db, bind_models=False).resolve_user(acme.org_id, external_id="dana")
    bound = TokenStore(db).issue(
        org_id=acme.org_id, name="d", scopes=["usage:read", "memory:admin"], user_id=dana
    )[1]
    refused = usage(http, bound)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "INSUFFICIENT_SCOPE"


def test_ibex_usage_prints_the_same_figures(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    store: Any,
    acme: Tenant,
    seeded: None,
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    slug = store.db.execute_sql(
        "SELECT slug FROM ibex_core.orgs WHERE id = %s", (str(acme.org_id),)
    ).fetchone()[0]
    assert main(["usage", "--org", slug, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["org"] == slug and data["org_id"] == str(acme.org_id)
    for key in ("turns", "llm_calls", "input_tokens", "output_tokens", "embedding_tokens"):
        assert key in data
    assert (data["turns"], data["llm_calls"], data["cost"]) == (3, 2, pytest.approx(0.92))
    assert main(["usage", "--org", slug, "--since", "2026-03-02"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"org {slug} since 2026-03-02: 2 turns, 1 LLM calls")
    assert "not in the price table (counted at 0): my-local-model" in out
    assert main(["usage", "--org", slug, "--since", "March"]) == 1
    assert "--since must be a day" in capsys.readouterr().err
    assert main(["usage", "--org", f"nope-{uuid.uuid4().hex[:6]}"]) == 1


def test_budget_route_and_commands(
    http: httpx.Client,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    store: Any,
    db: Any,
    acme: Tenant,
    globex: Tenant,
    seeded: None,
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    slug = store.db.execute_sql(
        "SELECT slug FROM ibex_core.orgs WHERE id = %s", (str(acme.org_id),)
    ).fetchone()[0]
    token = make_token(db, acme.org_id, ["usage:read"])[0]
    headers = {"Authorization": f"Bearer {token}"}
    none = http.get("/v1/budget", headers=headers).json()
    assert none == {
        "limit": None, "used": 0, "period": None, "period_start": None, "waiting_turns": 0,
    }  # fmt: skip
    assert main(["budget", "set", "--org", slug, "--tokens", "5000", "--period", "day"]) == 0
    assert "at most 5000 LLM tokens per day" in capsys.readouterr().out
    answer = http.get("/v1/budget", headers=headers).json()
    # The seeded usage is of March 2026, not of today: nothing used this period.
    assert (answer["limit"], answer["used"], answer["period"]) == (5000, 0, "day")
    ledger_row(db, acme, 9, "gpt-4o-mini", input_tokens=4000, output_tokens=100, created_at="now")
    assert main(["budget", "set", "--org", slug, "--tokens", "5000"]) == 0
    capsys.readouterr()
    assert main(["budget", "show", "--org", slug, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: shown[k] for k in ("limit", "used", "period", "waiting_turns")} == {
        "limit": 5000, "used": 4100, "period": "month", "waiting_turns": 0,
    }  # fmt: skip
    assert main(["budget", "show", "--org", slug]) == 0
    assert "4100 of 5000 LLM tokens used this month (82 %)" in capsys.readouterr().out
    # Another org sees its own budget (none), never this one.
    other = make_token(db, globex.org_id, ["memory:admin"])[0]
    got = http.get("/v1/budget", headers={"Authorization": f"Bearer {other}"}).json()
    assert got["limit"] is None
    assert main(["budget", "clear", "--org", slug]) == 0
    assert "budget cleared" in capsys.readouterr().out
    assert http.get("/v1/budget", headers=headers).json()["limit"] is None
    with pytest.raises(SystemExit) as usage_error:
        main(["budget", "set", "--org", slug, "--tokens", "-1"])
    assert usage_error.value.code == 2
    bound = TokenStore(db).issue(
        org_id=acme.org_id,
        name="b",
        scopes=["usage:read"],
        user_id=SessionStore(db, bind_models=False).resolve_user(acme.org_id, external_id="x"),
    )[1]
    assert http.get("/v1/budget", headers={"Authorization": f"Bearer {bound}"}).status_code == 403
