"""The users flows: which user a request acts for, whose memories a read sees, forget a user.

No HTTP. Every route asks here for its user, so the rule is one rule:

- a request names a user by key (``user``) or id (``user_id``), or none;
- a user-bound token acts for its own user: naming no user means that user, naming the same
  user is fine, naming another one (or ``all_users``) is :class:`UserForbiddenError` (403);
- ``all_users`` needs the ``memory:admin`` scope (:class:`AdminScopeError`, 403).

Writes create a user named by a key that has none yet (the contract: "created when missing")
and refuse an unknown id (:class:`UnknownUserIdError`, 422); reads never create one: a key no
user has reads the agent-wide memories only (that user has none yet).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from memory_service.auth import Principal
from memory_service.domain_errors import (
    AdminScopeError,
    UnknownUserIdError,
    UserForbiddenError,
    UserNotFoundError,
)
from memory_service.scope import ReadScope, UserRef
from memory_service.users.store import Forgotten, UserStore
from models.store import UnknownUserError

ADMIN_SCOPE = "memory:admin"


class UserService:
    def __init__(self, store: UserStore) -> None:
        self.store = store

    def _bound(self, principal: Principal, org_id: uuid.UUID, named: UserRef) -> uuid.UUID:
        """A bound token's user, after checking that ``named`` (if any) is that user."""
        bound = principal.user_id
        assert bound is not None
        if named.id is not None and named.id != bound:
            raise UserForbiddenError()
        if named.key is not None and self.store.find(org_id, named.key) != bound:
            raise UserForbiddenError()
        return bound

    def writer(
        self, principal: Principal, org_id: uuid.UUID, named: UserRef, *, field: str = "user_id"
    ) -> uuid.UUID | None:
        """The user a write is for: the bound token's, the named one (a key is created when
        missing; an unknown id raises :class:`UnknownUserIdError` on ``field``), or None."""
        if principal.user_id is not None:
            return self._bound(principal, org_id, named)
        if not named.named:
            return None
        try:
            return self.store.resolve(org_id, key=named.key, user_id=named.id)
        except UnknownUserError:
            raise UnknownUserIdError(field) from None

    def reader_of(
        self, principal: Principal, org_id: uuid.UUID, fields: Mapping[str, Any]
    ) -> ReadScope:
        """:meth:`reader` for a loaded request's user fields (``user``, ``user_id``,
        ``include_shared``, ``all_users``: schema.users)."""
        return self.reader(
            principal,
            org_id,
            UserRef.of(fields),
            include_shared=fields["include_shared"],
            all_users=fields["all_users"],
        )

    def reader(
        self,
        principal: Principal,
        org_id: uuid.UUID,
        named: UserRef,
        *,
        include_shared: bool = True,
        all_users: bool = False,
    ) -> ReadScope:
        """Whose memories a read sees (:class:`~memory_service.scope.ReadScope`)."""
        if all_users:
            if principal.user_id is not None:
                raise UserForbiddenError()
            if ADMIN_SCOPE not in principal.scopes:
                raise AdminScopeError()
            return ReadScope(all_users=True)
        if principal.user_id is not None:
            bound = self._bound(principal, org_id, named)
            return ReadScope(user_id=bound, include_shared=include_shared, named=True)
        if named.id is not None:
            # No lookup: an id that names no user of the org matches none of its memories.
            return ReadScope(user_id=named.id, include_shared=include_shared, named=True)
        if named.key is not None:
            user_id = self.store.find(org_id, named.key)
            return ReadScope(user_id=user_id, include_shared=include_shared, named=True)
        return ReadScope()

    def deleter_of(
        self, principal: Principal, org_id: uuid.UUID, fields: Mapping[str, Any]
    ) -> ReadScope:
        """Whose memories a delete may reach: what the same token may read (delete follows
        read), and no more. A user-bound token: its user's own memories (not the agent-wide
        ones everyone shares); an org token: the scope its request names (no user: the
        agent-wide memories), every user's with ``memory:admin``."""
        if principal.user_id is not None:
            scope = self.reader_of(principal, org_id, fields)
            return ReadScope(user_id=scope.user_id, include_shared=False, named=True)
        if ADMIN_SCOPE in principal.scopes and not UserRef.of(fields).named:
            return ReadScope(all_users=True)
        return self.reader_of(principal, org_id, fields)

    def owner(self, principal: Principal) -> uuid.UUID | None:
        """The only user whose rows a token may reach by id (sessions, memories); None: any."""
        return principal.user_id

    def forget(self, principal: Principal, org_id: uuid.UUID, user: str) -> Forgotten:
        """Forget the user with this key, or this id when ``user`` is a UUID that no key names
        (a key is looked up first, so a key shaped like a UUID still names its user). A
        user-bound token may forget its own user only (another one is not found: 404)."""
        user_id = self.store.find(org_id, user)
        if user_id is None:
            try:
                candidate = uuid.UUID(user)
            except ValueError:
                raise UserNotFoundError() from None
            if self.store.is_live(org_id, candidate):
                user_id = candidate
        if user_id is None or (principal.user_id is not None and user_id != principal.user_id):
            raise UserNotFoundError()
        forgotten = self.store.forget(org_id, user_id)
        if forgotten is None:  # forgotten by another request in the meantime
            raise UserNotFoundError()
        return forgotten
