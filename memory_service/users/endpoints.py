"""The users route: ``DELETE /v1/users/{user}`` (scope ``users:delete``).

Forgets a user of the caller's org, named by the application's key or by id: the user, their
sessions (of every agent) and every memory scoped to them are soft-deleted and their tokens
revoked in one transaction (``ibex_core.forget_user``); from the answer on, no read returns
them, and ``ibex prune --deleted-older-than`` erases them later. 200 with the counts; 404 for
a user the org does not have (or has forgotten already), and for another user than a
user-bound token's own.
"""

from __future__ import annotations

import falcon

from memories.users import UserService
from memory_service.http import Api, authenticate, respond_json
from schema.users import MAX_USER_KEY_CHARS
from sessions.errors import UserNotFoundError

USERS_DELETE = "users:delete"


class UserResource:
    def __init__(self, api: Api, service: UserService) -> None:
        self.api = api
        self.service = service

    def on_delete(self, req: falcon.Request, resp: falcon.Response, user: str) -> None:
        principal, org_id = authenticate(self.api, req, USERS_DELETE)
        if not 0 < len(user) <= MAX_USER_KEY_CHARS or not user.isprintable():
            raise UserNotFoundError()
        forgotten = self.service.forget(principal, org_id, user)
        respond_json(
            resp,
            200,
            {
                "user_id": str(forgotten.user_id),
                "sessions": forgotten.sessions,
                "memories": forgotten.memories,
                "tokens": forgotten.tokens,
            },
        )
