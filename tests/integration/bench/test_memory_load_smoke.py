"""``bench.memory_load --compare`` still runs, on a tiny load, in its own process: both servers
start under the Procfile's web line, answer every POST with 201, and the Redis commands per
POST are what each app sends (checked for structure and counts, not for speed). With
``--embeddings none`` the memory service stores no vector; by default every memory has one."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg2
import pytest

from tests.integration.bench.test_bench_smoke import _run
from tests.servers import RunPostgres

pytestmark = pytest.mark.skipif(
    shutil.which("wrk") is None, reason="the comparison's load generator, wrk, is not installed"
)


@pytest.mark.parametrize("embeddings", ["local", "none"])
def test_memory_load_compare_tiny(
    tmp_path: Path, postgres_server: RunPostgres, embeddings: str
) -> None:
    url = postgres_server.create("bench_memory_load_smoke")
    try:
        doc = _run(
            "bench.memory_load",
            "--compare",
            "--seconds", "1",
            "--warmup", "1",
            "--rounds", "1",
            "--concurrency", "4",
            "--workers", "1",
            "--threads", "2",
            "--database-url", url,
            "--log-dir", str(tmp_path),
            "--embeddings", embeddings,
            timeout=120,
        )  # fmt: skip
        with psycopg2.connect(url) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT (SELECT count(*) FROM ibex_memory.memories),"
                " (SELECT count(*) FROM ibex_memory.memory_embeddings)"
            )
            memories, vectors = cur.fetchone()
        conn.close()
    finally:
        postgres_server.drop(url)
    assert set(doc) >= {"benchmark", "settings", "real", "calibration", "ratio", "seconds"}
    assert doc["settings"]["embeddings"] == embeddings
    assert memories > 0
    assert vectors == (memories if embeddings == "local" else 0)
    for name in ("real", "calibration"):
        side = doc[name]
        (run,) = side["runs"]
        assert run["requests"] > 0 and side["requests_per_s"] > 0, name
        assert side["non_2xx"] == 0, name
        assert 0 < side["p50_ms"] <= side["p99_ms"], name
        assert side["cpu_ms_per_request"]["server"] > 0, name
    # A POST with a new key: the claim (SET) and the completion (EVALSHA of GET + SET); the
    # calibration app's SET NX and SET. Requests still in flight when wrk stops blur the
    # last digit.
    real = doc["real"]["redis_per_command"]
    assert set(real) == {"set", "evalsha", "get"}
    assert doc["real"]["redis_commands_per_request"] == pytest.approx(4, abs=0.2)
    assert set(doc["calibration"]["redis_per_command"]) == {"set"}
    assert doc["calibration"]["redis_commands_per_request"] == pytest.approx(2, abs=0.2)
    assert doc["ratio"] == pytest.approx(
        doc["real"]["requests_per_s"] / doc["calibration"]["requests_per_s"], abs=0.01
    )
