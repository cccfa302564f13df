"""What the apply path knows of the published tables of a PostgreSQL
consolidated, the SQL it writes with, and how a peer's values become
parameters.

Rules of this file:
* Only published tables take a peer's operations: an article's table, as
  its shape describes it (the columns, the key and their rows of the types
  table; the capture triggers capture that shape).  A table is named as
  readers name it (capture.shown_table), found in any case as on SQLite.
  They are read once per batch (:meth:`Tables.refresh`), with their
  conflict policies.
* A peer's value is converted by its column's row of the types table
  (typemap.dump: ValueNotConvertible names the column) and cast to the
  column's type *without* its modifier (``pg_catalog."varchar"``, not
  ``varchar(3)``): an explicit cast to ``varchar(3)`` or ``char(3)``
  would cut a longer text silently; so the column's own assignment rules
  apply (too long: refused), and keys and before-images compare exactly.
* A row is read as it travels: each column through its capture
  expression, then typemap's load, so a row here compares with a row of
  the peer's as the readers would send it.  Every row the apply reads is
  read ``FOR UPDATE`` (:meth:`PgTable.lock`): the compare and the write
  that follows never race an application's write of the row, and a row
  written back to the origin is read as it stays until the commit.
* Before-images compare in PostgreSQL's terms (``IS NOT DISTINCT FROM`` on
  the column's type; json, which has no equality, as its text), so
  ``'12.5'`` matches ``12.50`` and a remote's timestamp text in another
  form matches the same moment.
* Identifiers go through psycopg.sql; statements are built once per table
  and column list and kept until the table's description changes.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import psycopg
from psycopg import sql

from codec.ops import OpKind

from ...apply.batch import Resolution
from ...apply.reshape import column_moves, removed_tables
from ...capture import Shape
from ...change_rows import table_renames
from ..capture import PgShape, load_shapes, shown_table
from ..changes import history
from ..errors import ValueNotConvertible
from ..typemap import KINDS, Kind, dump

# The columns of each published table now: its article, shape and policy,
# and per column the type to cast to (its schema and name, no modifier).
_PUBLISHED = """
SELECT a.table_schema, a.table_name, a.shape, p.policy, c.attname, tn.nspname, t.typname
  FROM fieldsync.article a
  LEFT JOIN fieldsync.conflict_policy p ON p.table_schema = a.table_schema AND p.table_name = a.table_name
  LEFT JOIN pg_catalog.pg_attribute c
         ON c.attrelid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', a.table_schema, a.table_name))
        AND c.attnum > 0 AND NOT c.attisdropped
  LEFT JOIN pg_catalog.pg_type t ON t.oid = c.atttypid
  LEFT JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
 ORDER BY a.table_schema, a.table_name, c.attnum
