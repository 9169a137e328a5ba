"""client/README.md's table of the Python client's methods is the client's: every public method of
``IbexClient`` and ``AsyncIbexClient`` is listed, with the parameters it takes, and the table
lists nothing the client does not have."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from ibex_client import AsyncIbexClient, IbexClient

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"^## Methods\n(.*?)(?=^## |\Z)", re.DOTALL | re.MULTILINE)
CALL = re.compile(r"`(\w+)\(([^`]*)\)`")


def listed() -> dict[str, list[str]]:
    """Method name to its parameter names, as the README's table writes them."""
    section = SECTION.search((ROOT / "client" / "README.md").read_text(encoding="utf-8"))
    assert section is not None, "client/README.md has no Methods section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("| `")]
    methods: dict[str, list[str]] = {}
    for row in rows:
        for name, params in CALL.findall(row.split("|")[1]):
            methods[name] = [
                p.split("=")[0].strip() for p in params.split(",") if p.strip() not in ("", "*")
            ]
    return methods


def public(cls: type) -> dict[str, list[str]]:
    return {
        name: [p for p in inspect.signature(member).parameters if p != "self"]
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_the_readme_lists_every_public_method_with_its_parameters() -> None:
    table = listed()
    assert table == public(IbexClient)


def test_the_async_client_has_the_same_methods_but_aclose() -> None:
    sync, aio = public(IbexClient), public(AsyncIbexClient)
    assert set(aio) - set(sync) <= {"aclose"}
    assert {name: params for name, params in aio.items() if name in sync} == {
        name: params for name, params in sync.items() if name in aio
    }
