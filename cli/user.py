"""``ibex user forget --org SLUG USER [--json]``: forget a user of an org, as
``DELETE /v1/users/{user}`` does.

``USER`` is the application's key for the person, or the user's id. In one transaction
(``ibex_core.forget_user``): the user, their sessions (of every agent) and every memory scoped
to them or drawn from their sessions are soft-deleted, and their tokens revoked; from then on no
read returns them, and ``ibex prune --deleted-older-than AGE`` erases the rows. An unknown org
or user is an error (nothing is created).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK
from core.config import Settings
from schema.common import SLUG

DATABASE = True


def add_parser(sub: Any) -> None:
    user = sub.add_parser("user", help="the people an org's agents serve: forget one")
    actions = user.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    forget = actions.add_parser(
        "forget",
        help="soft-delete a user, their sessions and memories, and revoke their tokens",
    )
    forget.add_argument(
        "user", metavar="USER", help="the application's key for the person, or an id"
    )
    forget.add_argument("--org", metavar="SLUG", required=True, help="the org")
    forget.add_argument("--json", action="store_true", help="stable JSON output")


def _fail(message: str) -> int:
    print(f"ibex user forget: {message}", file=sys.stderr)
    return EXIT_FAILURE


def run(args: argparse.Namespace, settings: Settings) -> int:
    from core.db import make_database
    from memories.auth import Principal
    from memories.users import UserService
    from sessions.errors import UserNotFoundError
    from sessions.store import SessionStore
    from sessions.users import UserStore

    if not SLUG.match(args.org):
        return _fail(f"invalid org slug {args.org!r}")
    db = make_database(settings.require_database_url())
    try:
        org_id = SessionStore(db).find_org(args.org)
        if org_id is None:
            return _fail(f"no org {args.org!r}")
        # The operator acts as an org-wide caller: any user of the org.
        operator = Principal(token_id=org_id, org_id=org_id, scopes=frozenset(), is_service=False)
        try:
            forgotten = UserService(UserStore(db)).forget(operator, org_id, args.user)
        except UserNotFoundError:
            return _fail(f"no user {args.user!r} in org {args.org!r} (or forgotten already)")
    finally:
        db.close()
    counts = {
        "user_id": str(forgotten.user_id),
        "sessions": forgotten.sessions,
        "memories": forgotten.memories,
        "tokens": forgotten.tokens,
    }
    if args.json:
        print(json.dumps(counts, indent=2, sort_keys=True))
    else:
        print(
            f"forgot user {args.user!r} ({forgotten.user_id}) of org {args.org!r}:"
            f" {forgotten.sessions} sessions and {forgotten.memories} memories deleted,"
            f" {forgotten.tokens} tokens revoked; 'ibex prune --deleted-older-than AGE' erases"
            " them"
        )
    return EXIT_OK