"""


class PgTable:
    """A published table as the apply path uses it.  ``name``, ``columns``,
    ``column_set``, ``key_columns``, ``shape`` and ``policy`` are what the
    shared rules (agent/site/apply) read of a table."""

    __slots__ = ("name", "identifier", "columns", "column_set", "key_columns", "shape", "pg_shape", "policy",
                 "kinds", "casts", "_sql", "_load")

    def __init__(self, pg_shape: PgShape, casts: dict[str, sql.Composable], policy: Resolution) -> None:
        layout = pg_shape.layout
        self.name = layout.shown
        self.identifier = sql.Identifier(layout.schema, layout.table)
        self.columns = layout.columns
        self.column_set = frozenset(layout.columns)
        self.key_columns = layout.key_columns
        self.shape: Shape = pg_shape.shape
        self.pg_shape = pg_shape
        self.policy = policy
        self.kinds: dict[str, Kind] = {column: KINDS[kind] for column, kind in zip(layout.columns, layout.kinds)}
        self.casts = casts
        self._sql: dict[tuple, sql.Composed] = {}
        self._load = pg_shape.load

    # --- values -------------------------------------------------------------------

    def params(self, columns: Iterable[str], values: Iterable[Any]) -> list:
        """The parameters of ``values`` for ``columns`` (ValueNotConvertible)."""
        kinds = self.kinds
        return [dump(kinds[column], column, value) for column, value in zip(columns, values)]

    def _cast(self, column: str, value: sql.Composable | None = None) -> sql.Composable:
        """``value`` (a parameter by default) cast to ``column``'s type."""
        return sql.SQL("{}::{}").format(sql.Placeholder() if value is None else value, self.casts[column])

    def _capture(self, column: str, value: sql.Composable) -> sql.Composable:
        return sql.SQL(self.kinds[column].capture).format(value)

    def _where_key(self) -> sql.Composable:
        return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(column), self._cast(column))
                                     for column in self.key_columns)

    def _matches(self, column: str, name: sql.Composable | None = None, given: sql.Composable | None = None
                 ) -> sql.Composable:
        """Whether ``column`` (or ``name``, the column qualified) holds the
        value of a parameter (or of ``given``)."""
        name, value = name or sql.Identifier(column), self._cast(column, given)
        if self.kinds[column].name == "json":  # json has no equality: compare its text
            return sql.SQL("{}::pg_catalog.text IS NOT DISTINCT FROM ({})::pg_catalog.text").format(name, value)
        return sql.SQL("{} IS NOT DISTINCT FROM {}").format(name, value)

    def _cached(self, cache_key: tuple, build) -> sql.Composed:  # type: ignore[no-untyped-def]
        found = self._sql.get(cache_key)
        if found is None:
            found = self._sql[cache_key] = build()
        return found

    # --- statements ---------------------------------------------------------------

    def insert_sql(self, columns: tuple[str, ...]) -> sql.Composed:
        """INSERT of ``columns``; a row whose key is held is skipped (its
        count is 0), any other constraint raises."""
        return self._cached(("insert", columns), lambda: sql.SQL(
            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO NOTHING").format(
            self.identifier, sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(self._cast(column) for column in columns),
            sql.SQL(", ").join(map(sql.Identifier, self.key_columns))))

    def update_sql(self, after: tuple[str, ...], before: tuple[str, ...] = ()) -> sql.Composed:
        """UPDATE of ``after`` by key (parameters: after, key, before), only
        where the row holds the ``before`` values (the fast path's check;
        the row is locked as it is compared)."""
        def build() -> sql.Composed:
            checks = sql.SQL("").join(sql.SQL(" AND {}").format(self._matches(column)) for column in before)
            return sql.SQL("UPDATE {} SET {} WHERE {}{}").format(
                self.identifier, sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(column),
                                                                            self._cast(column)) for column in after),
                self._where_key(), checks)
        return self._cached(("update", after, before), build)

    def delete_sql(self) -> sql.Composed:
        return self._cached(("delete",), lambda: sql.SQL("DELETE FROM {} WHERE {}").format(
            self.identifier, self._where_key()))

    def many_sql(self, kind: int, after: tuple[str, ...], before: tuple[str, ...]) -> sql.Composed:
        """The statement of :meth:`insert_sql`, :meth:`update_sql` or
        :meth:`delete_sql` for many rows at once, one set-based statement.
        Its one parameter is a JSON array (:func:`many_params`) of the
        one-row statement's parameter lists, each value cast as the one-row
        statement casts it (a bytea one travels as hex).  The rows are taken
        in their order (WITH ORDINALITY); an UPDATE or DELETE returns the
        position of each row it wrote, in the order it wrote them, so the
        caller can check that each was written once and in order (the
        planner chooses the order of a join); an INSERT, whose rows come
        from a sorted SELECT, returns nothing.  An INSERT skips a held key
        as :meth:`insert_sql` does, an UPDATE compares the before-image as
        :meth:`update_sql` does."""
        def build() -> sql.Composed:
            if kind == OpKind.INSERT:
                columns = after
            elif kind == OpKind.UPDATE:
                columns = after + self.key_columns + before
            else:
                columns = self.key_columns
            given = [self._cast(column, sql.SQL(
                "pg_catalog.decode(given.r ->> {}, 'hex')" if self.kinds[column].name == "bytea"
                else "(given.r ->> {})").format(sql.Literal(position)))
                for position, column in enumerate(columns)]
            source = sql.SQL("pg_catalog.jsonb_array_elements({}::pg_catalog.jsonb) WITH ORDINALITY AS given (r, n)"
                             ).format(sql.Placeholder())
            if kind == OpKind.INSERT:
                return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY given.n"
                               " ON CONFLICT ({}) DO NOTHING").format(
                    self.identifier, sql.SQL(", ").join(map(sql.Identifier, columns)), sql.SQL(", ").join(given),
                    source, sql.SQL(", ").join(map(sql.Identifier, self.key_columns)))
            key_given = given[len(after):len(after) + len(self.key_columns)]
            conditions = [sql.SQL("target.{} = {}").format(sql.Identifier(column), value)
                          for column, value in zip(self.key_columns, key_given)]
            conditions += [self._matches(column, sql.SQL("target.{}").format(sql.Identifier(column)), value)
                           for column, value in zip(before, given[len(after) + len(self.key_columns):])]
            where = sql.SQL(" AND ").join(conditions)
            if kind == OpKind.DELETE:
                return sql.SQL("DELETE FROM {} AS target USING {} WHERE {} RETURNING given.n").format(
                    self.identifier, source, where)
            return sql.SQL("UPDATE {} AS target SET {} FROM {} WHERE {} RETURNING given.n").format(
                self.identifier, sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(column), value)
                                                    for column, value in zip(after, given)), source, where)
        return self._cached(("many", kind, after, before), build)

    def _lock_sql(self, before: tuple[str, ...]) -> sql.Composed:
        def build() -> sql.Composed:
            images = sql.SQL(", ").join(self._capture(column, sql.Identifier(column)) for column in self.columns)
            match = sql.SQL(" AND ").join(self._matches(column) for column in before) if before else sql.SQL("true")
            return sql.SQL("SELECT ARRAY[{}], {} FROM {} WHERE {} FOR UPDATE").format(
                images, match, self.identifier, self._where_key())
        return self._cached(("lock", before), build)

    # --- reading rows -------------------------------------------------------------

    def lock(self, conn: psycopg.Connection, key: tuple, before: dict | None = None) -> tuple[dict, bool] | None:
        """The row under ``key`` as it travels, locked (FOR UPDATE: an
        application's write of it waits for this transaction), and whether
        it holds ``before``'s values; None: no row there.  Raises
        ValueNotConvertible, or psycopg's DataError for a value PostgreSQL
        cannot read as the column's type."""
        before = before or {}
        # The before-image's values come first: they are compared in the select list.
        params = [*self.params(before, before.values()), *self.params(self.key_columns, key)]
        found = conn.execute(self._lock_sql(tuple(before)), params).fetchone()
        if found is None:
            return None
        return dict(zip(self.columns, self._load(found[0]))), bool(found[1])

    def lock_many(self, conn: psycopg.Connection, keys: list[tuple]) -> dict[int, dict]:
        """The rows under ``keys`` as they travel, locked, by the index of
        their key in ``keys`` (a key that holds no row is not there).
        Raises ValueNotConvertible or psycopg's DataError as :meth:`lock`."""
        columns = self.key_columns
        params = [self.params((column,) * len(keys), [key[position] for key in keys])
                  for position, column in enumerate(columns)]

        def build() -> sql.Composed:
            names = [sql.Identifier(f"k{position}") for position in range(len(columns))]
            images = sql.SQL(", ").join(self._capture(column, sql.SQL("target.{}").format(sql.Identifier(column)))
                                        for column in self.columns)
            return sql.SQL("SELECT given.position, ARRAY[{}] FROM pg_catalog.unnest({}) WITH ORDINALITY AS given ({},"
                           " position) JOIN {} AS target ON {} FOR UPDATE OF target").format(
                images, sql.SQL(", ").join(sql.SQL("{}::{}[]").format(sql.Placeholder(), self.casts[column])
                                           for column in columns),
                sql.SQL(", ").join(names), self.identifier,
                sql.SQL(" AND ").join(sql.SQL("target.{} = given.{}").format(sql.Identifier(column), name)
                                      for column, name in zip(columns, names)))
        load = self._load
        return {position - 1: dict(zip(self.columns, load(texts)))
                for position, texts in conn.execute(self._cached(("lock many",), build), params)}

    def capture_row_sql(self, images: int) -> sql.Composed:
        """INSERT of a capture row of this table's shape from values as they
        travel (parameters: kind, flags, then ``images`` rows of values),
        each made capture text as the triggers make it; returns its txid
        and seq."""
        def build() -> sql.Composed:
            texts = sql.SQL(", ").join(self._capture(column, sql.SQL("({})").format(self._cast(column)))
                                       for _ in range(images) for column in self.columns)
            return sql.SQL("INSERT INTO fieldsync.capture (shape, kind, flags, v) VALUES ({}, %s, %s, ARRAY[{}]"
                           "::pg_catalog.text[]) RETURNING txid, seq").format(sql.Literal(self.pg_shape.id), texts)
        return self._cached(("capture row", images), build)

    def capture_texts(self, column: str) -> sql.Composed:
        """A query of the capture texts of the values in ``%s`` (a text
        array of parameters for ``column``), in their order."""
        return self._cached(("texts", column), lambda: sql.SQL(
            "SELECT {} FROM pg_catalog.unnest({}::pg_catalog.text[]) WITH ORDINALITY AS given (value, position)"
            " ORDER BY position").format(
            self._capture(column, sql.SQL("given.value::{}").format(self.casts[column])), sql.Placeholder()))


