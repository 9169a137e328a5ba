"""Each database role can do exactly what its name says, and nothing else.

Every table of ``ibex_core`` and ``ibex_memory`` and every function there is read from the
catalog and tried, as each role: SELECT and UPDATE column by column, INSERT and DELETE per
table, EXECUTE per function. What the database lets through is compared with :data:`EXPECTED`;
anything not stated there must be refused. A new table or function is tried automatically and
fails this test until its line is added to :data:`EXPECTED` (and a row of it to :func:`seed`).

What counts as "allowed" is what the role can actually achieve, not what is granted:

- SELECT of a column: at least one seeded row comes back.
- INSERT: a copy of a seeded row of the org in hand gets past the privilege and row-level
  checks (a unique violation afterwards still counts as allowed: the checks came first).
- UPDATE of a column: setting it to a seeded row's value reaches at least one row, or fails on
  something other than a privilege (a constraint or a trigger's rule).
- DELETE: at least one row is reached, or a constraint stops it.
- EXECUTE: the call runs, or fails on something other than a privilege (a trigger function
  called directly, a NULL argument).

Generated columns (the search vector) are left out: the database computes them and nobody may
write them.

Refused is SQLSTATE 42501 (permission denied, a row-level security policy, an append-only
trigger) or nothing reached (row-level security hid every row). Each probe runs in a savepoint
of one transaction per role and is rolled back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
import pytest
from psycopg2 import sql

from core.db import connect_params
from memories.tokens import TokenStore
from tests.integration.foundation.helpers import make_session

SCHEMAS = ("ibex_core", "ibex_memory")
ALL = "*"

#: The roles as the code uses them: the tenant role with an org set (core.db.tenant) and without
#: one (bearer-token lookup, before the org is known), the scan and the operators.
CASES = {
    "tenant": ("ibex_app", True),
    "tenant without org": ("ibex_app", False),
    "scan": ("ibex_scan", False),
    "operator": ("ibex_ops", False),
}

TENANT_TABLES: dict[str, dict[str, Any]] = {
    "ibex_core.orgs": {},  # the registry: the owner resolves slugs before a tenant transaction
    "ibex_core.agents": {"SELECT": ALL, "INSERT": ALL},
    "ibex_core.directives": {"SELECT": ALL, "INSERT": ALL, "UPDATE": ALL},
    "ibex_core.directive_versions": {"SELECT": ALL, "INSERT": ALL, "UPDATE": ALL, "DELETE": ALL},
    "ibex_core.sessions": {"SELECT": ALL, "INSERT": ALL, "UPDATE": ALL},
    "ibex_core.checkpoints": {"SELECT": ALL, "INSERT": ALL},  # append-only
    "ibex_core.checkpoint_payloads": {"SELECT": ALL, "INSERT": ALL},  # append-only
    "ibex_core.extraction_turns": {"SELECT": ALL, "INSERT": ALL, "UPDATE": ALL},
    "ibex_core.extraction_slots": {"SELECT": ALL, "INSERT": ALL},
    # The usage ledger (000022): written with the turn's result, never changed.
    "ibex_core.turn_usage": {"SELECT": ALL, "INSERT": ALL},
    # Budgets (000022): set by the owner (`ibex budget`); the tenant role reads its org's and
    # counts each stored result's tokens into it.
    "ibex_core.org_budgets": {"SELECT": ALL, "UPDATE": {"used", "period_start", "reported"}},
    "ibex_core.dead_letters": {},  # operator data, written by the owner
    "ibex_core.users": {"SELECT": ALL, "INSERT": ALL, "UPDATE": ALL},  # never deleted by it
    "ibex_memory.memories": {"SELECT": ALL, "INSERT": ALL, "UPDATE": ALL},
    "ibex_memory.api_tokens": {},  # only through authenticate_token
    # Semantic search (000016): vectors written with their memory and replaced by the
    # backfill, removed only with their memory; the model registry is read, never written
    # (000019: a process registers its configured model as the owner, so no tenant's write
    # decides a model's dimension for the others).
    "ibex_memory.memory_embeddings": {"SELECT": ALL, "INSERT": ALL, "UPDATE": ALL},
    "ibex_memory.embedding_models": {"SELECT": ALL},
}

#: The model registry holds no tenant data (model names and dimensions): no row-level
#: security, so the tenant role reads it with or without an org.
REGISTRY = {"ibex_memory.embedding_models": {"SELECT": ALL}}

TOKEN_COLUMNS_BUT_HASH = {
    "id",
    "org_id",
    "name",
    "prefix",
    "scopes",
    "is_service",
    "created_at",
    "last_used_at",
    "revoked_at",
    "user_id",
}

SCAN_COLUMNS = {
    "id",
    "org_id",
    "agent_id",
    "status",
    "turn_count",
    "last_extracted_turn",
    "deleted_at",
}

POLICY_PREDICATE = "ibex_core.rls_org_visible(uuid)"
TOKEN_LOOKUP = "ibex_memory.authenticate_token(text)"
#: The lookup with the user a token is bound to (migration 000013), which the service calls.
BEARER_LOOKUP = "ibex_memory.authenticate_bearer(text)"
#: Memory search: index lookups scoped to the transaction's org (ids only; rows are then read
#: under RLS).
SEARCH = {
    "ibex_memory.search_branches(uuid,text[],text[],uuid,text[],integer,integer)",
    "ibex_memory.search_candidates(uuid,text[],text[],uuid,text[],integer,integer)",
    # Narrowed to the reader's users (migration 000013): all users, one user with or without
    # the agent-wide memories, or those alone.
    "ibex_memory.search_branches(uuid,text[],text[],uuid,text[],integer,integer,boolean,uuid,"
    "boolean)",
    "ibex_memory.search_candidates(uuid,text[],text[],uuid,text[],integer,integer,boolean,uuid,"
    "boolean)",
    "ibex_memory.user_scope_condition(boolean,uuid,boolean)",
}

#: Supersession and near-duplicates (000014): the trigram lookup create_memory calls as the
#: tenant role (it runs as its owner, confined to the org set, like search_candidates), and
#: the history walk (under the caller's row-level security).
CHANGE = {
    "ibex_memory.near_duplicate_of(uuid,uuid,text,text,real,uuid[])",
    "ibex_memory.memory_history(uuid)",
    # The lookup's index key (000018): the scope and the content's digits, as text.
    "ibex_memory.near_duplicate_key(uuid,uuid,uuid,text)",
}

#: Semantic search (000016): storing vectors (create_memory's step, the backfill's batch),
#: the scope's nearest memories (runs as its owner, confined to the org set, like
#: search_candidates), the dot product of the fallback; the HNSW index is the owner's to make.
SEMANTIC = {
    "ibex_memory.store_new_embedding(uuid,uuid,text,real[])",
    "ibex_memory.put_embeddings(uuid[],text,integer,jsonb)",
    "ibex_memory.put_embeddings(uuid[],text,integer,text[])",
    "ibex_memory.semantic_candidates(uuid,text,real[],integer,integer,uuid,text[],boolean,"
    "boolean,uuid,boolean)",
    "ibex_memory.dot(real[],real[])",
}
VECTOR_INDEX = "ibex_memory.ensure_vector_index(integer)"
#: Makes the extension cube (where it can) and the functions of CUBE_DOT: the owner's (000033).
DOT_CUBES_SETUP = "ibex_memory.ensure_dot_cubes()"
#: The fallback's dot products in C (000033), made only where the server ships contrib's cube:
#: expected where the catalog holds them (:func:`without_cube`).
CUBE_DOT = {
    "ibex_memory.dot_cubes(real[],cube[],double precision)",
    "ibex_memory.dot_query_cubes(real[])",
    "ibex_memory.dot_query_norm(real[])",
}

#: A session's extraction progress for the sessions API, under the caller's row-level security.
PROGRESS = "ibex_core.session_progress(uuid[])"

#: The scan's record-and-lease: called by the login role and switching to the tenant role
#: itself (as create_memory does), so no role here may execute it.
SCAN_LEASE = (
    "ibex_core.scan_record_and_lease(uuid[],integer[],uuid[],integer[],uuid[],integer[],integer)"
)

#: The pipeline's stage steps: called by the login role and switching to the tenant role
#: themselves, so no role here may execute them; the race tests' seam they call runs as the
#: tenant role.
STAGE_STEPS = {
    "ibex_core.begin_extract(uuid,uuid,integer,integer,integer,integer,integer,uuid,boolean,uuid,"
    "integer)",
    # 000022: with the LLM call's latency and the embedding tokens, for the usage ledger.
    "ibex_core.persist_result(uuid,uuid,integer,uuid,jsonb,integer,integer,integer,text,text,integer,"
    "text,boolean,integer,integer,text)",
    # A result persisted for the same LLM input (000014): reused with no LLM call.
    "ibex_core.find_result(uuid,text)",
    "ibex_core.load_slot(uuid,uuid,integer,integer)",
    "ibex_core.record_slot(uuid,uuid,integer,integer,uuid,uuid,text)",
    "ibex_core.complete_turn(uuid,uuid,integer)",
    "ibex_core.turn_status(uuid,uuid,integer)",
}
STAGE_PAUSE = "ibex_core.stage_pause(text)"

#: Turn states and usage (000022), read under the caller's row-level security: a turn's state,
#: a failure's class, a session's turns with state and usage, the org's turns by state.
TURN_READS = {
    "ibex_core.turn_state(ibex_core.extraction_turns,integer,integer)",
    "ibex_core.turn_failure_class(text)",
    "ibex_core.session_turns(uuid,integer,integer)",
    "ibex_core.turn_state_counts(uuid[])",
    "ibex_core.budget_period_start(text)",
}

#: Forgetting a user: called by the login role (it revokes tokens as that role, then switches
#: to the tenant role itself), so no role here may execute it.
FORGET_USER = "ibex_core.forget_user(uuid,uuid)"

#: case -> table -> privilege -> ALL or the columns; plus the functions it may execute.
EXPECTED: dict[str, dict[str, Any]] = {
    "tenant": {
        "tables": TENANT_TABLES,
        "functions": {
            POLICY_PREDICATE,
            TOKEN_LOOKUP,
            BEARER_LOOKUP,
            PROGRESS,
            STAGE_PAUSE,
            *TURN_READS,
            *SEARCH,
            *CHANGE,
            *SEMANTIC,
            *CUBE_DOT,
        },
    },
    "tenant without org": {
        "tables": REGISTRY,
        "functions": {
            POLICY_PREDICATE,
            TOKEN_LOOKUP,
            BEARER_LOOKUP,
            PROGRESS,
            STAGE_PAUSE,
            *TURN_READS,
            *SEARCH,
            *CHANGE,
            *SEMANTIC,
            *CUBE_DOT,
        },
    },
    "scan": {
        "tables": {"ibex_core.sessions": {"SELECT": SCAN_COLUMNS}},
        "functions": {POLICY_PREDICATE},
    },
    "operator": {
        "tables": {
            **{table: {"SELECT": ALL} for table in TENANT_TABLES},
            "ibex_memory.api_tokens": {"SELECT": TOKEN_COLUMNS_BUT_HASH},
        },
        "functions": {POLICY_PREDICATE},
    },
}

#: Every table and function the expectations speak of: the catalog must hold exactly these.
KNOWN_TABLES = set(TENANT_TABLES)
KNOWN_FUNCTIONS = {
    POLICY_PREDICATE,
    TOKEN_LOOKUP,
    BEARER_LOOKUP,
    "ibex_core.touch_updated_at()",
    "ibex_core.reject_update()",
    "ibex_core.sessions_monotonic()",
    "ibex_core.directive_version_detach()",
    "ibex_core.extraction_result_first_wins()",
    "ibex_memory.memory_of_deleted_session()",
    # 000021: a session's memories follow the session (its user given late, its deletion).
    "ibex_core.session_given_user()",
    "ibex_core.session_deleted()",
    "ibex_memory.create_memory(uuid,uuid,uuid,integer,integer,text,text,text,jsonb,text,text,uuid,"
    "uuid[],boolean,real)",
    # 000016: the same write with the memory's vector and its model.
    "ibex_memory.create_memory(uuid,uuid,uuid,integer,integer,text,text,text,jsonb,text,text,uuid,"
    "uuid[],boolean,real,text,real[])",
    VECTOR_INDEX,
    DOT_CUBES_SETUP,
    *SEMANTIC,
    *CUBE_DOT,
    FORGET_USER,
    PROGRESS,
    *TURN_READS,
    SCAN_LEASE,
    STAGE_PAUSE,
    *STAGE_STEPS,
    *SEARCH,
    *CHANGE,
}


@dataclass(frozen=True)
class Function:
    signature: str  # regprocedure text: schema.name(argtypes)
    name: str
    arg_types: tuple[str, ...]
    returns_set: bool


def tables(cur: Any) -> dict[str, list[str]]:
    cur.execute(
        """
        SELECT n.nspname || '.' || c.relname, array_agg(a.attname::text ORDER BY a.attnum)
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                                AND a.attgenerated = ''
         WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
         GROUP BY 1 ORDER BY 1
        """,
        (list(SCHEMAS),),
    )
    return dict(cur.fetchall())


def functions(cur: Any) -> list[Function]:
    cur.execute(
        """
        SELECT p.oid::regprocedure::text, n.nspname || '.' || p.proname,
               array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[])
                     WITH ORDINALITY AS a(t, i) ORDER BY i),
               p.proretset
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = ANY(%s) AND p.prokind = 'f'
         ORDER BY 1
        """,
        (list(SCHEMAS),),
    )
    return [Function(sig, name, tuple(args), bool(srf)) for sig, name, args, srf in cur.fetchall()]


def seed(store: Any) -> tuple[uuid.UUID, uuid.UUID]:
    """A row in every table, for two orgs; returns (the org in hand, the other org)."""
    db = store.db
    org_ids = []
    for slug in ("roles-a", "roles-b"):
        org_id, agent_id, session_id = make_session(store, slug, turns=1)
        org_ids.append(org_id)
        user_id = db.execute_sql(
            "INSERT INTO ibex_core.users (org_id, external_id) VALUES (%s, %s) RETURNING id",
            (str(org_id), f"person-{slug}"),
        ).fetchone()[0]
        db.execute_sql(
            "UPDATE ibex_core.sessions SET user_id = %s WHERE id = %s",
            (str(user_id), str(session_id)),
        )
        directive = db.execute_sql(
            "INSERT INTO ibex_core.directives (org_id, name) VALUES (%s, 'd') RETURNING id",
            (str(org_id),),
        ).fetchone()[0]
        db.execute_sql(
            "INSERT INTO ibex_core.directive_versions (org_id, directive_id, version, body)"
            " VALUES (%s, %s, 1, 'be brief')",
            (str(org_id), str(directive)),
        )
        db.execute_sql(
            "INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index, state,"
            " result, memory_count) VALUES (%s, %s, 1, 'extracted', '[]', 0)",
            (str(org_id), str(session_id)),
        )
        db.execute_sql(
            "INSERT INTO ibex_core.extraction_slots (org_id, session_id, turn_index, ordinal,"
            " idempotency_key, outcome) VALUES (%s, %s, 1, 0, %s, 'created')",
            (str(org_id), str(session_id), str(uuid.uuid4())),
        )
        db.execute_sql(
            "INSERT INTO ibex_core.org_budgets (org_id, token_limit, period, period_start)"
            " VALUES (%s, 1000, 'month', now())",
            (str(org_id),),
        )
        db.execute_sql(
            "INSERT INTO ibex_core.turn_usage (org_id, agent_id, session_id, turn_index,"
            " llm_calls, input_tokens, output_tokens) VALUES (%s, %s, %s, 1, 1, 10, 2)",
            (str(org_id), str(agent_id), str(session_id)),
        )
        db.execute_sql(
            "INSERT INTO ibex_memory.memories (org_id, agent_id, session_id, turn_index,"
            " ordinal, content, content_hash, user_id)"
            " VALUES (%s, %s, %s, 1, 0, 'Dana likes tea', 'h', %s)",
            (str(org_id), str(agent_id), str(session_id), str(user_id)),
        )
        db.execute_sql(
            "INSERT INTO ibex_core.dead_letters (redis_message_id, message_id, queue_name,"
            " actor_name, org_id, payload) VALUES (%s, 'm', 'q', 'a', %s, '{}')",
            (f"r-{slug}", str(org_id)),
        )
        TokenStore(db).issue(org_id=org_id, name=slug, scopes=["memory:read"])
        db.execute_sql(
            "INSERT INTO ibex_memory.embedding_models (model, dimension) VALUES ('test:m', 2)"
            " ON CONFLICT DO NOTHING"
        )
        db.execute_sql(
            "INSERT INTO ibex_memory.memory_embeddings (org_id, memory_id, agent_id,"
            " model, dimension, embedding)"
            " SELECT org_id, id, agent_id, 'test:m', 2, '{0.6,0.8}'"
            "   FROM ibex_memory.memories WHERE org_id = %s",
            (str(org_id),),
        )
    return org_ids[0], org_ids[1]


@pytest.fixture
def catalog(store: Any, database_url: str) -> Iterator[tuple[Any, uuid.UUID]]:
    """A psycopg2 connection to the seeded database (the owner's: a superuser), and the org."""
    org, _ = seed(store)
    conn = psycopg2.connect(**connect_params(database_url))
    try:
        yield conn, org
    finally:
        conn.rollback()
        conn.close()


def sample_row(cur: Any, table: str, org: uuid.UUID, columns: list[str]) -> str:
    """A seeded row of ``table`` as JSON, of ``org`` when the table has an org."""
    where = sql.SQL("WHERE org_id = %s") if "org_id" in columns else sql.SQL("")
    cur.execute(
        sql.SQL("SELECT row_to_json(t)::text FROM {} t {} LIMIT 1").format(sql.SQL(table), where),
        (str(org),) if "org_id" in columns else (),
    )
    row = cur.fetchone()
    assert row is not None, f"seed() must put a row in {table} (of the org in hand)"
    return str(row[0])


class Prober:
    """Runs statements as one role in savepoints of a single transaction."""

    def __init__(self, cur: Any) -> None:
        self.cur = cur

    def attempt(self, statement: Any, params: tuple[Any, ...] = (), *, reach: bool) -> bool:
        """Whether the database let the statement through (see the module docstring)."""
        self.cur.execute("SAVEPOINT probe")
        try:
            self.cur.execute(statement, params)
            reached = self.cur.rowcount > 0 if reach else True
        except psycopg2.errors.InsufficientPrivilege:
            reached = False
        except psycopg2.Error:
            reached = True  # stopped by a constraint or rule after every privilege check
        self.cur.execute("ROLLBACK TO SAVEPOINT probe")
        return reached


def observe(conn: Any, role: str, org: uuid.UUID | None, org_in_hand: uuid.UUID) -> dict[str, Any]:
    """What ``role`` (with ``org`` set, or none) can do to every table and function."""
    seen: dict[str, Any] = {"tables": {}, "functions": set(), "leaks": []}
    with conn.cursor() as owner:
        table_columns = tables(owner)
        samples = {t: sample_row(owner, t, org_in_hand, c) for t, c in table_columns.items()}
        all_functions = functions(owner)
    conn.rollback()
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        if org is not None:
            cur.execute("SELECT set_config('ibex.org_id', %s, true)", (str(org),))
        probe = Prober(cur)
        for table, columns in table_columns.items():
            name = sql.SQL(table)
            record = sql.SQL("json_populate_record(NULL::{}, %s::json)").format(name)
            done: dict[str, Any] = {}
            selectable = {
                c
                for c in columns
                if probe.attempt(
                    sql.SQL("SELECT {} FROM {}").format(sql.Identifier(c), name), reach=True
                )
            }
            updatable = {
                c
                for c in columns
                if probe.attempt(
                    sql.SQL("UPDATE {} SET {} = ({}).{}").format(
                        name, sql.Identifier(c), record, sql.Identifier(c)
                    ),
                    (samples[table],),
                    reach=True,
                )
            }
            for privilege, granted in (("SELECT", selectable), ("UPDATE", updatable)):
                if granted:
                    done[privilege] = ALL if granted == set(columns) else granted
            listed = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
            insert = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                name, listed, listed, record
            )
            if probe.attempt(insert, (samples[table],), reach=True):
                done["INSERT"] = ALL
            if probe.attempt(sql.SQL("DELETE FROM {}").format(name), reach=True):
                done["DELETE"] = ALL
            if done:
                seen["tables"][table] = done
            if org is not None and "org_id" in selectable:
                # The tenant role sees its own org's rows only.
                cur.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE org_id IS DISTINCT FROM %s").format(
                        name
                    ),
                    (str(org),),
                )
                if cur.fetchone()[0]:
                    seen["leaks"].append(table)
        for function in all_functions:
            args = sql.SQL(", ").join(sql.SQL(f"NULL::{t}") for t in function.arg_types)
            call = sql.SQL("SELECT * FROM {}({})" if function.returns_set else "SELECT {}({})")
            if probe.attempt(call.format(sql.SQL(function.name), args), reach=False):
                seen["functions"].add(function.signature)
    conn.rollback()
    return seen


