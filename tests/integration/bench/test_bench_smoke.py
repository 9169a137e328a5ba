"""The benchmarks still run: the pipeline benchmark on a tiny scenario and the scan benchmark on
a small data set, each in its own process, checked for structure and invariants (not speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.servers import RunPostgres

ROOT = Path(__file__).resolve().parents[3]


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


def test_pipeline_benchmark_tiny(
    tmp_path: Path, postgres_server: RunPostgres, redis_url: str
) -> None:
    url = postgres_server.create("bench_smoke")
    try:
        doc = _run(
            "bench.pipeline",
            "--scenario", "tiny",
            "--database-url", url,
            "--redis-url", redis_url,
            "--log-dir", str(tmp_path),
            timeout=90,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
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


def test_scan_benchmark_small(postgres_server: RunPostgres, redis_url: str) -> None:
    url = postgres_server.create("bench_scan_smoke")
    try:
        doc = _run(
            "bench.scan",
            "--database-url", url,
            "--redis-url", redis_url,
            "--sessions", "2000",
            "--pending-sessions", "25",
            "--turns", "2",
            "--orgs", "5",
            "--agents-per-org", "2",
            "--repeat", "1",
            timeout=60,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert doc["data"]["pending_turns"] == 50
    (run,) = doc["runs"]
    assert run["turns_sent"] == 50
    assert run["sessions"] == 25
    assert run["total_s"] >= run["send_s"] >= 0
    assert doc["queued_after_last_run"] == 50
    assert doc["uses_partial_index"] is True, doc["plan"]
    assert doc["target"]["met"] is False  # too small to count
