"""The user fields every route shares: ``user``, ``user_id``, ``include_shared``, ``all_users``.

One definition each, so the sessions API, ``POST /v1/memories``, the list and get of memories,
search and context name a user the same way (and the OpenAPI document says so once). No I/O.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

#: The longest user key, as ``ibex_core.users.external_id`` allows.
MAX_USER_KEY_CHARS = 200


#: A user key holds no control character (C0, DEL, C1), as ``ibex_core.users`` checks; as an
#: OpenAPI pattern (lone surrogates are not Unicode text: JSON strings cannot hold them).
USER_KEY_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"


def _key_text(text: str) -> None:
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in text):
        raise ValidationError("must not hold control characters")


def user_field(*, writes: bool = False) -> fields.String:
    """``user``: the application's key for the person."""
    created = " (created when missing)" if writes else ""
    return fields.String(
        load_default=None,
        allow_none=True,
        validate=[validate.Length(min=1, max=MAX_USER_KEY_CHARS), _key_text],
        metadata={
            "pattern": USER_KEY_PATTERN,
            "description": f"The application's key for the person{created}; or give user_id."
            " A user-bound token acts for its own user: naming another one is 403"
            " FORBIDDEN_USER.",
        },
    )


def user_id_field() -> fields.UUID:
    """``user_id``: a user of the org by id."""
    return fields.UUID(
        load_default=None,
        allow_none=True,
        metadata={"description": "A user of the org by id (instead of user)."},
    )


def include_shared_field() -> fields.Boolean:
    return fields.Boolean(
        load_default=True,
        metadata={
            "description": "With a user: also the agent-wide memories (user_id null); false"
            " leaves them out. Without a user the read is of the agent-wide memories only."
        },
    )


def all_users_field() -> fields.Boolean:
    return fields.Boolean(
        load_default=False,
        metadata={
            "description": "Every user's memories and the agent-wide ones (scope memory:admin;"
            " not with user or user_id, nor with a user-bound token)."
        },
    )


def check_one_user(data: dict[str, Any]) -> None:
    """``user`` and ``user_id`` are exclusive, and both exclude ``all_users``."""
    named = data.get("user") is not None or data.get("user_id") is not None
    if data.get("user") is not None and data.get("user_id") is not None:
        raise ValidationError("give user or user_id, not both", "user_id")
    if named and data.get("all_users"):
        raise ValidationError("all_users reads every user: do not name one", "all_users")


class UserReadFields(Schema):
    """The user fields of a read (list, get, history, search, context): whose memories it
    returns, a user's and the agent-wide ones, by default the latter. Read schemas inherit
    them."""

    user = user_field()
    user_id = user_id_field()
    include_shared = include_shared_field()
    all_users = all_users_field()

    @validates_schema
    def _one_user(self, data: dict[str, Any], **kwargs: Any) -> None:
        check_one_user(data)


class ForgottenUserSchema(Schema):
    """The answer of ``DELETE /v1/users/{user}``: what was soft-deleted and revoked."""

    class Meta:
        unknown = RAISE

    user_id = fields.UUID(required=True, metadata={"description": "The user forgotten."})
    sessions = fields.Integer(
        required=True, metadata={"description": "Their sessions deleted, of every agent."}
    )
    memories = fields.Integer(
        required=True,
        metadata={"description": "Memories deleted: theirs and those drawn from their sessions."},
    )
    tokens = fields.Integer(required=True, metadata={"description": "Their tokens revoked."})
