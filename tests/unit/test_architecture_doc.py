"""docs/architecture.md's walk of a turn and a memory names real code: every `file:function`
hop names a file that exists and defines that function, class or method, so a rename or a
move cannot leave the walk describing code that is not there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
HOP = re.compile(r"`([\w./-]+\.py):([\w.]+)`")


def hops(text: str) -> list[tuple[str, str]]:
    """The ``file:name`` hops a Markdown text gives in backticks, in order."""
    return HOP.findall(text)


def defines(source: str, name: str) -> bool:
    """Whether ``source`` defines ``name``: a top-level function or class, or ``Class.method``."""
    scope: list[ast.stmt] = ast.parse(source).body
    for part in name.split("."):
        found = next(
            (
                node
                for node in scope
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and node.name == part
            ),
            None,
        )
        if found is None:
            return False
        scope = found.body
    return True


def missing(pairs: list[tuple[str, str]], root: Path) -> list[str]:
    out = []
    for path, name in pairs:
        file = root / path
        if not file.is_file():
            out.append(f"{path}: no such file")
        elif not defines(file.read_text(encoding="utf-8"), name):
            out.append(f"{path}: defines no {name}")
    return out


def test_the_check_reads_hops_and_refuses_what_is_not_there(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "def f():\n    pass\n\nclass C:\n    def g(self):\n        pass\n"
    )
    text = "`m.py:f` → `m.py:C.g`, `m.py:C.h`, `m.py:g`, `n.py:f`; `m.py` alone is no hop"
    pairs = hops(text)
    assert pairs == [("m.py", "f"), ("m.py", "C.g"), ("m.py", "C.h"), ("m.py", "g"), ("n.py", "f")]
    assert missing(pairs, tmp_path) == [
        "m.py: defines no C.h",
        "m.py: defines no g",
        "n.py: no such file",
    ]


def test_the_walk_names_only_files_and_functions_that_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    pairs = hops(text)
    assert len(pairs) > 50  # the walk of a turn and of a memory, hop by hop
    assert missing(pairs, ROOT) == []
