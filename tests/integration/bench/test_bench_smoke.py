"""The benchmarks still run: the pipeline benchmark on a tiny scenario and the scan benchmark on
a small data set, each in its own process, checked for structure and invariants (not speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg2
import pytest
import redis

from tests.conftest import TEST_DATABASE_URL, TEST_REDIS_URL

ROOT = Path(__file__).resolve().parents[3]


def _sibling(url: str, suffix: str) -> str:
    parsed = urlparse(url)
    return urlunparse(parsed._replace(path=f"{parsed.path}_{suffix}"))


def _require_services() -> None:
    from core.db import connect_params

    admin = urlunparse(urlparse(TEST_DATABASE_URL)._replace(path="/postgres"))
    try:
        psycopg2.connect(**connect_params(admin)).close()
        client = redis.Redis.from_url(TEST_REDIS_URL)
        client.ping()
        client.close()
    except (psycopg2.OperationalError, redis.RedisError) as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Postgres or Redis unavailable: {exc}")
        pytest.skip(f"Postgres or Redis unavailable: {exc}")


def _drop(url: str) -> None:
    """Drop a benchmark database once its test is over (each run creates it afresh)."""
    from core.db import connect_params

    name = urlparse(url).path.lstrip("/")
    admin = urlunparse(urlparse(url)._replace(path="/postgres"))
    conn = psycopg2.connect(**connect_params(admin))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


def _run(module: str, *args: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", module, "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:] or done.stdout[-3000:]
    return json.loads(done.stdout)


def test_pipeline_benchmark_tiny(tmp_path: Path) -> None:
    _require_services()
    url = _sibling(TEST_DATABASE_URL, "bench_smoke")
    try:
        doc = _run(
            "bench.pipeline",
            "--scenario", "tiny",
            "--database-url", url,
            "--redis-url", TEST_REDIS_URL,
            "--log-dir", str(tmp_path),
            timeout=90,
        )  # fmt: skip
    finally:
        _drop(url)
    assert set(doc) >= {"benchmark", "machine", "settings", "scenarios", "seconds"}
    (result,) = doc["scenarios"]
    scenario = result["scenario"]
    turns = scenario["sessions"] * scenario["turns"]
    for side in ("pipeline", "baseline"):
        run = result[side]
        assert run["complete"] is True, (side, run)
        assert run["turns"] == run["turns_done"] == run["pointer_turns"] == turns, side
        assert run["turns_failed"] == 0
        assert run["memories"] == turns * scenario["memories"], side
        assert run["llm_calls_per_turn"] == 1.0, side
        assert run["llm_requests_per_turn"] == 1.0, side
        assert run["llm_max_calls_per_turn"] == 1, side
        assert run["http_requests_per_memory"] == 1.0, side
        assert run["turns_per_s"] > 0 and run["memories_per_s"] > 0
        latency = run["latency_ms"]
        assert 0 < latency["done_p50"] <= latency["done_p95"]
        assert latency["pointer_p50"] >= latency["done_p50"] - 1e-6
        assert run["redis_commands_per_turn"] > 0
        assert run["cpu_s_per_turn"]["total"] > 0
        statements = run["sql_statements_per_turn"]
        if doc["settings"]["sql_statement_log"]:
            assert statements["total"] > 0 and statements["memory_service"] > 0
    assert result["ratios"]["pipeline_over_baseline"] > 0


def test_scan_benchmark_small() -> None:
    _require_services()
    url = _sibling(TEST_DATABASE_URL, "bench_scan_smoke")
    try:
        doc = _run(
            "bench.scan",
            "--database-url", url,
            "--redis-url", TEST_REDIS_URL,
            "--sessions", "2000",
            "--pending-sessions", "25",
            "--turns", "2",
            "--orgs", "5",
            "--agents-per-org", "2",
            "--repeat", "1",
            timeout=60,
        )  # fmt: skip
    finally:
        _drop(url)
    assert doc["data"]["pending_turns"] == 50
    (run,) = doc["runs"]
    assert run["turns_sent"] == 50
    assert run["sessions"] == 25
    assert run["total_s"] >= run["send_s"] >= 0
    assert doc["queued_after_last_run"] == 50
    assert doc["uses_partial_index"] is True, doc["plan"]
    assert doc["target"]["met"] is False  # too small to count
