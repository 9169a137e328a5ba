"""``stage_actor``: a pipeline stage declared as a Dramatiq actor, one call from message to stage.

The decorated function states the message (its typed arguments: what ``.send`` takes and mypy
checks); its body is not run. Each delivery:

1. binds the arguments to that signature and validates them with the route's schema
   (:meth:`extraction.dispatch.Route.load`): a payload that does not bind or validate raises
   :class:`~core.errors.InvalidMessageError`, which every actor throws, so it is dead-lettered
   at once with the reason instead of retried;
2. calls the route's stage with the worker's dependencies (:class:`WorkerRuntime`, built once
   when the process boots and given to the actor when it is declared) and the delivery (the
   message's id and, on a retry, the LLM claim a failed attempt left);
3. maps what the stage raised onto what the queue does: a turn busy in another delivery waits
   (:class:`~actors.broker.TurnBusyRetry`, not counted against the retries), a memory service
   asking for time waits that long (``dramatiq.Retry``); an abandoned claim's token rides on
   the message into its retry, and only that retry may take the claim over;
4. sends the follow-up messages the stage returned, once its transactions have committed.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Callable
from typing import Any, ParamSpec, cast

import dramatiq
from dramatiq.middleware import CurrentMessage

from actors.broker import TurnBusyRetry, broker, send_all
from actors.runtime import WORKER, WorkerRuntime
from core.errors import (
    InvalidMessageError,
    MemoryUnavailableError,
    PermanentError,
    TurnBusyError,
)
from extraction.dispatch import Route
from extraction.retry import RedeliveryPolicy
from extraction.stages import Delivery, StageDeps

log = logging.getLogger(__name__)

P = ParamSpec("P")

#: The message option that carries an abandoned claim's token into the message's retry.
ABANDONED_CLAIM_OPTION = "ibex_abandoned_claim"


def delivery_of(message: Any | None) -> Delivery:
    """The running message as a :class:`Delivery` (empty outside a worker)."""
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


def _carry_into_retry(message: Any | None, delivery: Delivery) -> None:
    if message is None:
        return
    if delivery.abandoned_claim is None:
        message.options.pop(ABANDONED_CLAIM_OPTION, None)
    else:
        message.options[ABANDONED_CLAIM_OPTION] = str(delivery.abandoned_claim)


def _attempt(message: Any | None) -> int:
    return int(message.options.get("retries", 0) or 0) if message is not None else 0


def run_delivery(route: Route, runtime: WorkerRuntime, arguments: dict[str, Any]) -> int:
    """Steps 2-4 of the module docstring for one validated message; how many follow-ups."""
    deps = runtime.deps
    message = CurrentMessage.get_current_message()
    delivery = delivery_of(message)
    try:
        try:
            follow_ups = route.run(deps, arguments, delivery)
        except Exception:
            _carry_into_retry(message, delivery)
            raise
    except TurnBusyError as exc:
        # Another delivery is calling the LLM for this turn: an expected wait, not an error.
        delay = RedeliveryPolicy.from_settings(deps.settings).delay_for(exc, _attempt(message))
        raise TurnBusyRetry(str(exc), delay=delay) from exc
    except MemoryUnavailableError as exc:
        if exc.retry_after is None:
            raise  # the Retries middleware backs off, within the same policy's bounds
        log.warning("memory service asked to wait %.1fs: %s", exc.retry_after, exc)
        delay = RedeliveryPolicy.from_settings(deps.settings).delay_for(exc, _attempt(message))
        raise dramatiq.Retry(str(exc), delay=delay) from exc
    return send_all(follow_ups)


def stage_actor(
    route: Route,
    *,
    runtime: WorkerRuntime = WORKER,
    priority: int = 0,
    after: Callable[[StageDeps, int], None] | None = None,
) -> Callable[[Callable[P, None]], dramatiq.Actor[P, None]]:
    """Declare the decorated signature as the actor of ``route`` (the module docstring).
    ``after``: called with the dependencies and the number of follow-ups sent, once they
    are."""

    def declare(signature_of: Callable[P, None]) -> dramatiq.Actor[P, None]:
        signature = inspect.signature(signature_of)
        names = frozenset(signature.parameters)

        def deliver(*args: Any, **kwargs: Any) -> None:
            # A message sent by name with exactly the signature's names (what the pipeline
            # sends) binds to itself; anything else is bound by the signature, whose errors
            # say what is wrong.
            arguments = kwargs if not args and kwargs.keys() == names else None
            if arguments is None:
                try:
                    arguments = signature.bind(*args, **kwargs).arguments
                except TypeError as exc:
                    raise InvalidMessageError(f"invalid {route.actor} message: {exc}") from exc
            sent = run_delivery(route, runtime, route.load(arguments))
            if after is not None:
                after(runtime.deps, sent)

        deliver.__name__ = signature_of.__name__
        deliver.__qualname__ = signature_of.__qualname__
        deliver.__module__ = signature_of.__module__
        deliver.__doc__ = signature_of.__doc__
        deliver.__signature__ = signature  # type: ignore[attr-defined]
        declared = dramatiq.actor(
            actor_name=route.actor.value,
            queue_name=route.queue.value,
            priority=priority,
            throws=(PermanentError,),
            broker=broker,
        )
        # The signature is the decorated one (what ``.send`` takes and mypy checks).
        return declared(cast(Callable[P, None], deliver))

    return declare


__all__ = [
    "ABANDONED_CLAIM_OPTION",
    "WORKER",
    "WorkerRuntime",
    "delivery_of",
    "run_delivery",
    "stage_actor",
]
