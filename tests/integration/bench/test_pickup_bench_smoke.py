"""The pickup benchmark still runs, on tiny sizes, in its own process with a real worker
process: checked for structure and for what it must find whatever the machine (every message
run, a count of the quiet worker's commands), not for speed."""

from __future__ import annotations

from tests.integration.bench.test_bench_smoke import _run


def test_pickup_benchmark_tiny(redis_url: str) -> None:
    doc = _run(
        "bench.pickup",
        "--redis-url", redis_url,
        "--processes", "1",
        "--threads", "1",
        "--idle", "0",
        "--idle", "0.3",
        "--rounds", "2",
        "--quiet-seconds", "1",
        timeout=120,
    )  # fmt: skip
    assert set(doc) >= {"benchmark", "machine", "settings", "pickup", "quiet_commands_per_s"}
    assert set(doc["pickup"]) == {"0", "0.3"}
    for row in doc["pickup"].values():
        assert row["n"] == 2
        assert 0 <= row["p50_ms"] <= row["max_ms"]
    assert doc["quiet_commands_per_s"] > 0  # the heartbeat alone is one a second
