"""Change capture on PostgreSQL: table descriptions, shapes and triggers.

Rules of this file:
* A published table gets three ``AFTER ... FOR EACH ROW`` triggers, one
  function each, that run one ``INSERT INTO fieldsync.capture`` of the
  whole row images: INSERT the new row, DELETE the old row, UPDATE the old
  row then the new row, every column as typemap.py's capture text.  No
  lookup, no branch: deciding what changed and who receives it is left to
  the readers (agent.site.view, agent.site.selection), as on SQLite.  The
  one look-up is a follow article's route (route.py, ``CaptureRoute``),
  stored after the widest image.
* Row triggers, never statement triggers with transition tables: the
  capture rows of one transaction must be in the order its row changes
  happened (an application trigger may change a row its statement just
  inserted), and ``seq`` must be taken after the row's lock (log.py).
  Their name sorts before ordinary names (``0fieldsync_...``), so they
  fire before an application's AFTER triggers on the same table.
* The trigger functions are SECURITY DEFINER, owned by the agent's role:
  applications need no grant on the ``fieldsync`` schema and cannot write
  capture rows of their own.  Every name in them is schema-qualified, so a
  caller's ``search_path`` cannot change what they run.
* A BEFORE TRUNCATE statement trigger refuses TRUNCATE (schema.py).
* A *shape* fixes a table's column order, key and types; capture rows name
  it.  Shapes are never changed or deleted; an equal shape is reused.
* Functions here that take ``target`` open their own transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable

import psycopg
from psycopg import sql

from ..capture import KIND_DELETE, KIND_INSERT, KIND_UPDATE, Shape
from ..errors import UnpublishableTable
from .connect import translate
from .schema import SCHEMA, shape_indexes
from .typemap import KINDS, BaseType, Kind, column_kind, loader
from .uri import PgTarget

TRIGGER_PREFIX = "0fieldsync_"
TRUNCATE_TRIGGER = "0fieldsync_truncate"
_EVENTS = ((KIND_INSERT, "INSERT", "ins", ("NEW",)), (KIND_UPDATE, "UPDATE", "upd", ("OLD", "NEW")),
           (KIND_DELETE, "DELETE", "del", ("OLD",)))
_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast", SCHEMA)
_RELATION_KINDS = {"v": "a view", "m": "a materialized view", "f": "a foreign table",
                   "p": "a partitioned table (not supported yet)",
                   "S": "a sequence", "i": "an index", "c": "a composite type"}

_TABLE = """
SELECT c.oid, n.nspname, c.relname, c.relkind, c.relpersistence
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = to_regclass(%s)
"""
# Columns in table order (generated ones are computed at every site), each
# with its base type: a domain is followed down to the type it is made of.
_COLUMNS = """
WITH RECURSIVE chain (attnum, type_oid, depth) AS (
    SELECT a.attnum, a.atttypid, 0 FROM pg_attribute a
     WHERE a.attrelid = %(table)s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
    UNION ALL
    SELECT chain.attnum, t.typbasetype, chain.depth + 1
      FROM chain JOIN pg_type t ON t.oid = chain.type_oid WHERE t.typtype = 'd'
)
SELECT a.attname, format_type(a.atttypid, a.atttypmod), bn.nspname, b.typname, b.typtype, b.typcategory
  FROM pg_attribute a
  JOIN LATERAL (SELECT type_oid FROM chain WHERE chain.attnum = a.attnum ORDER BY depth DESC LIMIT 1) base
       ON true
  JOIN pg_type b ON b.oid = base.type_oid
  JOIN pg_namespace bn ON bn.oid = b.typnamespace
 WHERE a.attrelid = %(table)s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY a.attnum
"""
_KEY = """
SELECT a.attname
  FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k (attnum, position)
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
 WHERE i.indrelid = %s AND i.indisprimary
 ORDER BY k.position
