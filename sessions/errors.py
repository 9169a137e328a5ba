"""What the sessions domain refuses (orgs, agents, users, sessions), without HTTP."""

from __future__ import annotations

from core.errors import DomainError


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


class UserNotFoundError(DomainError):
    """``DELETE /v1/users/{user}``: no live user of the org has this key or id."""

    message = "no such user"


class UnknownUserIdError(DomainError):
    """A ``user_id`` that is not a live user of the org, in the request field ``field``."""

    message = "unknown user for this org"

    def __init__(self, field: str = "user_id") -> None:
        super().__init__()
        self.field = field
