"""The memory service's tables: memories and API tokens. Mirrors ``000003_memory.sql``."""

from __future__ import annotations

from peewee import BooleanField, IntegerField, TextField, UUIDField
from playhouse.postgres_ext import ArrayField, BinaryJSONField, DateTimeTZField

from models.base import BaseModel

MEMORY_KINDS = ("fact", "preference", "event", "other")
SCOPES = ("memory:read", "memory:write")


class Memory(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField()
    agent_id = UUIDField()
    session_id = UUIDField(null=True)
    turn_index = IntegerField(null=True)
    ordinal = IntegerField(null=True)
    content = TextField()
    content_hash = TextField()
    kind = TextField()
    metadata = BinaryJSONField()
    idempotency_key = TextField(null=True)
    request_fingerprint = TextField(null=True)
    created_at = DateTimeTZField()
    deleted_at = DateTimeTZField(null=True)

    class Meta:
        schema = "ibex_memory"
        table_name = "memories"


class ApiToken(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField(null=True)
    name = TextField(null=True)
    token_hash = TextField(unique=True)
    prefix = TextField()
    scopes = ArrayField(TextField)
    is_service = BooleanField()
    created_at = DateTimeTZField()
    last_used_at = DateTimeTZField(null=True)
    revoked_at = DateTimeTZField(null=True)

    class Meta:
        schema = "ibex_memory"
        table_name = "api_tokens"
