"""The chat path's Prometheus series (process-wide, created on first use).

=============================  =======  =====================================================
``ibex_chat_turns_total``      counter  turns by ``outcome``: ``spooled`` (proxy: on the
                                        spool), ``recorded`` (worker: stored as a new turn),
                                        ``replayed`` (worker: the session already held it),
                                        ``failed`` (proxy: the spool write failed or the
                                        answer could not be read; worker: refused for good)
``ibex_chat_injections_total`` counter  ``X-IBEX-Memory: inject`` calls by ``result``:
                                        ``injected``, ``empty`` (no memory matched),
                                        ``failed`` (answered without memories)
=============================  =======  =====================================================
"""

from __future__ import annotations

import threading
from typing import Any

TURN_OUTCOMES = ("spooled", "recorded", "replayed", "failed")

_lock = threading.Lock()
_series: dict[str, Any] | None = None


def _metrics() -> dict[str, Any]:
    global _series
    if _series is None:
        with _lock:
            if _series is None:
                import prometheus_client as prom

                _series = {
                    "turns": prom.Counter(
                        "ibex_chat_turns_total", "Chat path turns by outcome.", ["outcome"]
                    ),
                    "injections": prom.Counter(
                        "ibex_chat_injections_total", "Memory injections by result.", ["result"]
                    ),
                }
    return _series


def turn(outcome: str) -> None:
    assert outcome in TURN_OUTCOMES, outcome
    _metrics()["turns"].labels(outcome).inc()


def injection(result: str) -> None:
    _metrics()["injections"].labels(result).inc()


def count(outcome: str) -> float:
    """The current value of ``ibex_chat_turns_total{outcome}`` in this process."""
    return float(_metrics()["turns"].labels(outcome)._value.get())


def exposition() -> tuple[bytes, str]:
    import prometheus_client as prom

    _metrics()
    return prom.generate_latest(), prom.CONTENT_TYPE_LATEST
