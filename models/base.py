"""The database proxy every model binds to, and field types peewee lacks."""

from __future__ import annotations

import peewee
from playhouse.postgres_ext import PostgresqlExtDatabase

database_proxy = peewee.DatabaseProxy()


class PgEnumField(peewee.Field):
    """A column of a Postgres enum type, read and written as its label."""

    def __init__(self, enum_type: str, choices: tuple[str, ...], **kwargs: object) -> None:
        self.field_type = enum_type  # type: ignore[misc]
        self.labels = choices
        super().__init__(**kwargs)

    def db_value(self, value: object) -> object:
        if value is not None and value not in self.labels:
            raise ValueError(f"{value!r} is not one of {', '.join(self.labels)}")
        return value


class BaseModel(peewee.Model):
    class Meta:
        database = database_proxy
        legacy_table_names = False


def bind(db: PostgresqlExtDatabase) -> PostgresqlExtDatabase:
    """Point every model at ``db``."""
    database_proxy.initialize(db)
    return db
