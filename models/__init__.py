"""peewee models, one aggregate per module. The SQL migrations are the source of truth."""

from models.base import BaseModel, bind, database_proxy
from models.memory import MEMORY_KINDS, SCOPES, ApiToken, Memory
from models.pipeline import TURN_STATES, DeadLetter, ExtractionSlot, ExtractionTurn
from models.sessions import (
    SESSION_STATUSES,
    Agent,
    Checkpoint,
    CheckpointPayload,
    Directive,
    DirectiveVersion,
    Org,
    Session,
)
from models.users import EXTERNAL_ID_MAX, User

ALL_MODELS: tuple[type[BaseModel], ...] = (
    Org,
    Agent,
    Directive,
    DirectiveVersion,
    Session,
    Checkpoint,
    CheckpointPayload,
    User,
    ExtractionTurn,
    ExtractionSlot,
    DeadLetter,
    Memory,
    ApiToken,
)

__all__ = [
    "ALL_MODELS",
    "EXTERNAL_ID_MAX",
    "MEMORY_KINDS",
    "SCOPES",
    "SESSION_STATUSES",
    "TURN_STATES",
    "Agent",
    "ApiToken",
    "BaseModel",
    "Checkpoint",
    "CheckpointPayload",
    "DeadLetter",
    "Directive",
    "DirectiveVersion",
    "ExtractionSlot",
    "ExtractionTurn",
    "Memory",
    "Org",
    "Session",
    "User",
    "bind",
    "database_proxy",
]
