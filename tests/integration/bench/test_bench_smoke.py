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
    # A throwaway run warmed the services before the scenario; only the scenario is reported.
    assert doc["settings"]["warm_up_s"] > 0
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
        # The fake embeddings endpoint's own count: one request per turn, its memories in it.
        assert run["embedding_requests_per_turn"] == 1.0, (side, run)
        assert run["embedding_texts_per_turn"] == scenario["memories"], side
        assert "fake_embeddings" in run["cpu_s_per_turn"]
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


def test_pipeline_benchmark_seeds_tiny(
    tmp_path: Path, postgres_server: RunPostgres, redis_url: str
) -> None:
    """The seeds comparison: the pipeline, then one ``ibex extract --session`` per session in
    parallel on the same data, both complete, their wall times and ratio reported, and the
    targets table built from the result."""
    url = postgres_server.create("bench_seeds_smoke")
    try:
        doc = _run(
            "bench.pipeline",
            "--scenario", "seeds-tiny",
            "--no-warm-up",
            "--database-url", url,
            "--redis-url", redis_url,
            "--log-dir", str(tmp_path),
            timeout=90,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert doc["settings"]["warm_up_s"] is None
    (result,) = doc["scenarios"]
    scenario = result["scenario"]
    assert scenario["compare"] == "seeds"
    turns = scenario["sessions"] * scenario["turns"]
    for side in ("pipeline", "baseline"):
        run = result[side]
        assert run["complete"] is True, (side, run)
        assert run["turns"] == run["turns_done"] == run["pointer_turns"] == turns, side
        assert run["turns_failed"] == 0
        assert run["memories"] == turns * scenario["memories"], side
        assert run["llm_calls_per_turn"] == 1.0, side
        assert run["llm_requests_per_turn"] == 1.0, side
        assert run["http_requests_per_memory"] == 1.0, side
        # The wall time holds the database's window: the start is before the first lease,
        # the poll that ends it after the last pointer's commit.
        assert run["wall_s"] >= run["window_s"] > 0, side
    seeds = result["baseline"]
    assert seeds["sessions"] == scenario["sessions"]
    assert len(seeds["process_seconds"]) == scenario["sessions"]
    assert all(s is not None and s > 0 for s in seeds["process_seconds"]), seeds
    # The ibex extract processes are counted, and no worker ran for the seeds' side.
    assert seeds["cpu_s_per_turn"]["command"] > 0
    assert "workers" not in seeds["cpu_s_per_turn"]
    ratios = result["ratios"]
    assert ratios["seeds_over_pipeline_wall"] == round(
        seeds["wall_s"] / result["pipeline"]["wall_s"], 2
    )
    assert ratios["seeds_over_pipeline_window"] > 0
    assert ratios["cpu_per_turn_pipeline_over_baseline"] > 0
    (row,) = doc["summary"]
    assert row["scenario"] == "seeds-tiny"
    assert row["value"] == ratios["seeds_over_pipeline_wall"]
    assert row["met"] is (row["value"] >= 3)

    from bench.pipeline import render_markdown, render_summary, summary

    markdown = render_markdown(doc)
    assert "| seeds-tiny pipeline | seeds' design |" in markdown
    assert render_summary(doc) in markdown
    # The rows taken from the other scenarios read the same fields of their result.
    as_overhead = {**result, "scenario": {**scenario, "name": "overhead", "compare": "extract"}}
    cpu, sql, redis, calls, embeddings = summary([as_overhead])
    assert cpu["target"] == "<= 1.30x"
    assert calls["value"] == result["pipeline"]["llm_calls_per_turn"] == 1.0
    assert embeddings["value"] == result["pipeline"]["embedding_requests_per_turn"] == 1.0
    assert embeddings["met"] is True
    assert cpu["value"] == ratios["cpu_per_turn_pipeline_over_baseline"]
    # Counted from the server log: the machine's Postgres and the embedded one both write it
    # where the benchmark reads it; only a server whose log cannot be read has no count.
    assert doc["settings"]["sql_statement_log"] or not postgres_server.embedded
    if doc["settings"]["sql_statement_log"]:
        assert sql["value"] == result["pipeline"]["sql_statements_per_turn"]["total"] > 0
    else:
        assert sql["value"] is None and result["pipeline"]["sql_statements_per_turn"] is None
    assert redis["value"] == result["pipeline"]["redis_commands_per_turn"]
    assert redis["met"] is (redis["value"] <= 45)


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


def test_pipeline_benchmark_tiny_with_tracing(
    tmp_path: Path, postgres_server: RunPostgres, redis_url: str
) -> None:
    """``--tracing``: the web, the workers and ``ibex scan`` export their spans to the local
    sink, whose CPU is reported apart; every turn's spans arrive."""
    url = postgres_server.create("bench_tracing_smoke")
    try:
        doc = _run(
            "bench.pipeline",
            "--scenario", "tiny",
            "--tracing",
            "--database-url", url,
            "--redis-url", redis_url,
            "--log-dir", str(tmp_path),
            timeout=90,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert doc["settings"]["tracing"] is True
    # No warm-up with tracing: the sink's counts are the scenario's own.
    assert doc["settings"]["warm_up_s"] is None
    (result,) = doc["scenarios"]
    scenario = result["scenario"]
    turns = scenario["sessions"] * scenario["turns"]
    run = result["pipeline"]
    assert run["complete"] is True and run["turns_failed"] == 0
    assert "fake_trace_sink" in run["cpu_s_per_turn"]
    # Per turn at least: its root, extract, the LLM call, and per memory a write, the POST's
    # two sides; then the pointer.
    traces = doc["settings"]["trace_spans"]
    assert traces["spans"] >= turns * (4 + 3 * scenario["memories"])
    # Where a turn's time went: the mean duration of each kind of span, the LLM call among them.
    llm = [v for name, v in traces["by_name"].items() if name.startswith("chat ")]
    assert llm and all(v["count"] >= 1 and v["mean_ms"] > 0 for v in llm)
    assert traces["by_name"]["extract_turn process"]["count"] >= turns
    # Each memory POST seen from both sides: its time outside the web's handler, before and
    # after it.
    gaps = traces["gaps"]["POST /v1/memories"]
    assert gaps["count"] >= turns * scenario["memories"]
    assert gaps["before_server_ms"] > 0 and gaps["after_server_ms"] > 0
