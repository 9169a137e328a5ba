"""The one redelivery policy: how long a runner waits before it runs a failed message again.

Built from the settings (``RETRY_MIN_BACKOFF_MS``, ``RETRY_MAX_BACKOFF_MS``, ``MAX_RETRIES``,
``EXTRACTION_CLAIM_SECONDS``) and used by every runner: the worker (``actors.stage`` turns it
into ``dramatiq.Retry`` delays, and the broker's Retries middleware takes its backoff bounds
from it), ``ibex extract``'s inline driver and the tests' harness. (The public client's own
``RetryPolicy`` is how an application repeats a call; this is how the queue repeats a
message.)
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import Settings
from core.errors import MemoryUnavailableError, TurnBusyError

#: Added to a server-announced wait so the retry lands after the other side is ready.
RETRY_MARGIN_MS = 250
#: Exponents above this do not grow the backoff any more (it is capped long before).
_MAX_EXPONENT = 32


@dataclass(frozen=True)
class RedeliveryPolicy:
    min_backoff_ms: int
    max_backoff_ms: int
    max_retries: int
    claim_ms: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RedeliveryPolicy:
        return cls(
            min_backoff_ms=settings.retry_min_backoff_ms,
            max_backoff_ms=settings.retry_max_backoff_ms,
            max_retries=settings.max_retries,
            claim_ms=settings.extraction_claim_seconds * 1000,
        )

    def delay_for(self, exception: BaseException, attempt: int) -> int:
        """Milliseconds to wait before attempt ``attempt + 1`` of a message whose attempt
        ``attempt`` (0 for the first) failed with ``exception``:

        - a turn busy under another delivery's LLM claim: the claim's remaining time plus a
          margin, up to the claim's length (a wait, not a failure: it may exceed the backoff);
        - the memory service's ``Retry-After``: that wait plus a margin, within the backoff
          bounds;
        - anything else: exponential backoff from the minimum, capped at the maximum."""
        if isinstance(exception, TurnBusyError):
            wanted = int((exception.retry_after or 0) * 1000) + RETRY_MARGIN_MS
            ceiling = max(self.max_backoff_ms, self.claim_ms)
            return max(self.min_backoff_ms, min(wanted, ceiling))
        if isinstance(exception, MemoryUnavailableError) and exception.retry_after is not None:
            wanted = int(exception.retry_after * 1000) + RETRY_MARGIN_MS
            return max(self.min_backoff_ms, min(wanted, self.max_backoff_ms))
        return self.backoff(attempt)

    def backoff(self, attempt: int) -> int:
        """The exponential backoff after failed attempt ``attempt`` (0-based), without the
        jitter Dramatiq's Retries middleware adds (it halves and re-randomizes this)."""
        exponent = min(max(attempt, 0), _MAX_EXPONENT)
        return int(min(self.min_backoff_ms * 2**exponent, self.max_backoff_ms))

    @staticmethod
    def announced(exception: BaseException) -> bool:
        """Whether ``exception`` says how long to wait (a busy claim, a ``Retry-After``)."""
        if isinstance(exception, TurnBusyError):
            return True
        return isinstance(exception, MemoryUnavailableError) and exception.retry_after is not None


__all__ = ["RETRY_MARGIN_MS", "RedeliveryPolicy"]
