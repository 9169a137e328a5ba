"""The one dispatch table: actor name → (message schema, stage function, queue).

Every runner of the pipeline reads it: the Dramatiq actors are declared from it (name, queue),
the worker's shape check validates a message with its schema, and ``ibex extract``'s inline
driver and the tests' harness run a message through :func:`run_message`. A message is
validated once, by :meth:`Route.load`; the stage adapter gets the validated values.

It lives here, in ``extraction``, because it is pure data about the pipeline (names from
``schema.messages``, the stage functions of :mod:`extraction.stages`) and every runner sits
at or above this layer; the broker (``actors``) declares its actors from it, never the
reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema

from core.errors import InvalidMessageError
from extraction import stages
from extraction.stages import Delivery, Send, StageDeps
from schema import load
from schema.messages import MESSAGE_SCHEMAS, ActorName, Queue, quick_load

#: A stage as a runner calls it: the validated message, and the delivery it is an attempt of.
StageCall = Callable[[StageDeps, Mapping[str, Any], Delivery | None], list[Send]]


@dataclass(frozen=True)
class Route:
    """How one actor's messages are checked and run."""

    actor: ActorName
    queue: Queue
    schema: Schema
    stage: StageCall

    def load(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The message validated (UUIDs parsed), or InvalidMessageError naming every bad field:
        retrying cannot fix it, so it dead-letters at once."""
        quick = quick_load(self.actor, kwargs)
        if quick is not None:
            return quick
        return dict(load(self.schema, dict(kwargs), what=f"{self.actor} message"))

    def run(
        self, deps: StageDeps, message: Mapping[str, Any], delivery: Delivery | None = None
    ) -> list[Send]:
        """Run the stage on a message :meth:`load` validated; return its follow-ups."""
        return self.stage(deps, message, delivery)


def _scan(deps: StageDeps, m: Mapping[str, Any], delivery: Delivery | None) -> list[Send]:
    return stages.scan(deps, session_id=m["session_id"]).sent


def _extract(deps: StageDeps, m: Mapping[str, Any], delivery: Delivery | None) -> list[Send]:
    return stages.extract_turn(
        deps, m["org_id"], m["session_id"], m["turn_index"], delivery=delivery
    )


def _write(deps: StageDeps, m: Mapping[str, Any], delivery: Delivery | None) -> list[Send]:
    return stages.write_memory(deps, m["org_id"], m["session_id"], m["turn_index"], m["ordinal"])


def _pointer(deps: StageDeps, m: Mapping[str, Any], delivery: Delivery | None) -> list[Send]:
    return stages.complete_turn(deps, m["org_id"], m["session_id"], m["turn_index"])


def _route(actor: ActorName, queue: Queue, stage: StageCall) -> Route:
    return Route(actor, queue, MESSAGE_SCHEMAS[actor](), stage)


#: actor name → its route, in pipeline order.
ROUTES: dict[str, Route] = {
    ActorName.SCAN: _route(ActorName.SCAN, Queue.SCAN, _scan),
    ActorName.EXTRACT: _route(ActorName.EXTRACT, Queue.EXTRACT, _extract),
    ActorName.WRITE: _route(ActorName.WRITE, Queue.WRITE, _write),
    ActorName.POINTER: _route(ActorName.POINTER, Queue.POINTER, _pointer),
}


def route_of(actor_name: str) -> Route:
    """The route of ``actor_name``; InvalidMessageError for an actor the pipeline has not."""
    found = ROUTES.get(actor_name)
    if found is None:
        raise InvalidMessageError(f"unknown actor {actor_name!r}")
    return found


def run_message(
    deps: StageDeps,
    actor_name: str,
    kwargs: Mapping[str, Any],
    *,
    delivery: Delivery | None = None,
) -> list[Send]:
    """Validate a message and run its stage inline (``ibex extract``, the tests' harness).
    Pass the same ``delivery`` to every attempt of one message."""
    route = route_of(actor_name)
    return route.run(deps, route.load(kwargs), delivery)


__all__ = ["ROUTES", "Route", "StageCall", "route_of", "run_message"]
