"""What the memories domain refuses (memories, whose they are), without HTTP."""

from __future__ import annotations

from core.errors import DomainError


class MemoryNotFoundError(DomainError):
    message = "no such memory"


class UserForbiddenError(DomainError):
    """A user-bound token named another user, or asked for every user's memories."""

    message = "this token is bound to one user and cannot act for another"


class AdminScopeError(DomainError):
    """``all_users: true`` without the ``memory:admin`` scope."""

    message = "all_users needs the memory:admin scope"
