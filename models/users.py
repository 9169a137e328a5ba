"""The people an org's agents serve, by the application's own key. Mirrors
``migrations/000012_users.sql``; sessions and memories name one through their ``user_id``
(NULL: agent-wide)."""

from __future__ import annotations

from peewee import TextField, UUIDField
from playhouse.postgres_ext import DateTimeTZField

from models.base import BaseModel

#: The longest ``external_id`` (the application's key for a person), in characters.
EXTERNAL_ID_MAX = 200


class User(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField()
    external_id = TextField()
    created_at = DateTimeTZField()
    deleted_at = DateTimeTZField(null=True)

    class Meta:
        schema = "ibex_core"
        table_name = "users"
