"""The search benchmarks still run: quality on the default labelled set, speed on a small data
set, each in its own process, checked for structure and invariants (not speed)."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.bench.test_bench_smoke import _run
from tests.servers import RunPostgres


def test_search_quality_benchmark(postgres_server: RunPostgres) -> None:
    url = postgres_server.create("bench_search_quality")
    try:
        doc = _run(
            "bench.search_quality",
            "--database-url", url,
            "--agents", "3",
            "--paraphrase-agents", "3",
            "--association-people", "3",
            "--fusion", "0.5:0.15:0.3",
            "--fusion", "0.5:0:0:5:0.2",
            "--context-tokens", "400",
            "--context-tokens", "120",
            timeout=180,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    rankers = doc["rankers"]
    assert set(rankers) == {"bm25", "lexical", "semantic", "hybrid"}
    kinds = {
        "all", "original", "associations", "direct", "inflected", "typo", "paraphrase-named",
        "paraphrase", "association", "association-hand",
    }  # fmt: skip
    for summary in rankers.values():
        assert set(summary) <= kinds and {"all", "direct", "paraphrase", "association"} <= set(
            summary
        )
        for kind in summary.values():
            assert 0 <= kind["recall_at_5"] <= 1 and 0 <= kind["mrr"] <= kind["recall_at_5"] + 1
            assert 0 <= kind["mrr"] <= 1
    # 12 paraphrase questions per one-person agent, 5 template questions per person of the
    # association part, each pair checked by the english stemmer.
    assert rankers["lexical"]["paraphrase"]["questions"] == 36
    assert rankers["lexical"]["association"]["questions"] == 15
    assert doc["paraphrase_pairs_checked"] >= 36 + 15
    assert doc["questions"] > rankers["bm25"]["all"]["questions"]  # no-answer ones aside
    # Every direct question's answer shares its words: both lexical rankings find all of them.
    assert rankers["lexical"]["direct"]["recall_at_5"] == 1.0
    assert rankers["bm25"]["direct"]["recall_at_5"] == 1.0
    assert rankers["lexical"]["all"]["recall_at_5"] >= rankers["bm25"]["all"]["recall_at_5"]
    # No shared word: the full-text search finds (almost) nothing; meaning does.
    assert rankers["lexical"]["paraphrase"]["recall_at_5"] <= 0.1
    assert rankers["lexical"]["association"]["recall_at_5"] <= 0.1
    assert rankers["semantic"]["paraphrase"]["recall_at_5"] > 0.3
    trials = {t["fusion"]: t for t in doc["fusion_trials"]}
    assert set(trials) == {"0.5:0.15:0.3:50:0", "0.5:0:0:5:0.2"}
    assert doc["settings"]["store_fusion"] in trials  # the store's calibration, restored after
    assert rankers["hybrid"] == trials["0.5:0.15:0.3:50:0"]["summary"]
    for trial in trials.values():
        assert isinstance(trial["beats_lexical"], bool)
    assert trials["0.5:0:0:5:0.2"]["beats_lexical"]
    # The context blocks, per budget: every memory packed for the query is at or above the
    # relevance bar; a no-answer question's block holds the person and nothing else.
    assert set(doc["context"]) == {"120", "400"}
    for blocks in doc["context"].values():
        assert {"all", "no-answer", "association"} <= set(blocks)
        for counts in blocks.values():
            assert 0 <= counts["coverage"] <= 1 and counts["below_bar"] == 0
            assert counts["mean_tokens"] <= 400
    assert doc["context"]["120"]["all"]["mean_tokens"] <= 120
    assert doc["context"]["400"]["no-answer"]["coverage"] == 0
    assert [r["threshold"] for r in doc["relevance_bar"]] == sorted(
        r["threshold"] for r in doc["relevance_bar"]
    )


def test_search_quality_benchmark_without_embeddings(postgres_server: RunPostgres) -> None:
    url = postgres_server.create("bench_search_quality_none")
    try:
        doc = _run(
            "bench.search_quality",
            "--database-url", url,
            "--agents", "2",
            "--paraphrase-agents", "1",
            "--association-people", "2",
            "--embeddings", "none",
            timeout=120,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert set(doc["rankers"]) == {"bm25", "lexical"}
    assert doc["fusion_trials"] == [] and doc["settings"]["model"] is None
    assert doc["rankers"]["lexical"]["paraphrase"]["questions"] == 12


def test_search_quality_refuses_a_bad_fusion() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.search_quality", "--fusion", "0.5:2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "WEIGHT:FLOOR:ENTRY" in done.stderr


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
    assert doc["settings"]["shape"] == "facts"
    # The memories' pages marked all-visible before anything is timed, as autovacuum leaves a
    # loaded table in service (the generation's own VACUUM, right after the load, marks none).
    visibility = doc["generation"]["visibility"]
    assert visibility["all_visible"] >= 0.99
    assert visibility["vacuums"] == 0 or visibility["all_visible_before"] < 0.99
    latency = doc["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    # Split by kind of question: every kind asked, each with its own ordered percentiles.
    by_kind = doc["latency_ms_by_kind"]
    assert set(by_kind) == {"name+common", "common", "typo", "multi-word", "meaning"}
    for kind in by_kind.values():
        assert 0 < kind["p50"] <= kind["p95"] <= kind["p99"] <= kind["max"] <= latency["max"]
    assert doc["slowest"]["ms"] == latency["max"]
    contexts = doc["context_ms"]  # the context blocks, timed after the searches
    assert 0 < contexts["p50"] <= contexts["p95"] <= contexts["p99"] <= contexts["max"]
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
    # Hybrid: a vector per memory, the semantic branch in the plan, its own plan shown.
    assert doc["generation"]["vectors"]["vectors"] == 4000
    assert doc["semantic_form"] in ("hnsw", "exact-window")
    assert doc["generation"]["vectors"]["hnsw_index"] == (doc["semantic_form"] == "hnsw")
    assert "semantic_candidates" in doc["plan"]
    assert doc["indexes_used"]["memory_embeddings_pkey"]  # the signal, one probe per candidate
    assert doc["meaning"]["question"] and "semantic_candidates" in doc["meaning"]["plan"]
    assert doc["semantic_plans"]
    for explained in doc["semantic_plans"]:
        assert explained["plan"].startswith("-- semantic branch: ")
        assert "memory_embeddings" in explained["plan"]


def test_search_speed_benchmark_conversation(postgres_server: RunPostgres) -> None:
    url = postgres_server.create("bench_search_speed_conversation")
    try:
        doc = _run(
            "bench.search_speed",
            "--database-url", url,
            "--shape", "conversation",
            "--memories", "200",
            "--agents", "2",
            "--queries", "10",
            "--contexts", "5",
            timeout=120,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert doc["settings"]["shape"] == "conversation"
    assert doc["settings"]["memories"] == 200
    # A vector per turn, each the model's vector of its own text.
    assert doc["generation"]["vectors"]["vectors"] == 200
    latency = doc["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    assert set(doc["latency_ms_by_kind"]) == {
        "one-speaker", "two-speakers", "content", "typo", "meaning",
    }  # fmt: skip
    contexts = doc["context_ms"]
    assert 0 < contexts["p50"] <= contexts["p95"] <= contexts["p99"] <= contexts["max"]
    # The questions name the agent's speakers: every one but the meaning ones finds turns.
    assert doc["mean_hits"] > 5
    assert "search_candidates" in doc["plan"] and "candidate branch" in doc["plan"]
    assert doc["meaning"]["question"] and "semantic_candidates" in doc["meaning"]["plan"]