def many_params(params: list[list]) -> str:
    """The parameter of a :meth:`PgTable.many_sql` statement: the one-row
    statement's parameter lists (text, None, or bytes for a bytea column)
    as one JSON array, bytes as hex."""
    return json.dumps(params, ensure_ascii=False, default=bytes.hex)


class Tables:
    """The published tables, read again at each batch."""

    def __init__(self) -> None:
        self._shapes: dict[int, PgShape] = {}
        self._tables: dict[str, PgTable] = {}
        self._seen: dict[str, tuple] = {}
        self._changes = 0  # schema changes read into _moves
        self._moves: dict[str, list[list]] = {}
        self._renames: dict[str, str] = {}  # old name (lowered) -> name now (change_rows.table_renames)
        self._removed: frozenset[str] = frozenset()  # tables whose articles a change removed (apply.reshape)
        self._articled: set[str] = set()  # the tables an article publishes now (lowered)

    @property
    def shapes(self) -> dict[int, PgShape]:
        """Every shape read so far, by id (capture rows name them)."""
        return self._shapes

    def shape(self, conn: psycopg.Connection, shape_id: int) -> PgShape:
        found = self._shapes.get(shape_id)
        if found is None:
            self._shapes.update(load_shapes(conn))
            found = self._shapes[shape_id]
        return found

    def refresh(self, conn: psycopg.Connection) -> None:
        """Read the published tables, their columns' types and conflict
        policies again (once per batch); a table whose description is
        unchanged keeps its statements."""
        described: dict[str, tuple[str, str, int, str | None, dict[str, sql.Composable]]] = {}
        for schema, table, shape_id, policy, column, type_schema, type_name in conn.execute(_PUBLISHED):
            entry = described.setdefault(shown_table(schema, table), (schema, table, shape_id, policy, {}))
            if column is not None:
                entry[4][column] = sql.Identifier(type_schema, type_name)
        tables: dict[str, PgTable] = {}
        seen: dict[str, tuple] = {}
        for shown, (schema, table, shape_id, policy, casts) in described.items():
            pg_shape = self.shape(conn, shape_id)
            if not set(pg_shape.layout.columns) <= set(casts):
                continue  # gone, or altered since it was published: publish it again
            signature = (shape_id, policy, tuple((column, casts[column].as_string(conn))
                                                 for column in pg_shape.layout.columns))
            kept = self._tables.get(shown.lower())
            if kept is not None and self._seen.get(shown.lower()) == signature:
                tables[shown.lower()] = kept
            else:
                tables[shown.lower()] = PgTable(pg_shape, {column: casts[column] for column in pg_shape.layout.columns},
                                                Resolution(policy or Resolution.INCOMING.value))
            seen[shown.lower()] = signature
        self._tables, self._seen, self._articled = tables, seen, {shown.lower() for shown in described}
        (changes,) = conn.execute("SELECT count(*) FROM fieldsync.schema_change").fetchone()
        if changes != self._changes:  # changes are only ever added
            steps = history(conn)
            self._changes, self._moves, self._renames = changes, column_moves(steps), table_renames(steps)
            self._removed = removed_tables(steps)

    def moves(self, table: PgTable) -> list[list]:
        """The columns of ``table`` renamed and dropped by schema changes, in
        order (agent.site.apply.reshape)."""
        return self._moves.get(table.name.lower(), [])

    def table(self, name: object) -> PgTable | None:
        """The published table ``name`` names (any case; a name it had before
        a rename too: rows a remote logged before it applied the rename), or
        None."""
        if type(name) is not str:
            return None
        found = self._tables.get(name.lower())
        if found is None and self._renames:
            now = self._renames.get(name.lower())
            found = None if now is None else self._tables.get(now.lower())
        return found

    def removed(self, name: str) -> bool:
        """Whether ``name`` names a table whose article was removed where
        remotes held it, and that no article publishes now: a remote's
        operations on it are dropped (agent.site.apply.reshape)."""
        lowered = self._renames.get(name.lower(), name).lower()
        return lowered in self._removed and lowered not in self._articled

    def published(self) -> Iterable[PgTable]:
        return self._tables.values()


def unconvertible(error: ValueNotConvertible | psycopg.Error) -> str:
    """An apply error's problem for a value PostgreSQL cannot take."""
    return f"value not convertible: {first_line(error)}"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