"""


def shown_table(schema: str, table: str) -> str:
    """The name readers and messages use: plain in ``public``, else qualified."""
    return table if schema == "public" else f"{schema}.{table}"


@dataclass(frozen=True, slots=True)
class Layout:
    """What a table's capture rows hold: its columns in table order, its key
    columns in key order, and per column its row of the types table
    (typemap.KINDS) and its declared type (``format_type``, what incoming
    values are cast to)."""

    schema: str
    table: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    kinds: tuple[str, ...]
    declared: tuple[str, ...]
    # A follow article's: the kind of the route its capture rows carry after
    # the widest image (route.py); None for every other table.
    route_kind: str | None = None

    def __post_init__(self) -> None:
        shown = shown_table(self.schema, self.table)
        if not (len(self.columns) == len(self.kinds) == len(self.declared)):
            raise ValueError(f"layout of {shown}: columns, kinds and declared types differ in number")
        if self.route_kind is not None and self.route_kind not in KINDS:
            raise ValueError(f"layout of {shown}: unknown route kind {self.route_kind!r}")
        if not self.key_columns or not set(self.key_columns) <= set(self.columns):
            raise ValueError(f"layout of {shown}: key columns {self.key_columns} are not among its columns")
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"layout of {shown}: unknown column kinds {sorted(unknown)}")

    @property
    def shown(self) -> str:
        return shown_table(self.schema, self.table)


@dataclass(frozen=True, slots=True)
class TableDescription:
    """A published table as the catalogue describes it now."""

    oid: int
    layout: Layout

    @property
    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.layout.schema, self.layout.table)


@dataclass(frozen=True)  # not slotted: the readers' forms below are cached on it
class PgShape:
    """A layout captured under an id (one row of ``fieldsync.shape``)."""

    id: int
    layout: Layout

    @cached_property
    def shape(self) -> Shape:
        """The shape as the SQLite readers know it (agent.site.view)."""
        layout = self.layout
        return Shape(self.id, layout.shown, layout.columns, layout.key_columns)

    @cached_property
    def load(self) -> Callable[[list], tuple]:
        """Capture texts (one image, or an UPDATE's two) to travelling values."""
        route = None if self.layout.route_kind is None else KINDS[self.layout.route_kind]
        # A follow article's rows carry their routes after the widest image
        # (the old one, then an UPDATE's new one), each as its root column travels.
        return loader(tuple(KINDS[kind] for kind in self.layout.kinds), route)


def describe_table(conn: psycopg.Connection, table: str) -> TableDescription:
    """Describe ``table`` (``name`` or ``schema.name``, resolved by
    ``search_path``) for publishing, or raise UnpublishableTable (its
    UnsupportedColumnType for a column type outside the types table)."""
    if type(table) is not str or not table:
        raise UnpublishableTable(f"table name must be a non-empty string, got {table!r}")
    found = conn.execute(_TABLE, (table,)).fetchone()
    if found is None:
        raise UnpublishableTable(f"table {table!r} does not exist in this database (or is not on the "
                                 "search_path); create it before publishing")
    oid, schema, name, relkind, persistence = found
    shown = shown_table(schema, name)
    if schema in _SYSTEM_SCHEMAS or schema.startswith("pg_"):
        raise UnpublishableTable(f"{shown!r} belongs to PostgreSQL or fieldsync and cannot be published")
    if relkind != "r":
        raise UnpublishableTable(f"{shown!r} is {_RELATION_KINDS.get(relkind, 'not a table')}; only ordinary "
                                 "tables can be published")
    if persistence == "t":
        raise UnpublishableTable(f"{shown!r} is a temporary table; it cannot be published")
    columns, kinds, declared = [], [], []
    for column, declared_type, type_schema, type_name, typtype, category in conn.execute(_COLUMNS, {"table": oid}):
        kind: Kind = column_kind(shown, column, BaseType(type_schema, type_name, typtype, category, declared_type))
        columns.append(column)
        kinds.append(kind.name)
        declared.append(declared_type)
    key = tuple(column for (column,) in conn.execute(_KEY, (oid,)))
    if not key:
        raise UnpublishableTable(
            f"table {shown!r} has no primary key: rows without a key cannot be matched at other sites and the "
            "copies drift apart; add a PRIMARY KEY and publish it again")
    return TableDescription(oid, Layout(schema, name, tuple(columns), key, tuple(kinds), tuple(declared)))


def _shape_from_row(row: tuple) -> PgShape:
    shape_id, schema, table, *lists, route_kind = row
    return PgShape(shape_id, Layout(schema, table, *map(tuple, lists), route_kind))


_SHAPE_COLUMNS = "id, table_schema, table_name, columns, key_columns, kinds, declared, route_kind"


def load_shapes(conn: psycopg.Connection) -> dict[int, PgShape]:
    """Every shape of the site, by id."""
    return {row[0]: _shape_from_row(row)
            for row in conn.execute(f"SELECT {_SHAPE_COLUMNS} FROM fieldsync.shape ORDER BY id")}


def _shape_for(conn: psycopg.Connection, table: TableDescription) -> PgShape:
    """The table's shape: the latest one if it still describes the table,
    else a new one.  Caller holds a transaction."""
    layout = table.layout
    found = conn.execute(f"SELECT {_SHAPE_COLUMNS} FROM fieldsync.shape WHERE table_schema = %s"
                         " AND table_name = %s ORDER BY id DESC LIMIT 1", (layout.schema, layout.table)).fetchone()
    if found is not None and _shape_from_row(found).layout == layout:
        return _shape_from_row(found)
    made = conn.execute(
        f"INSERT INTO fieldsync.shape (table_schema, table_name, columns, key_columns, kinds, declared, route_kind)"
        f" VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {_SHAPE_COLUMNS}",
        (layout.schema, layout.table, *(json.dumps(values) for values in (
            layout.columns, layout.key_columns, layout.kinds, layout.declared)), layout.route_kind)).fetchone()
    assert made is not None
    shape = _shape_from_row(made)
    conn.execute(shape_indexes(shape.id, len(layout.columns), shape.shape.key_positions))
    return shape


@dataclass(frozen=True, slots=True)
class CaptureRoute:
    """How a follow article's capture triggers find a row's routes
    (route.py makes it): the route's kind (a row of the types table),
    PL/pgSQL declarations, the statements that set ``fieldsync_route_old``
    from OLD and ``fieldsync_route_new`` from NEW (as capture text), and
    the condition under which an UPDATE's two are one (its foreign key
    unchanged)."""

    kind: str
    declarations: str
    old: str
    new: str
    same: str


def _function_name(shape: PgShape, suffix: str) -> sql.Identifier:
    return sql.Identifier(SCHEMA, f"capture_{shape.id}_{suffix}")


def _function(conn: psycopg.Connection, shape: PgShape, kind: int, suffix: str, images: tuple[str, ...],
              route: CaptureRoute | None = None) -> sql.Composed:
    """The trigger function of one event: one INSERT of the row images
    (for a follow article, after the look-up of their routes)."""
    values = sql.SQL(", ").join(
        sql.SQL(KINDS[column_kind].capture).format(sql.SQL("{}.{}").format(sql.SQL(image), sql.Identifier(column)))
        for image in images for column, column_kind in zip(shape.layout.columns, shape.layout.kinds))
    body = sql.SQL("BEGIN\n    INSERT INTO fieldsync.capture (shape, kind, v) VALUES ({}, {}, ARRAY[{}]);\n"
                   "    RETURN NULL;\nEND").format(sql.Literal(shape.id), sql.Literal(kind), values)
    if route is not None:
        # The routes after the widest image (an INSERT's or a DELETE's second
        # image is NULL): the old one, then an UPDATE's new one.
        padding = [sql.SQL("NULL")] * (len(shape.layout.columns) * (2 - len(images)))
        lookups = {KIND_INSERT: route.new, KIND_DELETE: route.old,
                   KIND_UPDATE: f"{route.new}\n    IF {route.same} THEN\n        fieldsync_route_old :="
                                f" fieldsync_route_new;\n    ELSE\n    {route.old}\n    END IF;"}[kind]
        routes = {KIND_INSERT: "fieldsync_route_new", KIND_DELETE: "fieldsync_route_old",
                  KIND_UPDATE: "fieldsync_route_old, fieldsync_route_new"}[kind]
        body = sql.SQL("DECLARE\n    fieldsync_route_old text;\n    fieldsync_route_new text;\n    {}\nBEGIN\n    {}\n"
                       "    INSERT INTO fieldsync.capture (shape, kind, v) VALUES ({}, {}, ARRAY[{}, {}]);\n"
                       "    RETURN NULL;\nEND").format(
            sql.SQL(route.declarations), sql.SQL(lookups), sql.Literal(shape.id), sql.Literal(kind),
            sql.SQL(", ").join([values, *padding]), sql.SQL(routes))
    return sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS {}").format(
        _function_name(shape, suffix), sql.Literal(body.as_string(conn)))


