"""Model instances from hand-written SQL, for the few statements every device call runs.

Compiling an ORM query can cost more than running it: a device token's lookup (the
device, its class, its team and the caller's token lockout) took 1.6 ms of CPU to
compile and 0.2 ms to run. Those statements are written once, from the models' own
tables and columns, and their rows become instances with the conversions the ORM
applies (JSON text, SQLite's datetimes and booleans), so a model's new field needs no
change here. The statement every job's dispatch waits on is also prepared on PostgreSQL
(prepared_cursor): planning it took longer than running it.
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

M = TypeVar("M", bound=Model)


class Columns(Generic[M]):
    """A model's concrete columns (or those named) under a table alias: their SQL, and a
    row's values made into an instance, or into their values as the ORM gives them."""

    def __init__(self, model: type[M], alias: str, names: Sequence[str] | None = None) -> None:
        self.model, self.alias = model, alias
        fields = model._meta.concrete_fields
        # Concrete fields, each with its column (django-stubs allows a field none).
        self.fields: list[Any] = [f for f in fields if names is None or f.name in names]
        self.names = [field.attname for field in self.fields]
        self.floats = [
            index
            for index, field in enumerate(self.fields)
            if field.get_internal_type() == "FloatField"
        ]
        self._converters: dict[str, list[tuple[int, Any, list[Callable]]]] = {}  # per vendor

    def __len__(self) -> int:
        return len(self.fields)

    def sql(self, connection: BaseDatabaseWrapper) -> str:
        quote = connection.ops.quote_name
        return ", ".join(f"{quote(self.alias)}.{quote(field.column)}" for field in self.fields)

    def instance(self, values: Sequence[Any], connection: BaseDatabaseWrapper) -> M:
        """Return the model instance of these values, converted as the ORM converts them."""
        return self.model.from_db(connection.alias, self.names, self.values(values, connection))

    def values(self, values: Sequence[Any], connection: BaseDatabaseWrapper) -> list[Any]:
        """Return the values converted as the ORM converts them."""
        converted = list(values)
        for index, column, converters in self.converters(connection):
            for convert in converters:
                converted[index] = convert(converted[index], column, connection)
        for index in self.floats:  # SQLite's RETURNING gives a REAL's whole number as an int
            if converted[index] is not None:
                converted[index] = float(converted[index])
        return converted

    def converters(self, connection: BaseDatabaseWrapper) -> list[tuple[int, Any, list[Callable]]]:
        """Each column that needs converting: (its index, its expression, its converters).
        Kept per database vendor: they depend on the backend, not on the connection."""
        if connection.vendor not in self._converters:
            found = []
            for index, field in enumerate(self.fields):
                column = field.get_col(self.alias)
                ops = connection.ops
                converters = ops.get_db_converters(column) + field.get_db_converters(connection)
                if converters:
                    found.append((index, column, converters))
            self._converters[connection.vendor] = found
        return self._converters[connection.vendor]


def split(row: Sequence[Any], *parts: Columns) -> list[Sequence[Any]]:
    """Cut a row into the values of each part (a Columns), in order."""
    values: list[Sequence[Any]] = []
    start = 0
    for part in parts:
        values.append(row[start : start + len(part)])
        start += len(part)
    return values


def prepared_cursor(connection: BaseDatabaseWrapper) -> Any:
    """A cursor whose statements run as PostgreSQL prepared statements on this connection:
    parsed once, and planned once from their sixth run (PostgreSQL's generic plan), until a
    rollback on the connection (psycopg then deallocates them all). A claim's parsing and
    planning took 0.2 to 0.5 ms, its run 0.1 ms.

    Made and wrapped as Django makes its own: the connection's health check, its errors
    are Django's (a database that is down is a 503). Where statements are not prepared
    (SQLite; DATABASE_PREPARED_STATEMENTS=false), and while queries are logged (DEBUG, or
    a test counting them: the log shows a statement with its values only as Django binds
    it), this is connection.cursor().
    """
    prepared = connection.vendor == "postgresql" and settings.DEPLOYHUB_PREPARED_STATEMENTS
    if not prepared or connection.queries_logged:
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    return connection.make_cursor(_preparing_cursor()(connection.connection))


@functools.cache
def _preparing_cursor() -> type:
    """Django's cursor for server-side binding, whose statements psycopg prepares.

    Only while one of its statements runs does the connection prepare: Django's connections
    have no prepare_threshold, and with one psycopg would keep count of every other query
    too, keyed by its text (Django binds on the client, so a job's whole log is in its
    UPDATE's text: 20 MB a connection). Made here: psycopg is imported only where
    PostgreSQL is used.
    """
    from django.db.backends.postgresql import base

    # django-stubs leaves out this cursor's psycopg base class, which holds what it uses.
    server_binding_cursor: Any = base.ServerBindingCursor

    class PreparingCursor(server_binding_cursor):
        def execute(self, query: Any, params: Any = None, *, binary: bool | None = None) -> Any:
            self.connection.prepare_threshold = 0
            try:
                return super().execute(query, params, prepare=True, binary=binary)
            finally:
                self.connection.prepare_threshold = None

    return PreparingCursor