def without_cube(conn: Any, functions: set[str]) -> set[str]:
    """``functions`` less :data:`CUBE_DOT` where the server has no cube (000033 made none)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regproc('ibex_memory.dot_cubes') IS NOT NULL")
        (installed,) = cur.fetchone()
    return functions if installed else functions - CUBE_DOT


def test_the_catalog_holds_exactly_the_objects_the_expectations_cover(catalog) -> None:
    conn, _ = catalog
    with conn.cursor() as cur:
        assert set(tables(cur)) == KNOWN_TABLES, "state what each role may do on a new table"
        found = {f.signature for f in functions(cur)}
    expected = without_cube(conn, KNOWN_FUNCTIONS)
    assert found == expected, "state which roles may execute a new function"


@pytest.mark.parametrize("case", list(CASES))
def test_each_role_can_do_what_its_name_says_and_nothing_else(catalog, case: str) -> None:
    conn, org = catalog
    role, with_org = CASES[case]
    seen = observe(conn, role, org if with_org else None, org)
    expected = EXPECTED[case]
    assert seen["leaks"] == []
    difference = {
        table: {"expected": expected["tables"].get(table), "seen": seen["tables"].get(table)}
        for table in set(expected["tables"]) | set(seen["tables"])
        if (expected["tables"].get(table) or {}) != (seen["tables"].get(table) or {})
    }
    assert difference == {}, json.dumps(difference, default=sorted, indent=1)
    functions_seen = seen["functions"]
    functions_expected = without_cube(conn, expected["functions"])
    assert functions_seen == functions_expected, {
        "executed but not stated": sorted(functions_seen - functions_expected),
        "stated but refused": sorted(functions_expected - functions_seen),
    }


def test_the_operator_cannot_write_a_memory_through_the_function(catalog) -> None:
    conn, org = catalog
    with conn.cursor() as cur:
        cur.execute("SELECT id FROM ibex_core.agents WHERE org_id = %s", (str(org),))
        agent = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM ibex_memory.memories")
        before = cur.fetchone()[0]
        cur.execute("SET LOCAL ROLE ibex_ops")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute(
                "SELECT * FROM ibex_memory.create_memory(%s, %s, NULL, NULL, NULL, 'ops wrote',"
                " 'h2', 'fact', '{}', NULL, NULL)",
                (str(org), str(agent)),
            )
    conn.rollback()
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM ibex_memory.memories")
        assert cur.fetchone()[0] == before
