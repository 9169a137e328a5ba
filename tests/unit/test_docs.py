"""Every Python file the documentation names exists, so a move or a rename cannot leave a
page pointing at nothing.

A name is a path from the repository's root (`extraction/turns.py`) or the end of one, as the
pages write them in context (`resources.py` in a paragraph about `memory_service/`,
`pipeline/test_outages.py` in a table of integration tests): some file's path must be it or
end with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
NAMED = re.compile(r"`([\w./-]+\.py)`|\]\(([\w./-]+\.py)\)")
SKIP = {".venv", ".git", "node_modules"}


def python_files() -> list[str]:
    return [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*.py")
        if not SKIP.intersection(p.relative_to(ROOT).parts)
    ]


def named_paths(text: str) -> set[str]:
    """The ``.py`` names a Markdown text gives in backticks or as link targets."""
    return {(a or b).removeprefix("./") for a, b in NAMED.findall(text)}


def missing(names: set[str], files: list[str]) -> list[str]:
    """The names that no file answers to."""
    return sorted(n for n in names if not any(f == n or f.endswith("/" + n) for f in files))


def test_the_check_reads_backticks_and_links_and_refuses_a_missing_file() -> None:
    names = named_paths("see `core/db.py`, [the example](./examples/x.py) and `db.py`")
    assert names == {"core/db.py", "examples/x.py", "db.py"}
    assert missing(names, ["core/db.py"]) == ["examples/x.py"]
    assert missing({"core/db.py", "ore/db.py"}, ["core/db.py"]) == ["ore/db.py"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_python_file_a_page_names_exists(page: Path) -> None:
    assert missing(named_paths(page.read_text(encoding="utf-8")), python_files()) == []
