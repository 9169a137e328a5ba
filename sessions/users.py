"""The people an org's agents serve: every statement on ``ibex_core.users``.

A user is named by the application's own key (``external_id``) or by id. Resolving a key
creates the user when missing (the contract: "created when missing"); a read never creates
one. The functions run in the caller's tenant transaction (``ibex import`` resolves a line's
user in the transaction that stores its session); :class:`UserStore` opens one per call.
Forgetting is ``ibex_core.forget_user`` (migrations 000012 and 000021), run as the connection's
own role (the table owner: it revokes the user's tokens, then switches to the tenant role
itself, soft-deleting the user, their memories and their sessions in one transaction).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import peewee

from core.db import tenant, transaction
from core.errors import RowNotFoundError
from sessions.errors import NoSuchOrgError


class UnknownUserError(RowNotFoundError):
    """A user named by id is not a live user of the org (unknown, of another org, or
    forgotten)."""


#: How many times a user's key is looked up again when the row that won its insert vanished
#: (forgotten in between): the key is then free, and the next insert takes it.
_USER_ATTEMPTS = 3


def resolve_user(
    db: peewee.Database,
    org_id: uuid.UUID,
    *,
    external_id: str | None = None,
    user_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """The live user of the org named by the application's key (created when missing) or by id
    (:class:`UnknownUserError` unless it is a live user of the org), in the current tenant
    transaction. Exactly one of the two must be given."""
    if (external_id is None) == (user_id is None):
        raise ValueError("name a user by its external id or by its id, not both or neither")
    if user_id is not None:
        row = db.execute_sql(
            "SELECT id FROM ibex_core.users WHERE id = %s AND org_id = %s AND deleted_at IS NULL",
            (str(user_id), str(org_id)),
        ).fetchone()
        if row is None:
            raise UnknownUserError(f"user {user_id} not found")
        return uuid.UUID(str(row[0]))
    for _ in range(_USER_ATTEMPTS):
        row = db.execute_sql(
            "INSERT INTO ibex_core.users (org_id, external_id) VALUES (%s, %s)"
            " ON CONFLICT (org_id, external_id) WHERE deleted_at IS NULL"
            " DO NOTHING RETURNING id",
            (str(org_id), external_id),
        ).fetchone()
        if row is None:
            row = db.execute_sql(
                "SELECT id FROM ibex_core.users WHERE org_id = %s AND external_id = %s"
                " AND deleted_at IS NULL",
                (str(org_id), external_id),
            ).fetchone()
        if row is not None:
            return uuid.UUID(str(row[0]))
    raise UnknownUserError(f"user {external_id!r} kept being forgotten while it was named")


def find_user(db: peewee.Database, org_id: uuid.UUID, external_id: str) -> uuid.UUID | None:
    """The live user of the org with the application's key, or None, in the current tenant
    transaction (never created here)."""
    row = db.execute_sql(
        "SELECT id FROM ibex_core.users WHERE org_id = %s AND external_id = %s"
        " AND deleted_at IS NULL",
        (str(org_id), external_id),
    ).fetchone()
    return uuid.UUID(str(row[0])) if row else None


@dataclass(frozen=True)
class Forgotten:
    """What a forget soft-deleted and revoked."""

    user_id: uuid.UUID
    sessions: int
    memories: int
    tokens: int


class UserStore:
    """The users of an org, each call in a tenant transaction of its own."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def resolve(
        self, org_id: uuid.UUID, *, key: str | None, user_id: uuid.UUID | None
    ) -> uuid.UUID:
        """The live user of this key (created when missing) or id (:class:`UnknownUserError`);
        :class:`NoSuchOrgError` for an org with no row (a service token naming one)."""
        try:
            with tenant(self.db, org_id):
                return resolve_user(self.db, org_id, external_id=key, user_id=user_id)
        except peewee.IntegrityError as exc:
            if "users_org_id_fkey" in str(exc):
                raise NoSuchOrgError() from None
            raise

    def find(self, org_id: uuid.UUID, key: str) -> uuid.UUID | None:
        """The live user with this key, or None (never created here)."""
        with tenant(self.db, org_id):
            return find_user(self.db, org_id, key)

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


# -- erasure (``ibex prune --deleted-older-than``): the owner role, across orgs ---------------


def forgotten_users(db: peewee.Database, cutoff: dt.datetime, after: str, limit: int) -> list[str]:
    """The next ``limit`` users forgotten before ``cutoff`` that no session names any more, by
    id after ``after``, locked (a session or memory deleted after the cutoff keeps its user
    until a later prune; the memories' owner says which it names)."""
    rows = db.execute_sql(
        "SELECT u.id::text FROM ibex_core.users u"
        " WHERE u.deleted_at < %s AND u.id > %s::uuid"
        "   AND NOT EXISTS (SELECT 1 FROM ibex_core.sessions s"
        "                    WHERE s.org_id = u.org_id AND s.user_id = u.id)"
        " ORDER BY u.id LIMIT %s FOR UPDATE SKIP LOCKED",
        (cutoff, after, limit),
    ).fetchall()
    return [r[0] for r in rows]


def erase_users(db: peewee.Database, ids: Sequence[str]) -> int:
    return int(
        db.execute_sql(
            "DELETE FROM ibex_core.users WHERE id = ANY(%s::uuid[])", (list(ids),)
        ).rowcount
    )


def forgotten_before(db: peewee.Database, cutoff: dt.datetime) -> list[str]:
    """Every user forgotten before ``cutoff`` (what a dry run counts)."""
    rows = db.execute_sql(
        "SELECT id::text FROM ibex_core.users WHERE deleted_at < %s", (cutoff,)
    ).fetchall()
    return [r[0] for r in rows]


__all__ = ["Forgotten", "UnknownUserError", "UserStore", "find_user", "resolve_user"]
