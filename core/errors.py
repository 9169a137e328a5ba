"""Error classes, sorted by what the queue (or the caller) should do with them.

Third-party exceptions are translated into these at exactly one boundary each (httpx in the
clients, peewee in the stores, marshmallow in :func:`schema.load`), always ``raise ... from``.
"""

from __future__ import annotations

from typing import Any


class IbexError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(IbexError):
    """Missing or invalid environment, found at start-up."""

    def __init__(self, message: str, *, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


class PipelineError(IbexError):
    """An error a pipeline stage can raise."""


class PermanentError(PipelineError):
    """Retrying cannot help: the message goes straight to the dead-letter queue."""


class InvalidMessageError(PermanentError):
    """A message or input failed validation; ``messages`` holds the errors field by field."""

    def __init__(self, message: str, messages: Any = None) -> None:
        super().__init__(message)
        self.messages = messages if messages is not None else {}


class RowNotFoundError(PermanentError):
    """The session, turn or record a message names does not exist (or is not visible)."""


class MemoryRejectedError(PermanentError):
    """The memory service refused a write with a 4xx other than the success 409s."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        server_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.server_message = server_message


class LLMRejectedError(PermanentError):
    """The LLM endpoint refused the request (400/401/403/404): fix configuration, then replay."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ImmutableTurnError(PermanentError):
    """A stored turn was offered again with different content: checkpoints never change."""

    def __init__(self, message: str, *, turn_index: int | None = None) -> None:
        super().__init__(message)
        self.turn_index = turn_index


class SessionUserConflictError(PermanentError):
    """A session's user is set once: naming another user for it later is refused (the HTTP API
    answers 409 ``USER_CONFLICT``)."""

    def __init__(self, message: str, *, session_id: Any, user_id: Any, requested: Any) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.user_id = user_id
        self.requested = requested


class TurnIndexGapError(PermanentError):
    """Turns were offered starting past the session's next turn index: none may be skipped."""

    def __init__(self, message: str, *, expected_turn_index: int) -> None:
        super().__init__(message)
        self.expected_turn_index = expected_turn_index


class TransientError(PipelineError):
    """Retried with backoff."""


class MemoryUnavailableError(TransientError):
    """The memory service could not take the write now (409 in progress, 429, 5xx, network)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        server_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.server_message = server_message


class EmbeddingsUnavailable(TransientError):
    """The embeddings endpoint (or the local model) could not embed now: down, slow, or an
    answer that is not the vectors asked for. Callers fall back (lexical search, a vector
    backfilled later); it never fails a write or a turn."""


class LLMUnavailableError(TransientError):
    """The LLM timed out, was rate limited, failed with 5xx, or answered unparseably."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DatabaseUnavailableError(TransientError):
    """Postgres could not be reached or the transaction failed in a way worth retrying."""


class TurnBusyError(TransientError):
    """Another delivery holds a live claim on this turn; wait instead of calling the LLM."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SchemaNotReadyError(IbexError):
    """The database cannot serve IBEX yet. The message is one line that says what to do."""


class DatabaseUnreachableError(SchemaNotReadyError):
    """No connection to the database at all (wrong URL, server down, authentication)."""

    def __init__(self, message: str, *, target: str) -> None:
        super().__init__(message)
        self.target = target


class SchemaMissingError(SchemaNotReadyError):
    """The database answers but was never migrated."""


class MigrationsPendingError(SchemaNotReadyError):
    """The database is migrated, but not up to the migrations this version ships."""

    def __init__(self, message: str, *, pending: list[str], applied: int) -> None:
        super().__init__(message)
        self.pending = pending
        self.applied = applied


class DomainError(IbexError):
    """A request a domain refuses, in the domain's words and without HTTP; ``str(exc)`` is
    :attr:`message`, what the caller reads. The web door maps each onto its answer once
    (``memory_service.errors``)."""

    message = "the request was refused"

    def __init__(self) -> None:
        super().__init__(self.message)
