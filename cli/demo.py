"""``ibex demo``: the whole system on this machine with the sample data (:mod:`cli.demo_run`)."""

from __future__ import annotations

import argparse
from typing import Any

from core.config import Settings

#: The demo brings its own databases when ``DATABASE_URL`` is unset, and migrates them.
DATABASE = False


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the whole system on this machine with sample data")
    p.add_argument("--fresh", action="store_true", help="start over with empty data")
    p.add_argument("--data-dir", help="where embedded servers keep data (~/.ibex/demo)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--threads", type=int, default=4, help="threads per worker (default 4)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for drain")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from cli.demo_run import run_demo

    return run_demo(args, settings)
