"""The search benchmarks still run: quality on the default labelled set, speed on a small data
set, each in its own process, checked for structure and invariants (not speed)."""

from __future__ import annotations

from tests.integration.bench.test_bench_smoke import _run
from tests.servers import RunPostgres


def test_search_quality_benchmark(postgres_server: RunPostgres) -> None:
    url = postgres_server.create("bench_search_quality")
    try:
        doc = _run("bench.search_quality", "--database-url", url, timeout=120)
    finally:
        postgres_server.drop(url)
    assert doc["questions"] >= 150
    assert set(doc["ours"]) == set(doc["bm25"]) >= {"all", "direct", "inflected", "typo"}
    for side in ("ours", "bm25"):
        for kind in doc[side].values():
            assert 0 <= kind["recall_at_5"] <= 1 and 0 <= kind["mrr"] <= 1
    # Every question's answer shares the words of a direct question: both find all of them.
    assert doc["ours"]["direct"]["recall_at_5"] == doc["bm25"]["direct"]["recall_at_5"] == 1.0
    assert doc["ours"]["all"]["recall_at_5"] >= doc["bm25"]["all"]["recall_at_5"]


def test_search_speed_benchmark_small(postgres_server: RunPostgres) -> None:
    url = postgres_server.create("bench_search_speed")
    try:
        doc = _run(
            "bench.search_speed",
            "--database-url", url,
            "--memories", "4000",
            "--agents", "4",
            "--queries", "20",
            timeout=120,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert doc["settings"]["memories"] == 4000
    latency = doc["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    # Split by kind of question: every kind asked, each with its own ordered percentiles.
    by_kind = doc["latency_ms_by_kind"]
    assert set(by_kind) == {"name+common", "common", "typo", "multi-word"}
    for kind in by_kind.values():
        assert 0 < kind["p50"] <= kind["p95"] <= kind["p99"] <= kind["max"] <= latency["max"]
    assert doc["slowest"]["ms"] == latency["max"]
    assert "candidate branch" in doc["slowest"]["plan"]
    assert doc["mean_hits"] > 0
    # Which indexes the planner picks depends on the size; the report names each.
    assert set(doc["indexes_used"]) >= {
        "idx_memories_fts",
        "idx_memories_fts_agent",
        "idx_memories_agent",
    }
    assert isinstance(doc["meets_target"], bool)
    assert "search_candidates" in doc["plan"] and "candidate branch" in doc["plan"]
