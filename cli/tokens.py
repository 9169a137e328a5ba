"""``ibex token create|list|revoke``: API tokens of the memory service.

``create`` prints the token once, on standard output, and stores only its SHA-256 hash. An
unknown org slug is an error (a typo must not create an org) unless ``--create-org`` is given.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, print_json_or_empty
from core.config import Settings
from schema.memory import SCOPES

DATABASE = True


def add_parser(sub: Any) -> None:
    token = sub.add_parser("token", help="create, list and revoke memory service API tokens")
    actions = token.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    create = actions.add_parser("create", help="create a token and print it once")
    owner = create.add_mutually_exclusive_group(required=True)
    owner.add_argument("--org", metavar="SLUG", help="the org the token belongs to")
    owner.add_argument(
        "--service", action="store_true", help="a service token: acts for the org in X-IBEX-Org-ID"
    )
    create.add_argument(
        "--scope",
        action="append",
        choices=SCOPES,
        required=True,
        help=f"{', '.join(SCOPES)} (repeat the option)",
    )
    create.add_argument(
        "--user",
        metavar="KEY",
        help="bind the token to this user of the --org (the application's key, created when"
        " missing): it sees and writes that user's data only, and the agent-wide memories",
    )
    create.add_argument("--name", help="a label shown by 'ibex token list'")
    create.add_argument(
        "--create-org", action="store_true", help="create the --org when it does not exist yet"
    )

    listing = actions.add_parser(
        "list", help="list tokens (prefix, scopes, state; never the token)"
    )
    listing.add_argument("--json", action="store_true", help="stable JSON output")

    revoke = actions.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id", help="the token id shown by 'ibex token list'")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from core.db import make_database
    from memories.tokens import TokenStore

    store = TokenStore(make_database(settings.require_database_url()))
    try:
        if args.action == "create":
            return _create(store, args)
        if args.action == "list":
            return _list(store, args)
        return _revoke(store, args)
    finally:
        store.db.close()


def _create(store: Any, args: argparse.Namespace) -> int:
    from core.db import db_errors
    from schema.common import SLUG
    from sessions.orgs import select_org

    org_id: uuid.UUID | None = None
    if args.org is None and args.create_org:
        print("ibex token create: --create-org needs --org", file=sys.stderr)
        return EXIT_USAGE
    if args.org is not None:
        if not SLUG.match(args.org):
            print(f"ibex token create: invalid org slug {args.org!r}", file=sys.stderr)
            return EXIT_FAILURE
        if args.create_org:
            org_id = store.ensure_org(args.org)
        else:
            with db_errors():
                org_id = select_org(store.db, args.org)
            if org_id is None:
                print(
                    f"ibex token create: no org {args.org!r}; check the slug, or add"
                    " --create-org to create it",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
    user_id: uuid.UUID | None = None
    if args.user is not None:
        if org_id is None:
            print("ibex token create: --user needs --org", file=sys.stderr)
            return EXIT_USAGE
        user_id = _resolve_user(store, org_id, args.user)
        if user_id is None:
            return EXIT_FAILURE
    scopes = sorted(set(args.scope))
    row, token = store.issue(org_id=org_id, name=args.name, scopes=scopes, user_id=user_id)
    owner = f"org {args.org} ({org_id})" if org_id else "service (any org via X-IBEX-Org-ID)"
    if user_id is not None:
        owner += f", bound to user {args.user!r} ({user_id})"
    print(token)
    print(
        f"created token {row.id} for {owner}, scopes {' '.join(scopes)};"
        " it is shown only this once",
        file=sys.stderr,
    )
    return EXIT_OK


def _org_slugs(db: Any) -> dict[str, str]:
    """Every org's slug by id (read as the operator role)."""
    from core.db import db_errors, operator_scope

    with db_errors(), operator_scope(db):
        rows = db.execute_sql("SELECT id, slug FROM ibex_core.orgs").fetchall()
    return {str(org_id): slug for org_id, slug in rows}


def _resolve_user(store: Any, org_id: uuid.UUID, key: str) -> uuid.UUID | None:
    """The live user of the org with the application's key ``key``, created when missing;
    None (said on stderr) for a key that cannot be one."""
    from typing import cast

    from playhouse.postgres_ext import PostgresqlExtDatabase

    from models.users import EXTERNAL_ID_MAX
    from sessions.store import SessionStore

    if not 0 < len(key) <= EXTERNAL_ID_MAX or not key.isprintable():
        print(
            f"ibex token create: --user must be 1-{EXTERNAL_ID_MAX} printable characters",
            file=sys.stderr,
        )
        return None
    users = SessionStore(cast(PostgresqlExtDatabase, store.db), bind_models=False)
    user_id: uuid.UUID = users.resolve_user(org_id, external_id=key)
    return user_id


def _list(store: Any, args: argparse.Namespace) -> int:
    rows = store.list()
    slugs = _org_slugs(store.db) if rows else {}

    def to_json(row: Any) -> dict[str, Any]:
        data: dict[str, Any] = row.public()
        data["org"] = slugs.get(str(row.org_id)) if row.org_id else None
        return data

    if print_json_or_empty(rows, as_json=args.json, to_json=to_json, empty="no tokens"):
        return EXIT_OK
    print(f"{'ID':36}  {'PREFIX':12}  {'OWNER':20}  {'SCOPES':25}  {'STATE':7}  NAME")
    for r in rows:
        owner = slugs.get(str(r.org_id), str(r.org_id)) if r.org_id else "service"
        state = "revoked" if r.revoked_at else "active"
        print(
            f"{r.id!s:36}  {r.prefix:12}  {owner:20}  {','.join(r.scopes):25}  {state:7}"
            f"  {r.name or ''}"
        )
    return EXIT_OK


def _revoke(store: Any, args: argparse.Namespace) -> int:
    try:
        token_id = uuid.UUID(args.id)
    except ValueError:
        print(f"ibex token revoke: {args.id!r} is not a token id", file=sys.stderr)
        return EXIT_FAILURE
    row = store.revoke(token_id)
    if row is None:
        print(f"ibex token revoke: no token {token_id}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"revoked token {row.id} ({row.prefix}…)")
    return EXIT_OK
