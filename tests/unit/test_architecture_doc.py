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


#: The floors of the house, top first, as setup.cfg's layers contract states them: a package's
#: floor is its index here. A walk that goes from a floor to a higher one (a smaller index)
#: climbs back up.
FLOORS = (
    ("cli",),
    ("actors", "proxy", "mcp_server", "memory_service"),
    ("extraction", "memories"),
    ("sessions", "embeddings"),
    ("models",),
    ("schema",),
    ("core", "client"),
)
WALKS = ("## One turn through the code", "## One memory through the code")
STEP = re.compile(r"^\d+\. ", re.M)
#: A hop written as a return (``← `file:name` ``): the answer going back up, allowed to climb.
RETURN = re.compile(r"←\s*`([\w./-]+\.py):([\w.]+)`")


def floor(path: str) -> int:
    package = path.split("/")[0]
    return next(i for i, names in enumerate(FLOORS) if package in names)


def climbs(step: str) -> list[str]:
    """The hops of one step of a walk that stand on a higher floor than the hop the step
    starts from (returns aside)."""
    returns = set(RETURN.findall(step))
    pairs = [pair for pair in hops(step) if pair not in returns]
    if not pairs:
        return []
    start = floor(pairs[0][0])
    return [f"{path}:{name}" for path, name in pairs[1:] if floor(path) < start]


def walk_steps(text: str) -> list[str]:
    """Every numbered step of the two walks."""
    steps = []
    for heading in WALKS:
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        starts = [m.start() for m in STEP.finditer(section)]
        for a, b in zip(starts, [*starts[1:], len(section)], strict=True):
            steps.append(section[a:b].split("\n\n", 1)[0])
    return steps


def test_the_climb_check_finds_a_hop_above_the_start() -> None:
    assert climbs("`extraction/a.py:f` → `sessions/b.py:g` → ← `actors/c.py:h`") == []
    assert climbs("`extraction/a.py:f` → `actors/c.py:h`") == ["actors/c.py:h"]


def test_no_step_of_a_walk_climbs_back_up_but_to_return() -> None:
    steps = walk_steps(DOC.read_text(encoding="utf-8"))
    assert len(steps) >= 15
    assert {step.split("\n", 1)[0][:60]: climbs(step) for step in steps if climbs(step)} == {}
