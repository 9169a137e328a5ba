"""What a runnable message looks like: the check of a Dramatiq message's envelope.

The consumer's guard (:mod:`actors.guard`) runs it on every fetched payload, the worker's
dead-letter mirror (:mod:`actors.middleware`) and ``ibex dlq`` (:mod:`extraction.deadletters`)
use it to tell a malformed letter, which can never be replayed, from a failed one.
"""

from __future__ import annotations

import json
from typing import Any

#: Malformed letters: what ``exception_type`` says in the mirror.
MALFORMED = "MalformedMessage"

_FIELDS: dict[str, tuple[type, ...]] = {
    "queue_name": (str,),
    "actor_name": (str,),
    "message_id": (str,),
    "message_timestamp": (int,),
    "args": (list,),
    "kwargs": (dict,),
    "options": (dict,),
}
# Options that Dramatiq's worker and middleware read and compute with: a wrong type there
# raises inside the worker (a dead worker thread, a message never acked), not in the actor.
_NUMBER = (int, float)
_OPTIONS: dict[str, tuple[type, ...]] = {
    "redis_message_id": (str,),
    "retries": (int,),
    "max_retries": (int,),
    "min_backoff": _NUMBER,
    "max_backoff": _NUMBER,
    "time_limit": _NUMBER,
    "max_age": _NUMBER,
    "delay": _NUMBER,
    "eta": _NUMBER,
    "requeue_timestamp": _NUMBER,
    "traceback": (str,),
    "on_success": (str,),
    "on_failure": (str,),
    "on_retry_exhausted": (str,),
    "pipe_target": (dict,),
    "pipe_ignore": (bool,),
    "notify_shutdown": (bool,),
    "ibex_invalid": (str,),
    "traceparent": (str,),
    "tracestate": (str,),
}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is(value: Any, types: tuple[type, ...]) -> bool:
    # JSON booleans are Python ints: never accept one where a number is meant.
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def message_problem(payload: Any, *, queue: str | None = None) -> str | None:
    """Why a decoded payload is not a message the worker can run safely, or None.

    Checks the envelope only (fields and the options Dramatiq computes with); whether the
    arguments bind to the actor and pass validation is the worker's job. With ``queue``, the
    message must also name the queue it was fetched from (the worker routes its ack by it)."""
    if not isinstance(payload, dict):
        return f"the message is a JSON {_type_name(payload)}, not an object"
    for name, types in _FIELDS.items():
        if name not in payload:
            return f"the message has no {name}"
        if not _is(payload[name], types):
            return f"{name} is a {_type_name(payload[name])}"
    for name in ("queue_name", "actor_name", "message_id"):
        if not payload[name]:
            return f"{name} is empty"
    extra = sorted(set(payload) - set(_FIELDS))
    if extra:
        return f"unexpected field {extra[0]!r}"
    if queue is not None and payload["queue_name"] != queue:
        return f"queue_name {payload['queue_name']!r} is not the queue it was sent to ({queue})"
    options = payload["options"]
    if options.get("throws") is not None:
        return "option throws cannot be given in a message"
    for name, types in _OPTIONS.items():
        value = options.get(name)
        if value is not None and not _is(value, types):
            return f"option {name} is a {_type_name(value)}"
    for name in ("retries", "max_retries"):
        if options.get(name) is not None and options[name] < 0:
            return f"option {name} is negative"
    return None


def decode_problem(raw: bytes | str) -> tuple[Any, str | None]:
    """``raw`` decoded as JSON and why it is not a runnable message (None when it is)."""
    try:
        payload = json.loads(raw)
    except (ValueError, TypeError) as exc:
        return None, f"not valid JSON: {exc}"
    return payload, message_problem(payload)


def salvage(decoded: Any, raw: bytes | str) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    """What a malformed message still says: its fields (when it is a JSON object), the payload
    to keep (the object, else its text under ``raw``), and its message id and actor name as
    found (callers check their types)."""
    fields = decoded if isinstance(decoded, dict) else {}
    payload = fields if isinstance(decoded, dict) else {"raw": raw_text(raw)}
    return fields, payload, fields.get("message_id"), fields.get("actor_name")


def raw_text(raw: bytes | str, limit: int = 65536) -> str:
    """A malformed payload as text Postgres can store (jsonb holds no NUL), cut at ``limit``."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
    return text.replace("\x00", "\ufffd")[:limit]
