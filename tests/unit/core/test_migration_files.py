"""Which entries of a migrations folder are migrations: files named ``NNNNNN_name.sql`` only.

The packaged folder is also a Python package: it holds ``__init__.py`` and, once imported with
bytecode caching on (an install, or a checkout without ``PYTHONDONTWRITEBYTECODE``), a
``__pycache__`` folder, which must not stop ``ibex migrate`` or the schema check of every
command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core.migrate import load_migrations

ROOT = Path(__file__).resolve().parents[3]


def test_only_migration_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "000002_second.sql").write_text("SELECT 2;")
    (tmp_path / "000001_first.sql").write_text("SELECT 1;")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\x00\xff")
    (tmp_path / "000003_a_folder.sql").mkdir()  # named like one, but not a file
    (tmp_path / "notes.txt").write_text("not a migration")
    found = load_migrations(tmp_path)
    assert [(m.version, m.name, m.sql) for m in found] == [
        (1, "000001_first.sql", "SELECT 1;"),
        (2, "000002_second.sql", "SELECT 2;"),
    ]


def test_the_packaged_folder_loads_after_python_cached_its_bytecode() -> None:
    """A process that may write bytecode imports the ``migrations`` package (which creates
    its ``__pycache__``), then loads the migrations twice: every shipped file, each time."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    code = (
        "import sys; sys.dont_write_bytecode = False\n"
        "from core.migrate import load_migrations\n"
        "import migrations, pathlib\n"
        "folder = pathlib.Path(migrations.__file__).parent\n"
        "assert (folder / '__pycache__').is_dir(), 'no bytecode cache was written'\n"
        "print(len(load_migrations()), len(load_migrations()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shipped = sorted(p.name for p in (ROOT / "migrations").glob("[0-9]*_*.sql"))
    assert done.stdout.split() == [str(len(shipped))] * 2
