"""``ibex migrate``: apply the SQL migrations (idempotent); the one command that runs without
a migrated database."""

from __future__ import annotations

import argparse
from typing import Any

from cli.common import EXIT_OK
from core.config import Settings

#: ``ibex migrate`` is what makes the database current: it must not check the schema first.
DATABASE = False


def add_parser(sub: Any) -> None:
    sub.add_parser("migrate", help="apply the SQL migrations (idempotent)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from core.migrate import migrate

    applied = migrate(settings.require_database_url())
    if applied:
        for name in applied:
            print(f"applied {name}")
    else:
        print("database is up to date")
    return EXIT_OK
