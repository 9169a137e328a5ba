"""A Prometheus series made on first use, shared by a process's threads: a module that counts
need not build its series at import (a command that never counts never registers them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def lazy_counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Callable[[], Any]:
    """A function that returns the counter ``name``, made the first time it is asked for."""
    made: list[Any] = []
    lock = threading.Lock()

    def counter() -> Any:
        if not made:
            with lock:
                if not made:
                    import prometheus_client as prom

                    made.append(prom.Counter(name, documentation, list(labels)))
        return made[0]

    return counter
