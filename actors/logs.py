"""What the worker's log says about a message: its actor, its id and the ids it carries, never
its arguments.

Dramatiq logs a failed message with ``str(message)``, which is the actor's call with every
argument: for ``record_chat_turn`` that is a whole conversation (the user's messages, the
recalled memories), for the stages the ids only. A filter on Dramatiq's worker loggers
replaces the message in every such record with :func:`describe`, and turns the log of an
expected retry (a :class:`~core.errors.TransientError`: a database or service outage, a turn
waiting for its predecessor) from an ERROR with a traceback into one WARNING line. Dead
letters keep their payload in Redis and Postgres (``ibex dlq show``), where an operator reads
them on purpose; the log says which one and why, by class.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy

from core.errors import TransientError

#: Dramatiq's loggers that format a message with ``%s`` (its worker and consumer threads).
DRAMATIQ_MESSAGE_LOGGERS = ("dramatiq.worker.WorkerThread", "dramatiq.worker._ConsumerThread")
#: The ids a message may carry that a log line may show (slot identities, the chat path's
#: names for a session).
LOGGED_IDS = ("org_id", "session_id", "turn_index", "ordinal", "agent", "external_id")


def _ids(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {}
    return {
        k: value[k]
        for k in LOGGED_IDS
        if isinstance(value.get(k), str | int) and not isinstance(value.get(k), bool)
    }


def describe(message: Any) -> str:
    """``actor message_id (ids...)``: what a log line may say about ``message``."""
    ids: dict[str, Any] = _ids(getattr(message, "kwargs", None))
    for arg in getattr(message, "args", ()) or ():
        ids.update(_ids(arg))
    shown = ", ".join(f"{k}={str(v)[:80]!r}" for k, v in ids.items())
    return f"{getattr(message, 'actor_name', '?')} {getattr(message, 'message_id', '?')} ({shown})"


def _is_message(value: Any) -> bool:
    return isinstance(value, dramatiq.Message | MessageProxy)


class RedactMessages(logging.Filter):
    """The filter on Dramatiq's worker loggers (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_is_message(a) for a in args):
            record.args = tuple(describe(a) if _is_message(a) else a for a in args)
            message = next(a for a in args if _is_message(a))
            exc = record.exc_info[1] if record.exc_info else None
            if isinstance(exc, TransientError):
                record.msg = "message %s will be retried: %s"
                record.args = (describe(message), type(exc).__name__)
                record.levelno, record.levelname = logging.WARNING, "WARNING"
                record.exc_info, record.exc_text = None, None
        return True


FILTER = RedactMessages()


def install() -> None:
    """Add the filter to Dramatiq's worker loggers (once, whoever asks)."""
    for name in DRAMATIQ_MESSAGE_LOGGERS:
        logger = logging.getLogger(name)
        if FILTER not in logger.filters:
            logger.addFilter(FILTER)


__all__ = ["FILTER", "RedactMessages", "describe", "install"]
