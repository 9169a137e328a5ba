"""``record_chat_turn(turn)``: store a chat call spooled by the proxy as its session's turn.

The proxy answers first and spools after (:mod:`sessions.chat`); this actor stores the turn
in the session store, the same way the sessions API and ``ibex import`` store turns. Storing
is idempotent (the turn is planned against the stored conversation), so a retry or a
redelivery stores nothing twice; a turn that arrived before its predecessor waits one retry
for it (:class:`~sessions.chat.EarlierTurnPending`). A database outage is retried with
backoff like any message; a turn that can never be stored (unknown or revoked token, deleted
session) is permanent and goes to the dead-letter queue with the reason.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from actors.broker import broker
from actors.runtime import WORKER
from core.db import db_errors
from core.errors import PermanentError
from memories.auth import AuthError, Principal, require_scope, resolve_org
from memories.tokens import TokenStore
from sessions.chat import (
    SPOOL_ACTOR,
    SPOOL_QUEUE,
    RecordRefused,
    count_turn,
    org_named,
    store_chat_turn,
)

log = logging.getLogger(__name__)


@dramatiq.actor(
    actor_name=SPOOL_ACTOR,
    queue_name=SPOOL_QUEUE,
    throws=(PermanentError,),
    broker=broker,
)
def record_chat_turn(turn: dict[str, Any]) -> None:
    deps = WORKER.deps
    current = CurrentMessage.get_current_message()
    first_attempt = current is not None and not current.options.get("retries")
    try:
        with db_errors():
            org = org_named(turn) or org_of(deps.store.db, turn)
            index = store_chat_turn(deps.store, turn, first_attempt=first_attempt, org=org)
    except PermanentError:
        count_turn("failed")
        raise
    count_turn("recorded" if index is not None else "replayed")


def org_of(db: Any, message: dict[str, Any]) -> tuple[uuid.UUID, uuid.UUID | None]:
    """The org of a spooled turn the proxy could not check (the database was away), from the
    token hash it carries, and the user that token is bound to."""
    token_hash = message.get("token_hash")
    if not token_hash:
        raise RecordRefused("the spooled turn names neither an org nor a token")
    row = TokenStore(db).lookup(str(token_hash))
    if row is None or row.revoked_at is not None:
        raise RecordRefused("the call's X-IBEX-Token is unknown or revoked")
    principal = Principal(row.id, row.org_id, frozenset(row.scopes), row.is_service, row.user_id)
    try:
        require_scope(principal, "sessions:write")
        return resolve_org(principal, message.get("org_header")), principal.user_id
    except AuthError as exc:
        raise RecordRefused(exc.message) from None
