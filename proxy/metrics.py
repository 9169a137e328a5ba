"""The chat path's Prometheus series (process-wide, created on first use).

=============================  =======  =====================================================
``ibex_chat_turns_total``      counter  turns by ``outcome`` (:mod:`sessions.chat`, which
                                        the worker counts with too): ``spooled``,
                                        ``recorded``, ``replayed``, ``failed``
``ibex_chat_injections_total`` counter  ``X-IBEX-Memory: inject`` calls by ``result``:
                                        ``injected``, ``empty`` (no memory matched),
                                        ``failed`` (answered without memories)
=============================  =======  =====================================================
"""

from __future__ import annotations

from core.counters import lazy_counter
from sessions.chat import TURN_OUTCOMES, count_turn, turns_counted

_injection_counter = lazy_counter(
    "ibex_chat_injections_total", "Memory injections by result.", ["result"]
)


def turn(outcome: str) -> None:
    count_turn(outcome)


def injection(result: str) -> None:
    _injection_counter().labels(result).inc()


def count(outcome: str) -> float:
    """The current value of ``ibex_chat_turns_total{outcome}`` in this process."""
    return turns_counted(outcome)


def exposition() -> tuple[bytes, str]:
    import prometheus_client as prom

    _injection_counter()
    return prom.generate_latest(), prom.CONTENT_TYPE_LATEST


__all__ = ["TURN_OUTCOMES", "count", "exposition", "injection", "turn"]
