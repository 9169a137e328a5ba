"""``record_chat_turn(turn)``: store a chat call spooled by the proxy as its session's turn.

The proxy answers first and spools after (:mod:`proxy.recording`); this actor stores the turn
in the session store, the same way the sessions API and ``ibex import`` store turns. Storing
is idempotent (the turn is planned against the stored conversation), so a retry or a
redelivery stores nothing twice; a turn that arrived before its predecessor waits one retry
for it (:class:`~proxy.recording.EarlierTurnPending`). A database outage is retried with
backoff like any message; a turn that can never be stored (unknown or revoked token, deleted
session) is permanent and goes to the dead-letter queue with the reason.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from actors.broker import broker
from actors.middleware import current_deps
from core.db import db_errors
from core.errors import PermanentError
from proxy import metrics
from proxy.recording import SPOOL_ACTOR, SPOOL_QUEUE, store_chat_turn

log = logging.getLogger(__name__)


@dramatiq.actor(
    actor_name=SPOOL_ACTOR,
    queue_name=SPOOL_QUEUE,
    throws=(PermanentError,),
    broker=broker,
)
def record_chat_turn(turn: dict[str, Any]) -> None:
    deps = current_deps()
    current = CurrentMessage.get_current_message()
    first_attempt = current is not None and not current.options.get("retries")
    try:
        with db_errors():
            index = store_chat_turn(deps.store, turn, first_attempt=first_attempt)
    except PermanentError:
        metrics.turn("failed")
        raise
    metrics.turn("recorded" if index is not None else "replayed")