def _drop_triggers(conn: psycopg.Connection, oid: int, identifier: sql.Identifier) -> None:
    for name in [name for (name,) in conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal AND tgname LIKE %s",
            (oid, TRIGGER_PREFIX + "%"))]:
        conn.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(name), identifier))


def install_capture(conn: psycopg.Connection, target: PgTarget, table: str, route: CaptureRoute | None = None
                    ) -> PgShape:
    """Capture ``table``'s changes from now on (its current shape); refuse
    TRUNCATE of it.  Safe to call again: the triggers are made anew, with a
    new shape if the table's definition changed.  ``route``: the table
    follows its parent, and its rows carry their routes (route.py)."""
    try:
        with conn.transaction():
            description = describe_table(conn, table)
            if route is not None:
                description = TableDescription(description.oid, replace(description.layout, route_kind=route.kind))
            shape = _shape_for(conn, description)
            _drop_triggers(conn, description.oid, description.identifier)
            for kind, event, suffix, images in _EVENTS:
                conn.execute(_function(conn, shape, kind, suffix, images, route))
                conn.execute(sql.SQL("CREATE TRIGGER {} AFTER {} ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
                    sql.Identifier(TRIGGER_PREFIX + suffix), sql.SQL(event), description.identifier,
                    _function_name(shape, suffix)))
            conn.execute(sql.SQL("CREATE TRIGGER {} BEFORE TRUNCATE ON {} FOR EACH STATEMENT"
                                 " EXECUTE FUNCTION fieldsync.refuse_truncate()").format(
                sql.Identifier(TRUNCATE_TRIGGER), description.identifier))
            return shape
    except psycopg.Error as error:
        raise translate(error, target, f"installing the capture triggers of {table}") from None


