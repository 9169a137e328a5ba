"""Worker metrics: Dramatiq's series and the pipeline's ``ibex_*`` series on ``METRICS_PORT``,
scraped from a real worker (the Procfile line) after a run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.stack.processes import ROOT, free_port
from tests.integration.pipeline.test_e2e_workers import (  # noqa: F401 - the fixture
    _ibex,
    _start_worker,
    _write_sessions,
    stack,
)

pytestmark = pytest.mark.slow


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _total(samples: dict, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and all((k, v) in sample_labels for k, v in labels.items())
    )


def test_the_worker_exposes_dramatiq_and_pipeline_series(
    stack: dict[str, Any],  # noqa: F811 - the fixture imported above
    db: Any,
    tmp_path: Path,
) -> None:
    env = dict(stack["env"])
    port = free_port()
    env["METRICS_PORT"] = str(port)
    data = tmp_path / "sessions.jsonl"
    _write_sessions(data)
    assert _ibex(env, "import", str(data)).returncode == 0
    total = int(db.execute_sql("SELECT sum(turn_count) FROM ibex_core.sessions").fetchone()[0])
    launcher = stack["launcher"]
    worker = _start_worker(launcher, env)
    try:
        assert _ibex(env, "scan").returncode == 0
        deadline = time.monotonic() + 60
        while db.execute_sql(
            "SELECT count(*) FROM ibex_core.sessions WHERE last_extracted_turn < turn_count"
        ).fetchone()[0]:
            assert worker.alive(), worker.log_tail(3000)
            assert time.monotonic() < deadline, "the backlog did not drain"
            time.sleep(0.3)
        # The scan actor (not the inline `ibex scan`) refreshes the backlog gauges.
        subprocess.run(
            [sys.executable, "-c", "import actors; actors.scan_sessions.send()"],
            env=env,
            cwd=ROOT,
            check=True,
            timeout=30,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                text = ""
            samples = _samples(text)
            if _total(samples, "dramatiq_messages_total", actor_name="scan_sessions") >= 1 and (
                ("ibex_backlog_sessions", ()) in samples
            ):
                break
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.3)
    finally:
        launcher.stop_one(worker)
    memories = int(db.execute_sql("SELECT count(*) FROM ibex_memory.memories").fetchone()[0])
    assert _total(samples, "ibex_llm_calls_total", result="ok") == total
    assert _total(samples, "ibex_llm_tokens_total") > 0
    assert _total(samples, "ibex_write_outcomes_total", status="201") == memories
    assert _total(samples, "ibex_turns_done_total") == total
    assert _total(samples, "ibex_backlog_turns", state="pending") == 0
    assert samples[("ibex_backlog_sessions", ())] == 0
    assert _total(samples, "ibex_dead_letters", queue="extract") == 0
    assert _total(samples, "dramatiq_messages_total", actor_name="extract_turn") >= total
