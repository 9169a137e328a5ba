"""The benchmarks' output: percentiles, the machine they ran on, JSON, text and Markdown
tables."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import psycopg2.extensions
import redis

from bench import BenchError
from bench.dbadmin import scalar
from bench.stack import terminate_on_sigterm


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def machine(conn: psycopg2.extensions.connection, client: redis.Redis) -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "postgres": scalar(conn, "SHOW server_version"),
        "redis": str(client.info("server").get("redis_version")),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def dumps(document: Any) -> str:
    return json.dumps(document, indent=2, sort_keys=True)


def table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A plain text table: the first column left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in header], *[[cell(c) for c in row] for row in body]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """The same table as :func:`table`, as GitHub Markdown."""
    lines = ["| " + " | ".join(str(c) for c in header) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in body:
        lines.append("| " + " | ".join(cell(c).strip() for c in row) + " |")
    return "\n".join(lines)


def cell(value: Any) -> str:
    """One table cell: None as "-", a float to about three significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"
    return str(value)


def run_and_print(
    prog: str,
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], Any],
    render: Callable[[Any], str],
) -> int:
    """A benchmark's ``main`` once its arguments are parsed: ``run`` (SIGTERM unwinds like
    Ctrl-C, so every process it started is stopped), then its document as stable JSON with
    ``--json``, else as text. Exit 130 when interrupted, 1 on a :class:`BenchError`."""
    try:
        with terminate_on_sigterm():
            document = run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(dumps(document) if args.json else render(document))
    return 0