def drop_capture(conn: psycopg.Connection, target: PgTarget, table: str) -> None:
    """Stop capturing ``table`` (its shapes and capture rows stay)."""
    try:
        with conn.transaction():
            description = describe_table(conn, table)
            _drop_triggers(conn, description.oid, description.identifier)
    except psycopg.Error as error:
        raise translate(error, target, f"removing the capture triggers of {table}") from None


def drop_capture_of(conn: psycopg.Connection, target: PgTarget, oid: int) -> None:
    """Stop capturing the table ``oid`` whatever it is named now, and
    whatever it has become (a table that lost its key, say); nothing when
    it is gone (its triggers went with it)."""
    try:
        with conn.transaction():
            found = conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n"
                                 " ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,)).fetchone()
            if found is not None:
                _drop_triggers(conn, oid, sql.Identifier(*found))
    except psycopg.Error as error:
        raise translate(error, target, f"removing the capture triggers of the table with oid {oid}") from None


def set_origin(conn: psycopg.Connection, origin: str | None) -> None:
    """Mark the writes of the current transaction as coming from peer
    ``origin`` (None: this site's own), as the apply path does; the setting
    ends with the transaction."""
    conn.execute("SELECT pg_catalog.set_config('fieldsync.origin', %s, true)", (origin or "",))


def list_written_back(conn: psycopg.Connection, peer: str) -> None:
    """List in ``fieldsync.returned`` every capture row the current
    transaction wrote with ``peer`` as their origin (:func:`set_origin`),
    as rows written back to it whole (no columns listed): what a
    subscription change or a table published for its subscribers writes
    (resubscribe.py, new_tables.py).  The unconfirmed rule finds them there
    (apply/lookups.any_unconfirmed)."""
    conn.execute("INSERT INTO fieldsync.returned (seq, txid, peer, columns) SELECT seq, txid, %s, '[]'"
                 " FROM fieldsync.capture WHERE txid = pg_catalog.pg_current_xact_id() AND origin = %s", (peer, peer))
