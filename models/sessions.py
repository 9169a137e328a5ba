"""The sessions aggregate: orgs, agents, directives, sessions, checkpoints, payloads.

Mirrors ``migrations/000001_core.sql`` column for column (a test checks there is no drift).
Foreign keys are plain UUID columns: the composite org-scoped keys live in the SQL.
"""

from __future__ import annotations

from peewee import (
    BigIntegerField,
    BooleanField,
    IntegerField,
    TextField,
    UUIDField,
)
from playhouse.postgres_ext import BinaryJSONField, DateTimeTZField

from models.base import BaseModel, PgEnumField

SESSION_STATUSES = ("active", "completed", "abandoned", "error")


class Org(BaseModel):
    id = UUIDField(primary_key=True)
    slug = TextField(unique=True)
    name = TextField(null=True)
    created_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "orgs"


class AgentRow(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField()
    slug = TextField()
    name = TextField(null=True)
    created_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "agents"


class Directive(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField()
    name = TextField()
    created_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "directives"


class DirectiveVersion(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField()
    directive_id = UUIDField()
    version = IntegerField()
    body = TextField()
    created_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "directive_versions"


class SessionRow(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField()
    agent_id = UUIDField()
    external_id = TextField(null=True)
    status = PgEnumField("ibex_core.session_status", SESSION_STATUSES)
    model = TextField(null=True)
    provider = TextField(null=True)
    turn_count = IntegerField()
    prompt_tokens = BigIntegerField()
    completion_tokens = BigIntegerField()
    total_latency_ms = BigIntegerField()
    last_extracted_turn = IntegerField()
    directive_version_id = UUIDField(null=True)
    created_at = DateTimeTZField()
    updated_at = DateTimeTZField()
    completed_at = DateTimeTZField(null=True)
    deleted_at = DateTimeTZField(null=True)
    #: Whose conversation (``000012_users.sql``); NULL: agent-wide. Set once.
    user_id = UUIDField(null=True)

    class Meta:
        schema = "ibex_core"
        table_name = "sessions"


class Checkpoint(BaseModel):
    id = UUIDField(primary_key=True)
    org_id = UUIDField()
    session_id = UUIDField()
    turn_index = IntegerField()
    messages_hash = TextField()
    completion_hash = TextField()
    prompt_tokens = IntegerField()
    completion_tokens = IntegerField()
    latency_ms = IntegerField()
    is_streaming = BooleanField()
    is_complete = BooleanField()
    created_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "checkpoints"


class CheckpointPayload(BaseModel):
    checkpoint_id = UUIDField(primary_key=True)
    org_id = UUIDField()
    session_id = UUIDField()
    turn_index = IntegerField()
    messages = BinaryJSONField()
    completion = BinaryJSONField()
    created_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "checkpoint_payloads"


__all__ = [
    "SESSION_STATUSES",
    "AgentRow",
    "Checkpoint",
    "CheckpointPayload",
    "Directive",
    "DirectiveVersion",
    "Org",
    "SessionRow",
]
