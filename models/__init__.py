"""peewee models, one aggregate per module. The SQL migrations are the source of truth.

Only the tables the pipeline reads through peewee have a model here; the rest are read and
written with their stores' own SQL (the drift test in tests/integration/foundation declares
those for itself)."""

from models.base import BaseModel, bind, database_proxy
from models.sessions import (
    SESSION_STATUSES,
    AgentRow,
    Checkpoint,
    CheckpointPayload,
    Directive,
    DirectiveVersion,
    Org,
    SessionRow,
)
from models.users import EXTERNAL_ID_MAX, User

ALL_MODELS: tuple[type[BaseModel], ...] = (
    Org,
    AgentRow,
    Directive,
    DirectiveVersion,
    SessionRow,
    Checkpoint,
    CheckpointPayload,
    User,
)

__all__ = [
    "ALL_MODELS",
    "EXTERNAL_ID_MAX",
    "SESSION_STATUSES",
    "AgentRow",
    "BaseModel",
    "Checkpoint",
    "CheckpointPayload",
    "Directive",
    "DirectiveVersion",
    "Org",
    "SessionRow",
    "User",
    "bind",
    "database_proxy",
]
