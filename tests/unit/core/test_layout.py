"""Guards on the package layout."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "name",
    [
        "actors",
        "models",
        "schema",
        "core",
        "extraction",
        "cli",
        "sessions",
        "memories",
        "embeddings",
    ],
)
def test_generic_package_names_resolve_inside_this_repository(name: str) -> None:
    # `actors`, `models`, `schema` and `cli` are also names of unrelated packages on PyPI.
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().parent == ROOT / name


def test_schema_imports_no_io_libraries() -> None:
    for path in (ROOT / "schema").glob("*.py"):
        text = path.read_text()
        for banned in ("dramatiq", "peewee", "httpx", "redis", "falcon"):
            assert f"import {banned}" not in text, f"{path.name} imports {banned}"


def test_procfile_names_the_contract_processes() -> None:
    lines = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line
    )
    assert set(lines) == {"release", "web", "worker", "scheduler", "proxy", "mcp"}
    assert lines["release"].strip() == "ibex migrate"
    assert "dramatiq actors" in lines["worker"] and "${PORT:-8000}" in lines["web"]


def test_imports_flow_one_way() -> None:
    # import-linter reads its contracts from setup.cfg: cli → actors → extraction |
    # memory_service → models → schema → core; nothing below actors imports cli, actors or
    # dramatiq; and schema imports no I/O library.
    import subprocess
    import sys

    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:]


PACKAGES = (
    "cli",
    "actors",
    "proxy",
    "mcp_server",
    "memory_service",
    "extraction",
    "memories",
    "sessions",
    "embeddings",
    "models",
    "schema",
    "core",
    "bench",
    "ibex_client",
)


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (Tarjan's strongly
    connected components of more than one module, or one that imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in imports.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == module:
                    break
            if len(group) > 1 or module in imports.get(module, ()):
                found.append(sorted(group))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def test_the_cycle_check_finds_a_cycle_through_three_modules() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(imports) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    # Imports inside functions count too: a cycle hidden in a function is still a cycle.
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert cycles(imports) == []


@pytest.mark.slow
def test_the_packages_type_check() -> None:
    import subprocess
    import sys

    mypy = Path(sys.executable).parent / "mypy"
    if not mypy.exists():
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    packages = [
        "core",
        "embeddings",
        "models",
        "schema",
        "sessions",
        "memories",
        "extraction",
        "memory_service",
        "actors",
        "proxy",
        "mcp_server",
        "cli",
        "client/ibex_client",
    ]
    result = subprocess.run(
        [str(mypy), *packages], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:]
