"""``ibex scan`` and ``ibex extract`` as an operator runs them: sessions named by the id a
person knows, a summary unless asked for every message, leases that follow the current
setting, and a turn that failed inline retried by the next run at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from extraction.stages import StageDeps, scan
from extraction.values import TurnRef
from tests.integration.pipeline.helpers import (
    PIPELINE_ENV,
    FakeMemoryService,
    FakeProvider,
    Harness,
    make_session,
    pipeline_settings,
    turn_rows,
)

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def _env(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "IBEX_"))}
    env.update(PIPELINE_ENV)
    env.update({"DATABASE_URL": database_url, "REDIS_URL": redis_url, **extra})
    return env


@pytest.fixture
def deps(store: Any, database_url: str, redis_server_url: str) -> StageDeps:
    settings = pipeline_settings(database_url, redis_server_url)
    return StageDeps(
        store=store, settings=settings, provider=FakeProvider(), memory=FakeMemoryService()
    )


def _ibex(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ibex"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_scan_and_extract_take_the_external_id_and_need_org_when_ambiguous(
    store: Any, db: Any, database_url: str, redis_url: str
) -> None:
    acme = make_session(store, 2, org="acme", external_id="conv-7")
    globex = make_session(store, 3, org="globex", external_id="conv-7")
    make_session(store, 1, org="acme", external_id="other")
    env = _env(database_url, redis_url)

    ambiguous = _ibex(env, "scan", "--session", "conv-7")
    assert ambiguous.returncode == 1
    assert ambiguous.stderr == (
        "ibex scan: session 'conv-7' is ambiguous: acme/bot/conv-7, globex/bot/conv-7;"
        " add --org and/or --agent\n"
    )
    missing = _ibex(env, "scan", "--session", "conv-7", "--org", "initech")
    assert (missing.returncode, missing.stderr) == (
        1,
        "ibex scan: no session 'conv-7' --org initech\n",
    )
    assert turn_rows(db, acme.session_id) == {} and turn_rows(db, globex.session_id) == {}

    picked = _ibex(env, "scan", "--session", "conv-7", "--org", "globex", "--json")
    assert picked.returncode == 0, picked.stderr
    sent = json.loads(picked.stdout)["sent"]
    assert {(m["session_id"], m["turn_index"]) for m in sent} == {
        (str(globex.session_id), t) for t in (1, 2, 3)
    }
    assert turn_rows(db, acme.session_id) == {}

    # The UUID still works, and wins over --org (it names one session).
    by_uuid = _ibex(env, "scan", "--session", str(acme.session_id), "--json")
    assert by_uuid.returncode == 0, by_uuid.stderr
    assert {m["session_id"] for m in json.loads(by_uuid.stdout)["sent"]} == {str(acme.session_id)}

    # extract: an external id used once needs nothing else. (No memory service answers here,
    # so whether the run succeeds depends on what the rules extract: not asserted.)
    env["MEMORY_SERVICE_URL"] = "http://127.0.0.1:1"
    unique = _ibex(env, "extract", "--session", "other", "--json")
    assert "Traceback" not in unique.stderr
    summary = json.loads(unique.stdout)
    assert (summary["sessions"], summary["turns"]) == (1, 1)


def test_scan_prints_a_summary_and_lists_messages_only_with_verbose(
    store: Any, db: Any, database_url: str, redis_url: str
) -> None:
    first = make_session(store, 2, external_id="a")
    second = make_session(store, 2, external_id="b")
    env = _env(database_url, redis_url)
    quiet = _ibex(env, "scan", "--session", "a")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "1 session scanned, 2 turns sent\n"
    verbose = _ibex(env, "scan", "--session", "b", "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    lines = verbose.stdout.splitlines()
    assert lines[-1] == "1 session scanned, 2 turns sent"
    assert len(lines) == 3
    assert all(
        line.startswith("sent extract_turn(") and str(second.session_id) in line
        for line in lines[:2]
    )
    assert str(first.session_id) not in verbose.stdout


def test_lowering_the_lease_setting_shortens_leases_granted_under_the_old_one(
    store: Any, db: Any, deps: Any
) -> None:
    from dataclasses import replace

    session = make_session(store, 2)
    long = replace(deps.settings, extraction_lease_seconds=300)
    short = replace(deps.settings, extraction_lease_seconds=30)
    deps.settings = long
    assert scan(deps).turns == 2
    assert scan(deps).turns == 0  # leased for 300 s
    deps.settings = short
    again = scan(deps)  # the 300 s leases run longer than 30 s from now: taken again
    assert sorted(m.kwargs["turn_index"] for m in again.sent) == [1, 2]
    assert scan(deps).turns == 0  # now leased for 30 s, which the setting allows
    left = db.execute_sql(
        "SELECT max(EXTRACT(EPOCH FROM lease_expires_at - now()))"
        "  FROM ibex_core.extraction_turns WHERE session_id = %s",
        (str(session.session_id),),
    ).fetchone()[0]
    assert 0 < float(left) <= 30


def test_a_turn_that_failed_inline_is_retried_by_the_next_run_at_once(
    store: Any, db: Any, database_url: str, redis_url: str
) -> None:
    # The LLM endpoint refuses connections: every attempt of the run fails, the run gives up.
    session = make_session(store, 1, external_id="conv-1")
    env = _env(
        database_url,
        redis_url,
        LLM_PROVIDER="openai",
        LLM_BASE_URL="http://127.0.0.1:1/v1",
        LLM_TIMEOUT_SECONDS="2",
    )
    failed = _ibex(env, "extract", "--session", "conv-1")
    assert failed.returncode == 1
    assert "Traceback" not in failed.stderr
    assert "gave up: LLMUnavailableError" in failed.stderr
    assert "retrying" not in failed.stderr
    row = db.execute_sql(
        "SELECT state::text, lease_expires_at, claim_token, attempts, last_error"
        "  FROM ibex_core.extraction_turns WHERE session_id = %s AND turn_index = 1",
        (str(session.session_id),),
    ).fetchone()
    state, lease, claim, attempts, last_error = row
    assert (state, lease, claim, attempts) == ("pending", None, None, 0)
    assert last_error.startswith("LLMUnavailableError")

    # The next run (EXTRACTION_LEASE_SECONDS is 60 here) sends the turn again and says why.
    again = _ibex(env, "extract", "--session", "conv-1")
    assert again.returncode == 1
    assert (
        f"ibex extract: retrying turn 1 of session {session.session_id}; it failed last time:"
        " LLMUnavailableError" in again.stderr
    )
    assert again.stdout.startswith("1 sessions, 1 turns, 0 done")
    as_json = _ibex(env, "extract", "--session", "conv-1", "--json")
    retried = json.loads(as_json.stdout)["retried"]
    assert [(r["session_id"], r["turn_index"]) for r in retried] == [(str(session.session_id), 1)]


def test_release_lease_leaves_a_done_turn_alone(store: Any, db: Any, deps: Any) -> None:
    session = make_session(store, 1)
    Harness(deps).drain(scan(deps).sent)
    ref = TurnRef.of(session.org_id, session.session_id, 1)
    assert deps.turns.turn_status(ref).state == "done"
    assert deps.turns.release_lease(ref, "late failure") is False
    assert deps.turns.turn_status(ref).last_error is None
