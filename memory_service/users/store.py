"""The users of an org in Postgres: find one by key or id, create one by key, forget one.

Resolving and creating are :class:`models.store.SessionStore`'s (the same rows as ``ibex
import``); forgetting is ``ibex_core.forget_user`` (migration 000012), run as the connection's
own role (the table owner: it revokes the user's tokens, then switches to the tenant role
itself).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import cast

import peewee
from playhouse.postgres_ext import PostgresqlExtDatabase

from core.db import tenant, transaction
from memory_service.domain_errors import NoSuchOrgError
from models.store import SessionStore


@dataclass(frozen=True)
class Forgotten:
    """What a forget soft-deleted and revoked."""

    user_id: uuid.UUID
    sessions: int
    memories: int
    tokens: int


class UserStore:
    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        self.sessions = SessionStore(cast(PostgresqlExtDatabase, db), bind_models=False)

    def resolve(
        self, org_id: uuid.UUID, *, key: str | None, user_id: uuid.UUID | None
    ) -> uuid.UUID:
        """The live user of this key (created when missing) or id (``UnknownUserError``);
        :class:`NoSuchOrgError` for an org with no row (a service token naming one)."""
        try:
            return self.sessions.resolve_user(org_id, external_id=key, user_id=user_id)
        except peewee.IntegrityError as exc:
            if "users_org_id_fkey" in str(exc):
                raise NoSuchOrgError() from None
            raise

    def find(self, org_id: uuid.UUID, key: str) -> uuid.UUID | None:
        """The live user with this key, or None (never created here)."""
        return self.sessions.find_user(org_id, key)

    def is_live(self, org_id: uuid.UUID, user_id: uuid.UUID) -> bool:
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT 1 FROM ibex_core.users WHERE id = %s AND org_id = %s"
                " AND deleted_at IS NULL",
                (str(user_id), str(org_id)),
            ).fetchone()
        return row is not None

    def forget(self, org_id: uuid.UUID, user_id: uuid.UUID) -> Forgotten | None:
        """Soft-delete the user, their sessions and memories and revoke their tokens, in one
        transaction; None when the org has no live user with this id."""
        with transaction(self.db):
            row = self.db.execute_sql(
                "SELECT sessions, memories, tokens FROM ibex_core.forget_user(%s, %s)",
                (str(org_id), str(user_id)),
            ).fetchone()
        if row is None:
            return None
        return Forgotten(user_id, int(row[0]), int(row[1]), int(row[2]))
