"""The one retry policy: what each runner waits before running a failed message again."""

from __future__ import annotations

import pytest

from core.config import Settings
from core.errors import (
    DatabaseUnavailableError,
    LLMUnavailableError,
    MemoryUnavailableError,
    TurnBusyError,
)
from extraction.retry import RETRY_MARGIN_MS, RedeliveryPolicy


@pytest.fixture
def policy() -> RedeliveryPolicy:
    return RedeliveryPolicy.from_settings(
        Settings.from_env(
            {
                "RETRY_MIN_BACKOFF_MS": "100",
                "RETRY_MAX_BACKOFF_MS": "1000",
                "MAX_RETRIES": "4",
                "EXTRACTION_CLAIM_SECONDS": "30",
            }
        )
    )


def test_built_from_the_settings(policy: RedeliveryPolicy) -> None:
    assert policy == RedeliveryPolicy(
        min_backoff_ms=100, max_backoff_ms=1000, max_retries=4, claim_ms=30_000
    )


@pytest.mark.parametrize(
    ("attempt", "expected"), [(0, 100), (1, 200), (2, 400), (3, 800), (4, 1000), (60, 1000)]
)
def test_other_errors_back_off_exponentially_within_the_bounds(
    policy: RedeliveryPolicy, attempt: int, expected: int
) -> None:
    for exc in (
        LLMUnavailableError("timeout"),
        DatabaseUnavailableError("gone"),
        MemoryUnavailableError("502"),  # no Retry-After: plain backoff
    ):
        assert policy.delay_for(exc, attempt) == expected
        assert not RedeliveryPolicy.announced(exc)


def test_a_busy_turn_waits_for_the_claim_up_to_its_length(policy: RedeliveryPolicy) -> None:
    # Beyond the backoff maximum (1 s) but within the claim (30 s): a wait, not a failure.
    assert policy.delay_for(TurnBusyError("busy", retry_after=12.0), 0) == 12_000 + RETRY_MARGIN_MS
    assert policy.delay_for(TurnBusyError("busy", retry_after=90.0), 3) == 30_000
    assert policy.delay_for(TurnBusyError("busy", retry_after=0.0), 0) == RETRY_MARGIN_MS
    assert policy.delay_for(TurnBusyError("busy"), 5) == RETRY_MARGIN_MS
    assert RedeliveryPolicy.announced(TurnBusyError("busy"))


def test_retry_after_of_the_memory_service_is_honoured_within_the_backoff_bounds(
    policy: RedeliveryPolicy,
) -> None:
    ask = MemoryUnavailableError
    assert policy.delay_for(ask("429", retry_after=0.5), 3) == 500 + RETRY_MARGIN_MS
    assert policy.delay_for(ask("429", retry_after=60), 0) == 1000
    tiny = RedeliveryPolicy(min_backoff_ms=400, max_backoff_ms=1000, max_retries=1, claim_ms=1000)
    assert tiny.delay_for(ask("429", retry_after=0), 0) == 400
    assert RedeliveryPolicy.announced(ask("429", retry_after=1))
