"""Change capture in a SQLite site: table metadata, capture shapes and
triggers (what a capture row is: agent/site/capture.py).

Rules of this file:
* Capture is done by three ``AFTER`` row triggers per published table that
  each run one ``INSERT INTO fieldsync_capture`` of plain column references.
  No function calls, no lookups: the application pays one extra row insert
  per changed row and nothing else; at the consolidated, a table that
  follows its parent also looks up each row's route (agent/site/sqlite/route.py).
* A trigger records whole row images: INSERT the new row, DELETE the old
  row, UPDATE the old row then the new row.  Deciding which columns
  changed, which subscriber sees the row and the origin of the change is
  done when the log is read or written, not in the trigger.
* A shape (agent.site.capture.Shape) is written to ``fieldsync_shape``
  once, never modified or deleted; :class:`ShapeCache` reads them.
* At the consolidated each shape has two partial indexes on the capture
  table by key (see key_indexes), kept by SQLite as the triggers insert:
  the unconfirmed rule looks rows up by key with them.
* The capture table's value columns (``v0``, ``v1``, ...) are named and
  added here (value_column, ensure_capture_width), with no declared type;
  schema.py creates the table with the first of them and upgrades older
  layouts with this module's help, never the other way round.
* Functions here expect the caller to hold a write transaction.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass

from ..capture import KIND_DELETE, KIND_INSERT, KIND_UPDATE, Shape
from ..errors import UnpublishableTable
from ._db import quote_ident
from .route import Follow, MOVE_PREFIX, follows, move_statements, row_routes, trigger_routes

#: Every table, index and trigger fieldsync makes is named ``fieldsync_*``.
PREFIX = "fieldsync_"

# At a remote, holds a row while the apply path writes, inside the apply's
# transaction (never committed so): the capture triggers skip those writes
# (see install_capture).  Created with the remote's first capture triggers.
APPLYING_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync_applying (\n"
                  "    id INTEGER PRIMARY KEY CHECK (id = 1)\n)")

_TRIGGER_EVENTS = (("ins", "INSERT"), ("upd", "UPDATE"), ("del", "DELETE"))


@dataclass(frozen=True, slots=True)
class TableInfo:
    """An application table as SQLite describes it now."""

    name: str                       # as spelled in sqlite_master
    columns: tuple[str, ...]        # stored columns (generated ones excluded), table order
    key_columns: tuple[str, ...]    # primary-key columns, key order
    sql: str
    without_rowid: bool


_WITHOUT_ROWID = re.compile(r"\)\s*(?:STRICT\s*,\s*)?WITHOUT\s+ROWID\s*(?:,\s*STRICT\s*)?$", re.IGNORECASE)


def declared_type(conn: sqlite3.Connection, table: str, column: str) -> str | None:
    """The type ``table.column`` declares ("" for none; None: no such column)."""
    for row in conn.execute(f"PRAGMA table_info({quote_ident(table)})"):
        if row[1].lower() == column.lower():
            return row[2] or ""
    return None


def table_info(conn: sqlite3.Connection, table: str) -> TableInfo:
    """Describe ``table`` for publishing; raise UnpublishableTable when it
    cannot be replicated."""
    if type(table) is not str or not table:
        raise UnpublishableTable(f"table name must be a non-empty string, got {table!r}")
    row = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name = ? COLLATE NOCASE"
                       " AND type IN ('table', 'view')", (table,)).fetchone()
    if row is None:
        raise UnpublishableTable(f"table {table!r} does not exist in this database; create it before publishing")
    kind, name, sql = row
    if kind == "view":
        raise UnpublishableTable(f"{name!r} is a view; only tables can be published")
    if name.lower().startswith(PREFIX) or name.lower().startswith("sqlite_"):
        raise UnpublishableTable(f"{name!r} belongs to fieldsync or SQLite and cannot be published")
    if sql is None or sql.lstrip().upper().startswith("CREATE VIRTUAL"):
        raise UnpublishableTable(f"{name!r} is a virtual table; only ordinary tables can be published")
    columns: list[str] = []
    keyed: list[tuple[int, str]] = []
    for _cid, column, _type, _notnull, _default, pk, hidden in conn.execute(
            f"PRAGMA table_xinfo({quote_ident(name)})"):
        if hidden:
            continue  # generated columns are recomputed at every site
        columns.append(column)
        if pk:
            keyed.append((pk, column))
    if not keyed:
        raise UnpublishableTable(
            f"table {name!r} has no primary key: rows without a key cannot be matched at other sites and the "
            "copies drift apart; add a PRIMARY KEY and publish it again")
    return TableInfo(name, tuple(columns), tuple(column for _, column in sorted(keyed)), sql,
                     bool(_WITHOUT_ROWID.search(sql.strip())))


@dataclass(frozen=True, slots=True)
class KeyIndex:
    """A partial index on the capture table: the rows in ``where`` by the key
    held in value ``columns`` (key order).  A query uses it when its WHERE
    holds ``where`` as written and compares each column with ``IS``."""

    name: str
    columns: tuple[str, ...]
    where: str


def key_indexes(shape: Shape) -> tuple[KeyIndex, KeyIndex]:
    """The indexes of ``shape``'s capture rows by key: every row by its old
    key (the new row's key for an INSERT), and the UPDATEs that changed the
    key by their new key (few, so that index costs next to nothing)."""
    width = len(shape.columns)
    old = tuple(value_column(position) for position in shape.key_positions)
    new = tuple(value_column(width + position) for position in shape.key_positions)
    changed = " OR ".join(f"{after} IS NOT {before}" for after, before in zip(new, old))
    return (KeyIndex(f"{PREFIX}capture_key_{shape.id}", old, f"shape = {shape.id}"),
            KeyIndex(f"{PREFIX}capture_moved_{shape.id}", new,
                     f"shape = {shape.id} AND kind = {KIND_UPDATE} AND ({changed})"))


def install_key_indexes(conn: sqlite3.Connection, shape: Shape) -> None:
    for index in key_indexes(shape):
        conn.execute(f"CREATE INDEX IF NOT EXISTS {index.name} ON fieldsync_capture ({', '.join(index.columns)})"
                     f" WHERE {index.where}")


def value_column(index: int) -> str:
    """The name of the capture table's value column ``index`` (v0, v1, ...)."""
    return f"v{index}"


def capture_width(conn: sqlite3.Connection) -> int:
    """How many value columns the capture table has."""
    names = [row[1] for row in conn.execute("PRAGMA table_info(fieldsync_capture)")]
    return sum(1 for column in names if column.startswith("v") and column[1:].isdigit())


def ensure_capture_width(conn: sqlite3.Connection, needed: int) -> None:
    """Widen the capture table to ``needed`` value columns (inside a write
    transaction).  ADD COLUMN only touches the schema, not the rows, and
    declares no type, so a value keeps the type the application gave it."""
    width = capture_width(conn)
    for index in range(width, needed):
        conn.execute(f"ALTER TABLE fieldsync_capture ADD COLUMN {quote_ident(value_column(index))}")


def trigger_names(table: str) -> list[str]:
    return [f"{PREFIX}{suffix}_{table}" for suffix, _ in _TRIGGER_EVENTS]


def install_capture(conn: sqlite3.Connection, info: TableInfo, follow: Follow | None = None) -> int:
    """Create a shape for ``info`` and (re)create its capture triggers.
    Returns the shape id.  ``follow``: the table follows its parent (else
    the catalogue says whether it does); at the consolidated its rows then
    carry their routes (agent/site/sqlite/route.py)."""
    cursor = conn.execute(
        "INSERT INTO fieldsync_shape (table_name, columns, key_columns, table_sql) VALUES (?, ?, ?, ?)",
        (info.name, json.dumps(info.columns), json.dumps(info.key_columns), info.sql))
    shape = cursor.lastrowid
    width = len(info.columns)
    ensure_capture_width(conn, 2 * width)
    drop_capture(conn, info.name)
    table = quote_ident(info.name)
    old = [f"OLD.{quote_ident(column)}" for column in info.columns]
    new = [f"NEW.{quote_ident(column)}" for column in info.columns]
    targets = {
        "INSERT": (KIND_INSERT, new),
        "UPDATE": (KIND_UPDATE, old + new),
        "DELETE": (KIND_DELETE, old),
    }
    # A remote's only peer, the consolidated, never gets its own changes back,
    # so at a remote the writes of the apply path are not captured (their
    # capture rows would only be written and truncated; skipping them makes
    # applying a third faster).  The apply path marks its writes with a row
    # in fieldsync_applying, inside its own transaction.
    when = ""
    routed: dict[str, list[int]] = {}
    if conn.execute("SELECT role FROM fieldsync_site WHERE id = 1").fetchone()[0] == "remote":
        conn.execute(APPLYING_TABLE)
        when = " WHEN NOT EXISTS (SELECT 1 FROM fieldsync_applying)"
    else:
        install_key_indexes(conn, Shape(shape, info.name, info.columns, info.key_columns))  # type: ignore[arg-type]
        follow = follow or follows(conn).get(info.name.lower())
        if follow is not None:
            # The old route after the widest image, the new one after it.
            ensure_capture_width(conn, 2 * width + 2)
            old_route, new_route = trigger_routes(follow)
            targets = {"INSERT": (KIND_INSERT, new + [new_route]), "UPDATE": (KIND_UPDATE, old + new + [old_route, new_route]),
                       "DELETE": (KIND_DELETE, old + [old_route])}
            routed = {"INSERT": [2 * width], "UPDATE": [2 * width, 2 * width + 1], "DELETE": [2 * width]}
    for (suffix, event), name in zip(_TRIGGER_EVENTS, trigger_names(info.name)):
        kind, sources = targets[event]
        positions = list(range(len(sources) - len(routed.get(event, [])))) + routed.get(event, [])
        value_columns = ", ".join(value_column(index) for index in positions)
        conn.execute(
            f"CREATE TRIGGER {quote_ident(name)} AFTER {event} ON {table} FOR EACH ROW{when} BEGIN "
            f"{_CAPTURE_INSERT} (shape, kind, {value_columns}) "
            f"VALUES ({shape}, {kind}, {', '.join(sources)}); END")
    return shape  # type: ignore[return-value]


# OR FAIL: the insert cannot fail (shape and kind are constants, seq is the
# rowid), and under SQLite's default (ABORT) every statement that fires the
# trigger needs a statement journal, which inside the apply path's savepoint
# copies pages each row changes: with the key indexes, the consolidated
# applied DELETEs at 40% of the speed (benchmarks.apply's table).
_CAPTURE_INSERT = "INSERT OR FAIL INTO fieldsync_capture"
_CAPTURE_INSERT_BEFORE = " BEGIN INSERT INTO fieldsync_capture "  # triggers made before site layout 2


def upgrade_capture(conn: sqlite3.Connection) -> None:
    """Site layout 2, at the consolidated: the key indexes of every shape,
    and capture triggers with OR FAIL (their text otherwise as it stands,
    column renames included)."""
    if conn.execute("SELECT role FROM fieldsync_site WHERE id = 1").fetchone()[0] == "remote":
        return
    for shape in all_shapes(conn):
        install_key_indexes(conn, shape)
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall():
        if name.startswith(PREFIX) and _CAPTURE_INSERT_BEFORE in sql:
            conn.execute(f"DROP TRIGGER {quote_ident(name)}")
            conn.execute(sql.replace(_CAPTURE_INSERT_BEFORE, f" BEGIN {_CAPTURE_INSERT} ", 1))


def drop_capture(conn: sqlite3.Connection, table: str) -> None:
    for name in trigger_names(table):
        conn.execute(f"DROP TRIGGER IF EXISTS {quote_ident(name)}")


def write_capture_row(conn: sqlite3.Connection, shape: Shape, kind: int, flags: int | None,
                      values: list) -> int:
    """Insert a capture row by hand (rows written back to an origin, a
    remote's record of DELETEs of its pending rows); ``values`` are
    in shape order (old then new for an UPDATE), the routes of a table that
    follows its parent are added.  Returns its seq."""
    positions = list(range(len(values)))
    routes = row_routes(conn, shape.table, shape.columns, kind, values)
    if routes:
        positions += list(range(2 * len(shape.columns), 2 * len(shape.columns) + len(routes)))
        values = [*values, *routes]
    value_columns = ", ".join(value_column(index) for index in positions)
    placeholders = ", ".join("?" * len(values))
    cursor = conn.execute(f"INSERT INTO fieldsync_capture (shape, kind, flags, {value_columns})"
                          f" VALUES (?, ?, ?, {placeholders})", (shape.id, kind, flags, *values))
    return cursor.lastrowid  # type: ignore[return-value]


class ShapeCache:
    """Shapes by id.  Shapes never change once written, so they are cached
    for the life of the connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._shapes: dict[int, Shape] = {}

    def get(self, shape_id: int) -> Shape:
        shape = self._shapes.get(shape_id)
        if shape is None:
            row = self._conn.execute("SELECT table_name, columns, key_columns FROM fieldsync_shape WHERE id = ?",
                                     (shape_id,)).fetchone()
            if row is None:
                raise LookupError(f"capture shape {shape_id} is missing")
            shape = Shape(shape_id, row[0], tuple(json.loads(row[1])), tuple(json.loads(row[2])))
            self._shapes[shape_id] = shape
        return shape


def drop_moves(conn: sqlite3.Connection) -> None:
    """Drop the move triggers of every followed table (install_moves makes them again)."""
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE ?",
                                (MOVE_PREFIX + "%",)).fetchall():
        conn.execute(f"DROP TRIGGER {quote_ident(name)}")


def install_moves(conn: sqlite3.Connection) -> None:
    """(Re)create the move triggers of every followed table (agent/site/sqlite/route.py)."""
    drop_moves(conn)
    for statement in move_statements(conn, value_column):
        conn.execute(statement)


def all_shapes(conn: sqlite3.Connection) -> list[Shape]:
    return [Shape(shape_id, table, tuple(json.loads(columns)), tuple(json.loads(keys)))
            for shape_id, table, columns, keys in conn.execute(
                "SELECT id, table_name, columns, key_columns FROM fieldsync_shape ORDER BY id")]


def refresh_changed_tables(conn: sqlite3.Connection) -> list[str]:
    """Re-install capture for published tables whose definition changed
    since they were published (``ALTER TABLE``), inside the caller's write
    transaction.  Returns the tables refreshed.

    Rows captured before keep their old shape; rows after use the new one.
    """
    refreshed = []
    rows = conn.execute(
        "SELECT a.table_name, s.table_sql, m.sql FROM fieldsync_article a"
        " JOIN fieldsync_shape s ON s.id = a.shape"
        " LEFT JOIN sqlite_master m ON m.type = 'table' AND m.name = a.table_name COLLATE NOCASE").fetchall()
    for table, published_sql, current_sql in rows:
        if current_sql is None or current_sql == published_sql:
            continue  # a dropped table keeps its article until it is removed
        info = table_info(conn, table)
        shape = install_capture(conn, info)
        conn.execute("UPDATE fieldsync_article SET shape = ? WHERE table_name = ?", (shape, table))
        refreshed.append(info.name)
    if refreshed or _moves_out_of_date(conn):
        install_moves(conn)  # they name the descendants' shapes, and leave out dropped tables
    return refreshed


def _moves_out_of_date(conn: sqlite3.Connection) -> bool:
    """Whether the move triggers differ from those the catalogue and the
    tables present call for: a table of a chain was dropped (or renamed)
    since they were made, and a trigger naming it would make every UPDATE
    of the table it is on fail."""
    made = {sql for (sql,) in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE ?",
                                           (MOVE_PREFIX + "%",))}
    return made != set(move_statements(conn, value_column))
