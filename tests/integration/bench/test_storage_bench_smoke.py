"""The storage benchmark still runs, on tiny sizes, in its own process: checked for structure
and for what it must find whatever the machine (not for speed)."""

from __future__ import annotations

from pathlib import Path

from tests.integration.bench.test_bench_smoke import _run
from tests.servers import RunPostgres


def test_storage_benchmark_tiny(tmp_path: Path, postgres_server: RunPostgres) -> None:
    url = postgres_server.create("bench_storage_smoke")
    try:
        doc = _run(
            "bench.storage",
            "--posts", "40",
            "--turns", "20",
            "--database-url", url,
            "--log-dir", str(tmp_path),
            timeout=120,
        )  # fmt: skip
    finally:
        postgres_server.drop(url)
    assert set(doc) >= {"benchmark", "machine", "settings", "redis", "postgres", "seconds"}
    redis_doc, pg = doc["redis"], doc["postgres"]
    assert redis_doc["posts"] == redis_doc["records"] == 40
    assert 0 < redis_doc["memory_usage_per_post"] <= redis_doc["memory_usage_max"] <= 200
    assert redis_doc["record_ttl_s"] > 86000
    assert redis_doc["extract_records"] == pg["memories"] == 60  # one record per POST
    assert (pg["turns"], pg["memories_per_turn"]) == (20, 3.0)
    tables = pg["bytes_per_turn"]
    for table in ("ibex_core.extraction_turns", "ibex_core.extraction_slots"):
        assert tables[table]["total"] > 0
    assert tables["ibex_memory.memories"]["indexes"] > 0
    assert pg["prunable_bytes_per_turn"] < pg["total_bytes_per_turn"]
    assert pg["prune"]["turns"] == 20 and pg["prune"]["slots"] == 60
    assert pg["prune"]["rows_left"]["ibex_core.extraction_turns"] == 0
    assert pg["prune"]["rows_left"]["ibex_memory.memories"] == 60
