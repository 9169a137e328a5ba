"""The peewee models match the SQL migrations column for column."""

from __future__ import annotations

from models import ALL_MODELS as PRODUCT_MODELS
from tests.integration.foundation.models_memory import (
    ApiToken,
    EmbeddingModel,
    Memory,
    MemoryEmbedding,
)
from tests.integration.foundation.models_pipeline import (
    DeadLetter,
    ExtractionSlot,
    ExtractionTurn,
    OrgBudget,
    TurnUsage,
)

# The tables their stores read and write with SQL of their own have no product model; their
# declarations sit beside this test, which is all they serve.
ALL_MODELS = (
    *PRODUCT_MODELS,
    ExtractionTurn,
    ExtractionSlot,
    DeadLetter,
    TurnUsage,
    OrgBudget,
    Memory,
    ApiToken,
    MemoryEmbedding,
    EmbeddingModel,
)

# peewee field type -> information_schema data_type
TYPE_MAP = {
    "UUID": "uuid",
    "TEXT": "text",
    "INT": "integer",
    "BIGINT": "bigint",
    "BIGAUTO": "bigint",
    "BOOL": "boolean",
    "TIMESTAMPTZ": "timestamp with time zone",
    "JSONB": "jsonb",
    "TSVECTOR": "tsvector",
}


def _expected_type(field) -> str:
    field_type = field.field_type
    if field_type.startswith("ibex_core."):
        return "USER-DEFINED:" + field_type.split(".", 1)[1]
    if getattr(field, "_ArrayField__dimensions", None) or type(field).__name__ == "ArrayField":
        return "ARRAY"
    return TYPE_MAP[field_type]


def test_models_match_the_sql(db) -> None:
    problems = []
    for model in ALL_MODELS:
        meta = model._meta
        rows = db.execute_sql(
            "SELECT column_name, data_type, udt_name, is_nullable"
            " FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
            (meta.schema, meta.table_name),
        ).fetchall()
        assert rows, f"{meta.schema}.{meta.table_name} does not exist"
        columns = {
            name: ("USER-DEFINED:" + udt if dtype == "USER-DEFINED" else dtype, nullable == "YES")
            for name, dtype, udt, nullable in rows
        }
        fields = {f.column_name: f for f in meta.sorted_fields}
        for name in sorted(set(columns) | set(fields)):
            if name not in fields:
                problems.append(f"{meta.table_name}.{name}: in SQL, not in the model")
                continue
            if name not in columns:
                problems.append(f"{meta.table_name}.{name}: in the model, not in SQL")
                continue
            field = fields[name]
            sql_type, sql_null = columns[name]
            if _expected_type(field) != sql_type:
                problems.append(
                    f"{meta.table_name}.{name}: model {_expected_type(field)}, SQL {sql_type}"
                )
            model_null = bool(field.null)
            if model_null != sql_null and not field.primary_key:
                problems.append(
                    f"{meta.table_name}.{name}: null model {model_null}, SQL {sql_null}"
                )
        primary = db.execute_sql(
            "SELECT a.attname FROM pg_index i"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = %s::regclass AND i.indisprimary",
            (f"{meta.schema}.{meta.table_name}",),
        ).fetchall()
        pk_model = {f.column_name for f in meta.get_primary_keys()}
        if {r[0] for r in primary} != pk_model:
            problems.append(f"{meta.table_name}: primary key differs")
    assert problems == []


def test_every_table_in_the_schemas_has_a_model(db) -> None:
    rows = db.execute_sql(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables"
        " WHERE table_schema IN ('ibex_core', 'ibex_memory') AND table_type = 'BASE TABLE'"
    ).fetchall()
    modelled = {f"{m._meta.schema}.{m._meta.table_name}" for m in ALL_MODELS}
    assert {r[0] for r in rows} == modelled
