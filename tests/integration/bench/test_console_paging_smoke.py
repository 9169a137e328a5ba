"""The console paging benchmark still runs on a small data set (structure, not speed)."""

from __future__ import annotations

from tests.integration.bench.test_bench_smoke import _run
from tests.servers import RunPostgres


def test_console_paging_benchmark_small(postgres_server: RunPostgres, redis_url: str) -> None:
    url = postgres_server.create("bench_console")
    try:
        doc = _run(
            "bench.console_paging",
            "--database-url", url,
            "--redis-url", redis_url,
            "--memories", "300",
            "--turns", "120",
            "--pages", "3",
            timeout=180,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert (doc["memories"], doc["turns"]) == (300, 120)
    # 300 memories are 6 pages of 50: the walk follows the "next" links for the 3 asked.
    assert doc["person_page"]["requests"] == 3
    assert doc["conversation_page"]["requests"] == 3
    for name in ("person_page", "person_page_one_kind", "conversation_page"):
        figures = doc[name]
        assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"]
    assert "load average" in doc["load_before"]
