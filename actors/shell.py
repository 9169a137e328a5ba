"""What every actor does around its stage function: take the message the shape check
validated (:mod:`actors.middleware`), map waits onto ``dramatiq.Retry`` with the delays of the
one :class:`~extraction.retry.RetryPolicy`, send the follow-up messages once the stage has
returned (its transactions committed), and carry an abandoned LLM claim into the message's
retry.

A stage that fails holding a claim it could not release (the database was unavailable) says so
on its :class:`~extraction.stages.Delivery`; the token goes into the message's options, which
the Retries middleware enqueues with the retry. Only that retry carries it, so only it may take
the claim over at once: a redelivery of a stalled worker's message has the same message id but
the options it was first sent with, and waits for the claim like any other delivery."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from actors.broker import TurnBusyRetry, send_all
from actors.middleware import current_deps, take_validated
from core.errors import MemoryUnavailableError, TurnBusyError
from extraction.dispatch import Route
from extraction.retry import RetryPolicy
from extraction.stages import Delivery, Send, StageDeps

log = logging.getLogger(__name__)


#: The message option that carries an abandoned claim's token into the message's retry.
ABANDONED_CLAIM_OPTION = "ibex_abandoned_claim"


def current_delivery() -> Delivery:
    """The running message as a :class:`Delivery` (empty outside a worker)."""
    message = CurrentMessage.get_current_message()
    if message is None:
        return Delivery()
    claim: uuid.UUID | None = None
    raw = message.options.get(ABANDONED_CLAIM_OPTION)
    if raw:
        try:
            claim = uuid.UUID(str(raw))
        except ValueError:
            log.warning("ignoring a malformed %s option: %r", ABANDONED_CLAIM_OPTION, raw)
    return Delivery(message_id=str(message.message_id), abandoned_claim=claim)


def _carry_into_retry(delivery: Delivery) -> None:
    message = CurrentMessage.get_current_message()
    if message is None:
        return
    if delivery.abandoned_claim is None:
        message.options.pop(ABANDONED_CLAIM_OPTION, None)
    else:
        message.options[ABANDONED_CLAIM_OPTION] = str(delivery.abandoned_claim)


def run_stage(stage: Callable[[StageDeps], list[Send]], *, delivery: Delivery | None = None) -> int:
    """Run ``stage`` with this process's dependencies, then send what it returned. When the
    stage fails, what ``delivery`` says about its claim goes into the message's retry."""
    deps = current_deps()
    try:
        try:
            follow_ups = stage(deps)
        except Exception:
            if delivery is not None:
                _carry_into_retry(delivery)
            raise
    except TurnBusyError as exc:
        # Another delivery is calling the LLM for this turn: an expected wait, not an error.
        delay = RetryPolicy.from_settings(deps.settings).delay_for(exc, _attempt())
        raise TurnBusyRetry(str(exc), delay=delay) from exc
    except MemoryUnavailableError as exc:
        if exc.retry_after is None:
            raise  # the Retries middleware backs off, within the same policy's bounds
        log.warning("memory service asked to wait %.1fs: %s", exc.retry_after, exc)
        delay = RetryPolicy.from_settings(deps.settings).delay_for(exc, _attempt())
        raise dramatiq.Retry(str(exc), delay=delay) from exc
    return send_all(follow_ups)


def _attempt() -> int:
    message = CurrentMessage.get_current_message()
    return int(message.options.get("retries", 0) or 0) if message is not None else 0


def run_route(route: Route, kwargs: Mapping[str, Any]) -> int:
    """An actor's body: run ``route``'s stage on the message, validated once (by the shape
    check before the actor ran, or here when no shape check ran), then send the follow-ups."""
    message = take_validated()
    if message is None:
        message = route.load(kwargs)
    delivery = current_delivery()
    return run_stage(lambda deps: route.run(deps, message, delivery), delivery=delivery)


__all__ = ["ABANDONED_CLAIM_OPTION", "current_delivery", "run_route", "run_stage"]
