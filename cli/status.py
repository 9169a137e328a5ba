"""``ibex status``: the extraction backlog per org, the queues and the dead letters."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from cli.common import EXIT_OK
from core.config import Settings

if TYPE_CHECKING:
    from extraction.status import Status

DATABASE = True


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="extraction backlog per org, queues and dead letters")
    p.add_argument("--json", action="store_true", help="stable JSON output")


def redis_client(settings: Settings) -> Any:
    import redis

    return redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)


def database(settings: Settings) -> Any:
    from core.db import make_database
    from models import bind

    return bind(make_database(settings.require_database_url()))


def run(args: argparse.Namespace, settings: Settings) -> int:
    from functools import partial

    import redis

    from extraction.queues import queue_counts
    from extraction.status import collect
    from schema.messages import WORKER_QUEUES

    db = database(settings)
    client = redis_client(settings)
    try:
        status = collect(db, partial(queue_counts, client), queues=list(WORKER_QUEUES))
    except redis.RedisError as exc:
        print(f"ibex status: Redis unavailable ({exc}); showing Postgres only", file=sys.stderr)
        status = collect(db, None, queues=list(WORKER_QUEUES))
    if args.json:
        print(json.dumps(as_json(status), indent=2, sort_keys=True))
    else:
        print(render(status))
    return EXIT_OK


#: The queue figures read from Redis; without Redis they are unknown (the mirror is Postgres).
REDIS_FIGURES = ("ready", "delayed", "dead_redis")


def as_json(status: Status) -> dict[str, Any]:
    """The JSON of ``ibex status --json``: every queue has every figure, ``null`` where Redis
    did not answer (unknown, which 0 would hide)."""
    data = status.as_json()
    data["queues"] = {
        name: {**dict.fromkeys(REDIS_FIGURES), **figures}
        for name, figures in data["queues"].items()
    }
    return data


def render(status: Status) -> str:
    """A table for terminals."""
    columns = [
        ("org", "org"),
        ("sessions", "sessions_pending"),
        ("pending", "turns_pending"),
        ("in flight", "turns_in_flight"),
        ("waiting", "turns_waiting"),
        ("failed", "turns_failed"),
        ("done", "turns_done"),
        ("lag", "pointer_lag"),
        ("blocked", "sessions_blocked"),
        ("oldest", "oldest_pending_age_seconds"),
        ("LLM/h", "llm_calls_last_hour"),
        ("reused", "turns_reused"),
        ("memories", "memories"),
    ]
    rows = [[_cell(getattr(o, key)) for _, key in columns] for o in status.orgs]
    rows.append(["TOTAL"] + [_cell(status.total.get(key)) for _, key in columns[1:]])
    header = [title for title, _ in columns]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            h.rjust(w) if i else h.ljust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    ]
    for row in rows:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if status.queues:
        lines.append("")
        lines.append("queue                  ready  delayed  dead(redis)  dead(mirror)")
        for name, q in status.queues.items():
            # No Redis figures (Redis did not answer): "unknown", not 0.
            ready, delayed, dead = (q.get(k, "unknown") for k in REDIS_FIGURES)
            lines.append(
                f"{name:<20} {ready:>7}  {delayed:>7}  {dead:>11}  {q.get('dead_mirror', 0):>12}"
            )
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return _age(value)
    return str(value)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
