"""``ibex status``: the extraction backlog per org, the queues and the dead letters."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.common import EXIT_OK
from core.config import Settings

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

    from actors.queue_stats import queue_counts
    from extraction.status import collect, render
    from schema.messages import Queue

    db = database(settings)
    client = redis_client(settings)
    try:
        status = collect(db, partial(queue_counts, client), queues=[q.value for q in Queue])
    except redis.RedisError as exc:
        print(f"ibex status: Redis unavailable ({exc}); showing Postgres only", file=sys.stderr)
        status = collect(db, None, queues=[queue.value for queue in Queue])
    if args.json:
        print(json.dumps(status.as_json(), indent=2, sort_keys=True))
    else:
        print(render(status))
    return EXIT_OK
