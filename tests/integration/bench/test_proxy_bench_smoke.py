"""The proxy overhead benchmark still runs: the Procfile's proxy line, the fake LLM and a
private Redis, a few calls of each kind, checked for structure and invariants (not speed)."""

from __future__ import annotations

from tests.integration.bench.test_bench_smoke import _run
from tests.servers import RunPostgres


def test_proxy_overhead_benchmark_small(postgres_server: RunPostgres) -> None:
    url = postgres_server.create("bench_proxy")
    try:
        doc = _run(
            "bench.proxy_overhead", "--database-url", url, "--calls", "20", "--warmup", "2",
            timeout=120,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert set(doc["kinds"]) == {"direct", "proxy", "recorded"}
    for kind in doc["kinds"].values():
        assert 0 < kind["p50_ms"] <= kind["p99_ms"]
    # Every recorded call put exactly one turn on the spool; pass-through calls put none.
    assert doc["spooled"] == doc["spooled_expected"] == 22
