"""API tokens: generation, hashing and the ``ibex_memory.api_tokens`` table.

Tokens are ``ibex_`` + 43 URL-safe characters (256 random bits). Only their SHA-256 is stored;
the first characters are kept as a display prefix. Issuing, listing and revoking are operator
actions (``ibex token``); the service only looks a hash up (:mod:`memories.auth`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee

from core.db import APP_ROLE, db_errors, transaction
from sessions.orgs import upsert_org

TOKEN_PREFIX = "ibex_"  # noqa: S105 (a format marker, not a secret)
DISPLAY_PREFIX_CHARS = 12


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def display_prefix(token: str) -> str:
    return token[:DISPLAY_PREFIX_CHARS]


@dataclass(frozen=True)
class TokenRow:
    id: uuid.UUID
    org_id: uuid.UUID | None
    name: str | None
    token_hash: str
    prefix: str
    scopes: tuple[str, ...]
    is_service: bool
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None
    #: The user a user-bound token may act for (its org's); None: not bound.
    user_id: uuid.UUID | None = None

    @classmethod
    def from_db(cls, row: Sequence[Any]) -> TokenRow:
        return cls(
            id=uuid.UUID(str(row[0])),
            org_id=uuid.UUID(str(row[1])) if row[1] is not None else None,
            name=row[2],
            token_hash=row[3],
            prefix=row[4],
            scopes=tuple(row[5]),
            is_service=bool(row[6]),
            created_at=row[7],
            last_used_at=row[8],
            revoked_at=row[9],
            user_id=uuid.UUID(str(row[10])) if len(row) > 10 and row[10] is not None else None,
        )

    def public(self) -> dict[str, Any]:
        """What ``ibex token list --json`` prints: never the hash."""
        data = dataclasses.asdict(self)
        data.pop("token_hash")
        for name in ("id", "org_id", "user_id"):
            data[name] = str(data[name]) if data[name] is not None else None
        for name in ("created_at", "last_used_at", "revoked_at"):
            value = data[name]
            data[name] = value.astimezone(dt.UTC).isoformat() if value is not None else None
        data["scopes"] = list(self.scopes)
        return data


TOKEN_COLUMNS = (
    "id, org_id, name, token_hash, prefix, scopes, is_service,"  # noqa: S105 (column names)
    " created_at, last_used_at, revoked_at, user_id"
)


class TokenStore:
    """``ibex_memory.api_tokens``. Lookups run as the tenant role (no org is known yet) through a
    function that returns the one row of a hash; creation and revocation are operator actions.
    """

    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def lookup(self, token_hash: str) -> TokenRow | None:
        """The token with this hash, revoked or not; stamps ``last_used_at`` at most per minute.

        Runs as the tenant role, which cannot read the table: ``ibex_memory.authenticate_bearer``
        returns only the row of the hash given, with the user the token is bound to, and does
        the stamping (migrations 000005 and 000013)."""
        with transaction(self.db):
            self.db.execute_sql(f"SET LOCAL ROLE {APP_ROLE}")
            row = self.db.execute_sql(
                f"SELECT {TOKEN_COLUMNS} FROM ibex_memory.authenticate_bearer(%s)",
                (token_hash,),
            ).fetchone()
        return TokenRow.from_db(row) if row else None

    def create(
        self,
        *,
        org_id: uuid.UUID | None,
        name: str | None,
        token_hash: str,
        prefix: str,
        scopes: Sequence[str],
        user_id: uuid.UUID | None = None,
    ) -> TokenRow:
        with transaction(self.db):
            row = self.db.execute_sql(
                "INSERT INTO ibex_memory.api_tokens"
                " (org_id, name, token_hash, prefix, scopes, is_service, user_id)"
                f" VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {TOKEN_COLUMNS}",
                (
                    str(org_id) if org_id else None,
                    name,
                    token_hash,
                    prefix,
                    list(scopes),
                    org_id is None,
                    str(user_id) if user_id else None,
                ),
            ).fetchone()
        return TokenRow.from_db(row)

    def list(self) -> list[TokenRow]:
        with db_errors():
            rows = self.db.execute_sql(
                f"SELECT {TOKEN_COLUMNS} FROM ibex_memory.api_tokens ORDER BY created_at, id"
            ).fetchall()
        return [TokenRow.from_db(r) for r in rows]

    def revoke(self, token_id: uuid.UUID) -> TokenRow | None:
        """Mark the token revoked (idempotent); None if there is no such token."""
        with transaction(self.db):
            row = self.db.execute_sql(
                "UPDATE ibex_memory.api_tokens SET revoked_at = COALESCE(revoked_at, now())"
                f" WHERE id = %s RETURNING {TOKEN_COLUMNS}",
                (str(token_id),),
            ).fetchone()
        return TokenRow.from_db(row) if row else None

    def ensure_org(self, slug: str) -> uuid.UUID:
        """The org with ``slug``, created when missing."""
        with transaction(self.db):
            return upsert_org(self.db, slug)

    def issue(
        self,
        *,
        org_id: uuid.UUID | None,
        name: str | None,
        scopes: Sequence[str],
        user_id: uuid.UUID | None = None,
    ) -> tuple[TokenRow, str]:
        """A new token: stored as its hash, returned in clear this once; bound to ``user_id``
        (a user of ``org_id``) when given."""
        token = generate_token()
        row = self.create(
            org_id=org_id,
            name=name,
            token_hash=hash_token(token),
            prefix=display_prefix(token),
            scopes=scopes,
            user_id=user_id,
        )
        return row, token


def erase_tokens_of(db: peewee.Database, user_ids: Sequence[str]) -> int:
    """Hard-delete the tokens bound to these (erased) users (revoked when they were
    forgotten)."""
    return int(
        db.execute_sql(
            "DELETE FROM ibex_memory.api_tokens WHERE user_id = ANY(%s::uuid[])",
            (list(user_ids),),
        ).rowcount
    )


def count_tokens_of(db: peewee.Database, user_ids: Sequence[str]) -> int:
    row = db.execute_sql(
        "SELECT count(*) FROM ibex_memory.api_tokens WHERE user_id = ANY(%s::uuid[])",
        (list(user_ids),),
    ).fetchone()
    return int(row[0])
