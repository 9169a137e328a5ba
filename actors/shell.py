"""What every actor does around its stage function: map waits onto ``dramatiq.Retry`` and send
the follow-up messages once the stage has returned (its transactions committed)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import dramatiq

from actors.broker import TurnBusyRetry, send_all
from actors.middleware import current_deps
from core.errors import MemoryUnavailableError, TurnBusyError
from extraction.stages import Send, StageDeps

log = logging.getLogger(__name__)

#: Added to a server-announced wait so the retry lands after the other side is ready.
RETRY_MARGIN_MS = 250


def retry_delay_ms(deps: StageDeps, seconds: float) -> int:
    settings = deps.settings
    wanted = int(seconds * 1000) + RETRY_MARGIN_MS
    return max(settings.retry_min_backoff_ms, min(wanted, settings.retry_max_backoff_ms))


def run_stage(stage: Callable[[StageDeps], list[Send]]) -> int:
    """Run ``stage`` with this process's dependencies, then send what it returned."""
    deps = current_deps()
    try:
        follow_ups = stage(deps)
    except TurnBusyError as exc:
        # Another delivery is calling the LLM for this turn: an expected wait, not an error.
        settings = deps.settings
        wanted = int((exc.retry_after or 0) * 1000) + RETRY_MARGIN_MS
        ceiling = max(settings.retry_max_backoff_ms, settings.extraction_claim_seconds * 1000)
        delay = max(settings.retry_min_backoff_ms, min(wanted, ceiling))
        raise TurnBusyRetry(str(exc), delay=delay) from exc
    except MemoryUnavailableError as exc:
        if exc.retry_after is None:
            raise
        log.warning("memory service asked to wait %.1fs: %s", exc.retry_after, exc)
        raise dramatiq.Retry(str(exc), delay=retry_delay_ms(deps, exc.retry_after)) from exc
    return send_all(follow_ups)


__all__ = ["retry_delay_ms", "run_stage"]
