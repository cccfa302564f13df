"""SQL building and table metadata for the apply path.

Rules of this file:
* :class:`Statements` is the connection's view every rule of the apply path
  is given: what it knows of a local table (:meth:`Statements.table`), the
  SQL it writes with, and the record of a bad operation.
* Statements are built once per table and shape of operation and cached
  until the schema changes (``PRAGMA schema_version``); the other rules
  cache theirs here too (:meth:`Statements.cached`), so they go with it.
* Identifiers always go through ``quote_ident``; values are always bound.
* A bad operation is recorded in ``fieldsync_apply_error``
  (:meth:`Statements.error`) and never stops the batch.
* The tables that follow their parent are read at each batch, and the
  connection's TEMP triggers for them made to match (route.install_apply_triggers).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Callable

from codec.ops import OpKind, Run

from ...apply.batch import Batch, Resolution
from ...apply.records import ApplyErrorRecord, apply_error_record, error_fields
from ...capture import Shape
from .._db import quote_ident
from ..capture import ShapeCache, trigger_names
from ..route import Follow, NO_PARENT, apply_triggers, follows, install_apply_triggers
from ..selection import renames


def refused_by_key(error: sqlite3.IntegrityError) -> bool:
    """Whether a write failed on a foreign key: SQLite's own check (a
    remote applies with foreign keys on) or the consolidated's check that a
    row that follows its parent names one (route.NO_PARENT)."""
    return (getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
            or str(error).startswith(NO_PARENT))


# Rows one INSERT statement of the fast path writes at most (driver._insert_rows).
MANY_ROWS = 100


def _insert_text(table: "SqliteTable", columns: tuple[str, ...], values: str, ignore: bool) -> str:
    """``INSERT INTO table (columns) VALUES values``, a row already there
    left as it is when ``ignore``: OR IGNORE where the table allows it
    (:attr:`SqliteTable.or_ignore`), else ON CONFLICT DO NOTHING."""
    names = ", ".join(quote_ident(column) for column in columns)
    return (f"INSERT{' OR IGNORE' if ignore and table.or_ignore else ''} INTO {table.quoted} ({names})"
            f" VALUES {values}" + (" ON CONFLICT DO NOTHING" if ignore and not table.or_ignore else ""))


class SqliteTable:
    """What the apply path needs to know about a local table (the shared
    rules read it as agent.site.apply.batch.Table)."""

    __slots__ = ("name", "quoted", "columns", "column_set", "key_columns", "where_key", "shape", "policy",
                 "or_ignore")

    def __init__(self, name: str, columns: tuple[str, ...], key_columns: tuple[str, ...], or_ignore: bool) -> None:
        self.name = name
        self.quoted = quote_ident(name)
        self.columns = columns
        self.column_set = frozenset(columns)
        self.key_columns = key_columns
        self.where_key = " AND ".join(f"{quote_ident(column)} IS ?" for column in key_columns)
        self.shape: Shape | None = None
        self.policy = Resolution.INCOMING
        # Whether the fast path may write with OR IGNORE (driver._flush_checked): a
        # statement's OR clause also governs the statements of the table's
        # triggers, so only where fieldsync's capture triggers are the only
        # ones (their insert cannot fail).
        self.or_ignore = or_ignore


class Statements:
    """Tables, SQL and apply errors, for the driver and every rule."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache) -> None:
        self._conn = conn
        self._shapes = shapes
        self._schema_version = -1
        self._tables: dict[str, SqliteTable | None] = {}
        self._sql: dict[tuple, str] = {}
        self._shape_ids: dict[str, tuple[int, ...]] = {}
        self.skips_capture = False  # a remote whose triggers skip the apply path's writes
        self._article_shapes: dict[str, int] = {}
        self._policies: dict[str, str] = {}
        self.follows: dict[str, Follow] = {}  # lower-case table -> how it follows its parent
        self._triggers: list[str] | None = None  # route.apply_triggers for self.follows

    def refresh(self) -> None:
        """Read the schema again when it changed, and the tables' shapes and
        conflict policies (once per batch)."""
        version = self._conn.execute("PRAGMA schema_version").fetchone()[0]
        if version != self._schema_version:
            self._schema_version = version
            self._tables.clear()
            self._sql.clear()
            self._shape_ids.clear()
            self._triggers = None
            self.skips_capture = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fieldsync_applying'").fetchone() is not None
        shapes = dict(self._conn.execute("SELECT lower(table_name), shape FROM fieldsync_article").fetchall())
        policies = dict(self._conn.execute("SELECT lower(table_name), policy FROM fieldsync_conflict_policy")
                        .fetchall())
        self._article_shapes = shapes
        self._policies = policies
        chains = follows(self._conn)
        if self._triggers is None or chains != self.follows:
            self.follows, self._triggers = chains, apply_triggers(self._conn, chains)
        install_apply_triggers(self._conn, self._triggers)
        for lowered, table in self._tables.items():
            if table is not None:
                self._attach(lowered, table)

    def published(self, lowered: str) -> bool:
        """Whether an article publishes the table (its lowered name) here."""
        return lowered in self._article_shapes

    def _attach(self, lowered: str, table: SqliteTable) -> None:
        shape_id = self._article_shapes.get(lowered)
        table.shape = None if shape_id is None else self._shapes.get(shape_id)
        table.policy = Resolution(self._policies.get(lowered, Resolution.INCOMING.value))

    def table(self, name: str) -> SqliteTable | None:
        """The local table ``name`` (any case), or None: no such table with a
        primary key, or one of fieldsync's or SQLite's own."""
        lowered = name.lower()
        try:
            return self._tables[lowered]
        except KeyError:
            pass
        table = None
        row = self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                                 (name,)).fetchone()
        if row is not None and not lowered.startswith(("fieldsync_", "sqlite_")):
            columns, keyed = [], []
            for _cid, column, _type, _notnull, _default, pk, hidden in self._conn.execute(
                    f"PRAGMA table_xinfo({quote_ident(row[0])})"):
                if not hidden:
                    columns.append(column)
                    if pk:
                        keyed.append((pk, column))
            if keyed:
                triggers = {name.lower() for (name,) in self._conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? COLLATE NOCASE",
                    (row[0],))}
                table = SqliteTable(row[0], tuple(columns), tuple(column for _, column in sorted(keyed)),
                               triggers <= {name.lower() for name in trigger_names(row[0])})
                self._attach(lowered, table)
        self._tables[lowered] = table
        return table

    def table_shapes(self, table: SqliteTable) -> tuple[int, ...]:
        """The shapes of ``table``'s capture rows, those logged under a name
        it had before a rename included."""
        lowered = table.name.lower()
        shapes = self._shape_ids.get(lowered)
        if shapes is None:
            names = [lowered, *(old for old, new in renames(self._conn).items() if new.lower() == lowered)]
            shapes = tuple(row[0] for row in self._conn.execute(
                f"SELECT id FROM fieldsync_shape WHERE lower(table_name) IN ({', '.join('?' * len(names))})"
                " ORDER BY id", names))
            self._shape_ids[lowered] = shapes
        return shapes

    def select(self, table: SqliteTable, key: tuple) -> dict | None:
        sql = self._sql.get(("select", table.name))
        if sql is None:
            columns = ", ".join(quote_ident(column) for column in table.columns)
            sql = f"SELECT {columns} FROM {table.quoted} WHERE {table.where_key}"
            self._sql[("select", table.name)] = sql
        try:
            row = self._conn.execute(sql, key).fetchone()
        except OverflowError:  # an integer beyond 64 bits: no row has that key
            return None
        return None if row is None else dict(zip(table.columns, row))

    def error(self, batch: Batch, op: object, problem: str) -> None:
        batch.errors += 1
        self._conn.execute(
            "INSERT INTO fieldsync_apply_error (at, peer, peer_commit, table_name, kind, key, operation, problem)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (batch.now, batch.peer, batch.commit, *error_fields(op), problem))

    def insert_sql(self, table: SqliteTable, columns: tuple[str, ...], ignore: bool) -> str:
        cache_key = ("insert", table.name, columns, ignore)
        sql = self._sql.get(cache_key)
        if sql is None:
            sql = self._sql[cache_key] = _insert_text(table, columns, f"({', '.join('?' * len(columns))})", ignore)
        return sql

    def insert_rows_sql(self, table: SqliteTable, columns: tuple[str, ...], skip: int, rows: int) -> str:
        """The fast path's INSERT (as :meth:`insert_sql` with ``ignore``) of
        ``rows`` rows in one statement: each row binds ``skip`` values first
        that the statement does not use (a run's key), then one a column."""
        cache_key = ("insert rows", table.name, columns, skip, rows)
        sql = self._sql.get(cache_key)
        if sql is None:
            width = skip + len(columns)
            values = ", ".join("(" + ", ".join(f"?{row * width + skip + index}" for index in range(1, len(columns) + 1))
                               + ")" for row in range(rows))
            sql = self._sql[cache_key] = _insert_text(table, columns, values, True)
        return sql

    def rows_per_insert(self, width: int) -> int:
        """Rows of ``width`` bound values one INSERT of :meth:`insert_rows_sql`
        takes: :data:`MANY_ROWS`, fewer where SQLite binds fewer values."""
        return min(MANY_ROWS, self._conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // max(width, 1))

    def update_sql(self, table: SqliteTable, after: tuple[str, ...], before: tuple[str, ...],
                    ignore: bool = False) -> str:
        cache_key = ("update", table.name, after, before, ignore)
        sql = self._sql.get(cache_key)
        if sql is None:
            assignments = ", ".join(f"{quote_ident(column)} = ?" for column in after)
            checks = "".join(f" AND {quote_ident(column)} IS ?" for column in before)
            sql = (f"UPDATE{' OR IGNORE' if ignore and table.or_ignore else ''} {table.quoted} SET {assignments}"
                   f" WHERE {table.where_key}{checks}")
            self._sql[cache_key] = sql
        return sql

    def run_sql(self, table: SqliteTable, run: Run, consolidated: bool) -> str:
        """The statement of the fast path (see driver._flush_checked) for a run's
        rows as they are: ``key ‖ before ‖ after`` bound as ``?1..?n`` (a
        DELETE binds the key alone; a remote's UPDATE leaves the before
        values unused, as the statement of an operation does)."""
        cache_key = ("run", table.name, run.kind, run.key_width, run.before, run.after, consolidated)
        sql = self._sql.get(cache_key)
        if sql is None:
            width, checked = run.key_width, len(run.before)
            where = " AND ".join(f"{quote_ident(column)} IS ?{index}"
                                 for index, column in enumerate(table.key_columns, 1))
            ignore = " OR IGNORE" if table.or_ignore else ""
            if run.kind == OpKind.INSERT:
                names = ", ".join(quote_ident(column) for column in run.after)
                values = ", ".join(f"?{index}" for index in range(width + 1, width + len(run.after) + 1))
                sql = (f"INSERT{ignore} INTO {table.quoted} ({names}) VALUES ({values})"
                       + ("" if table.or_ignore else " ON CONFLICT DO NOTHING"))
            elif run.kind == OpKind.UPDATE:
                assignments = ", ".join(f"{quote_ident(column)} = ?{index}"
                                        for index, column in enumerate(run.after, width + checked + 1))
                checks = "".join(f" AND {quote_ident(column)} IS ?{index}"
                                 for index, column in enumerate(run.before, width + 1)) if consolidated else ""
                sql = f"UPDATE{ignore} {table.quoted} SET {assignments} WHERE {where}{checks}"
            else:
                sql = self.delete_sql(table)
            self._sql[cache_key] = sql
        return sql

    def delete_sql(self, table: SqliteTable) -> str:
        cache_key = ("delete", table.name)
        sql = self._sql.get(cache_key)
        if sql is None:
            sql = f"DELETE FROM {table.quoted} WHERE {table.where_key}"
            self._sql[cache_key] = sql
        return sql

    def cached(self, cache_key: tuple, build: Callable[[], str]) -> str:
        """A statement of another rule, built by ``build`` once and dropped
        with the others when the schema changes."""
        sql = self._sql.get(cache_key)
        if sql is None:
            sql = self._sql[cache_key] = build()
        return sql


def list_apply_errors(conn: sqlite3.Connection, after_id: int = 0) -> tuple[ApplyErrorRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, kind, key, operation, problem, acknowledged_at"
                        " FROM fieldsync_apply_error WHERE id > ? ORDER BY id", (after_id,)).fetchall()
    return tuple(apply_error_record(row, datetime.fromisoformat(row[1]),
                                    None if row[9] is None else datetime.fromisoformat(row[9])) for row in rows)
