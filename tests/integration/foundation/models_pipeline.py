"""The pipeline's own state: per-turn rows, written slots, the dead-letter mirror, the usage
ledger and the org budgets.

Mirrors ``migrations/000002_pipeline.sql`` and ``000022_usage_budgets.sql``.
"""

from __future__ import annotations

from peewee import (
    BigAutoField,
    BigIntegerField,
    BooleanField,
    CompositeKey,
    IntegerField,
    TextField,
    UUIDField,
)
from playhouse.postgres_ext import BinaryJSONField, DateTimeTZField

from models.base import BaseModel, PgEnumField

TURN_STATES = ("pending", "extracted", "done", "failed")


class ExtractionTurn(BaseModel):
    org_id = UUIDField()
    session_id = UUIDField()
    turn_index = IntegerField()
    state = PgEnumField("ibex_core.turn_state", TURN_STATES)
    lease_expires_at = DateTimeTZField(null=True)
    claim_token = UUIDField(null=True)
    claim_expires_at = DateTimeTZField(null=True)
    attempts = IntegerField()
    llm_calls = IntegerField()
    result = BinaryJSONField(null=True)
    memory_count = IntegerField(null=True)
    prompt_tokens = IntegerField()
    completion_tokens = IntegerField()
    provider = TextField(null=True)
    model = TextField(null=True)
    last_error = TextField(null=True)
    created_at = DateTimeTZField()
    updated_at = DateTimeTZField()
    extracted_at = DateTimeTZField(null=True)
    done_at = DateTimeTZField(null=True)
    #: Repeated inputs (``000014_change.sql``): the LLM input's hash, and whether the result
    #: was reused from another turn's (no LLM call).
    input_hash = TextField(null=True)
    reused = BooleanField()
    #: Budgets (``000022_usage_budgets.sql``): held back with no LLM call until allowed.
    waiting_for_budget = BooleanField()

    class Meta:
        schema = "ibex_core"
        table_name = "extraction_turns"
        primary_key = CompositeKey("session_id", "turn_index")


class ExtractionSlot(BaseModel):
    org_id = UUIDField()
    session_id = UUIDField()
    turn_index = IntegerField()
    ordinal = IntegerField()
    idempotency_key = UUIDField()
    memory_id = UUIDField(null=True)
    outcome = TextField()
    written_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "extraction_slots"
        primary_key = CompositeKey("session_id", "turn_index", "ordinal")


class DeadLetter(BaseModel):
    id = BigAutoField()
    redis_message_id = TextField(unique=True)
    message_id = TextField()
    queue_name = TextField()
    actor_name = TextField()
    org_id = UUIDField(null=True)
    session_id = UUIDField(null=True)
    turn_index = IntegerField(null=True)
    ordinal = IntegerField(null=True)
    payload = BinaryJSONField()
    exception_type = TextField(null=True)
    exception_message = TextField(null=True)
    traceback = TextField(null=True)
    attempts = IntegerField()
    failed_at = DateTimeTZField()
    replayed_at = DateTimeTZField(null=True)
    replayed_as = TextField(null=True)
    purged_at = DateTimeTZField(null=True)

    class Meta:
        schema = "ibex_core"
        table_name = "dead_letters"


class TurnUsage(BaseModel):
    """What extracting a turn cost, one row per turn written with its persisted result."""

    org_id = UUIDField()
    agent_id = UUIDField()
    session_id = UUIDField()
    turn_index = IntegerField()
    provider = TextField(null=True)
    model = TextField(null=True)
    llm_calls = IntegerField()
    input_tokens = IntegerField()
    output_tokens = IntegerField()
    embedding_tokens = IntegerField()
    embedding_model = TextField(null=True)
    latency_ms = IntegerField()
    reused = BooleanField()
    created_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "turn_usage"
        primary_key = CompositeKey("session_id", "turn_index")


class OrgBudget(BaseModel):
    """A token limit per org and period, and what the period has used."""

    org_id = UUIDField(primary_key=True)
    token_limit = BigIntegerField()
    period = TextField()
    period_start = DateTimeTZField()
    used = BigIntegerField()
    reported = IntegerField()
    updated_at = DateTimeTZField()

    class Meta:
        schema = "ibex_core"
        table_name = "org_budgets"
