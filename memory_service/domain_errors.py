"""What a service refuses, in the domain's words and without HTTP.

Services raise these; :func:`memory_service.errors.register` maps each onto its answer (status,
code, message) once for the whole app, so no resource maps a refusal inline.
"""

from __future__ import annotations


class DomainError(Exception):
    """A request the domain refuses; ``str(exc)`` is :attr:`message`, what the caller reads."""

    message = "the request was refused"

    def __init__(self) -> None:
        super().__init__(self.message)


class MemoryNotFoundError(DomainError):
    message = "no such memory"


class SessionNotFoundError(DomainError):
    message = "no such session"


class NoSuchOrgError(DomainError):
    """The caller's org has no row (a service token naming an org that was never created)."""

    message = "no such org"


class UnknownAgentError(DomainError):
    """An ``agent_id`` that is not one of the org's agents."""

    message = "unknown agent for this org"


class SessionDeletedError(DomainError):
    """The external id names a session that was deleted: it is not reopened."""

    message = "the session with this external id was deleted; use another external id"


class AgentNotFoundError(DomainError):
    """The agent a request names (by slug or id) is not one of the org's: a read or a new
    session for it is refused, never answered as if it were an agent with nothing stored."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.message = f"no agent {name!r} in this org"
        Exception.__init__(self, self.message)


class UserForbiddenError(DomainError):
    """A user-bound token named another user, or asked for every user's memories."""

    message = "this token is bound to one user and cannot act for another"


class UserNotFoundError(DomainError):
    """``DELETE /v1/users/{user}``: no live user of the org has this key or id."""

    message = "no such user"


class AdminScopeError(DomainError):
    """``all_users: true`` without the ``memory:admin`` scope."""

    message = "all_users needs the memory:admin scope"


class UnknownUserIdError(DomainError):
    """A ``user_id`` that is not a live user of the org, in the request field ``field``."""

    message = "unknown user for this org"

    def __init__(self, field: str = "user_id") -> None:
        super().__init__()
        self.field = field
