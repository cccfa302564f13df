"""What SQL statements do to a site's schema, as SQLite itself says
(docs/site-database.md, "Schema changes").

Rules of this file:
* No SQL is parsed by hand.  A script is cut into statements where SQLite
  says one is complete (``sqlite3.complete_statement``); what a statement
  would do is what SQLite's authorizer reports while the statement is
  prepared as ``EXPLAIN`` (nothing runs); what it did is the difference
  between the schema before and after it (:func:`read_schema`,
  :func:`differences`).
* Reads and comparisons only: running statements, and judging them, is
  agent.site.sqlite.changes'.
"""

from __future__ import annotations

import re
import sqlite3
from typing import NamedTuple

from ._db import quote_ident

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|\Z)", re.DOTALL)

# Actions an authorizer reports that say nothing about what a statement is
# (reading, calling functions) or that SQLite makes on its own tables.
_QUIET = frozenset({sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE})
_OWN_TABLES = ("sqlite_master", "sqlite_temp_master", "sqlite_schema", "sqlite_temp_schema", "sqlite_sequence",
               "sqlite_stat1", "sqlite_stat4")


def split_statements(script: str) -> list[str]:
    """The statements of ``script``, each without its ``;``, in order;
    comments and empty statements are left out."""
    statements = []
    start = 0
    for position, char in enumerate(script):
        if char == ";" and sqlite3.complete_statement(script[start:position + 1]):
            statements.append(script[start:position])
            start = position + 1
    statements.append(script[start:])
    return [text.strip() for text in statements if _COMMENTS.sub("", text).strip()]


class Action(NamedTuple):
    """One action SQLite's authorizer reported: its code (``sqlite3.SQLITE_*``),
    its two arguments, the database, and the trigger or view whose code
    asked (None: the statement itself)."""

    code: int
    first: str | None
    second: str | None
    database: str | None
    trigger: str | None


def actions(conn: sqlite3.Connection, statement: str) -> tuple[Action, ...]:
    """What ``statement`` would do, as SQLite reports it while preparing
    it (as ``EXPLAIN``: nothing runs).  Actions on SQLite's own tables and
    reads are left out.  Raises sqlite3.Error when it does not prepare."""
    seen: list[Action] = []

    def note(code: int, first: str | None, second: str | None, database: str | None, trigger: str | None) -> int:
        if code not in _QUIET and not (first or "").lower() in _OWN_TABLES:
            seen.append(Action(code, first, second, database, trigger))
        return sqlite3.SQLITE_OK

    conn.set_authorizer(note)
    try:
        conn.execute("EXPLAIN " + statement).fetchall()
    finally:
        conn.set_authorizer(None)
    return tuple(seen)


class Column(NamedTuple):
    name: str
    declared: str
    notnull: int
    default: str | None
    key: int  # position in the primary key (1...), 0: none
    hidden: int  # generated (2, 3) or hidden (1): not stored, never captured


class TableState(NamedTuple):
    name: str
    columns: tuple[Column, ...]
    sql: str

    @property
    def stored(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns if not column.hidden)

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(column.name for column in sorted(self.columns, key=lambda c: c.key) if column.key)


class IndexState(NamedTuple):
    name: str
    table: str
    sql: str
    columns: tuple[str | None, ...]  # the key columns it uses (None: an expression)


class Schema(NamedTuple):
    """The application's tables and explicit indexes, by lowered name."""

    tables: dict[str, TableState]
    indexes: dict[str, IndexState]


def _own(name: str) -> bool:
    return name.lower().startswith(("fieldsync_", "sqlite_"))


def read_schema(conn: sqlite3.Connection) -> Schema:
    tables = {}
    indexes = {}
    for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM main.sqlite_master"
                                               " WHERE type IN ('table', 'index') AND sql IS NOT NULL").fetchall():
        if _own(table):
            continue
        if kind == "table":
            columns = tuple(Column(column, declared, notnull, default, pk, hidden)
                            for _cid, column, declared, notnull, default, pk, hidden
                            in conn.execute(f"PRAGMA main.table_xinfo({quote_ident(name)})"))
            tables[name.lower()] = TableState(name, columns, sql)
        else:
            used = tuple(row[2] for row in conn.execute(f"PRAGMA main.index_xinfo({quote_ident(name)})") if row[5])
            indexes[name.lower()] = IndexState(name, table, sql, used)
    return Schema(tables, indexes)


def added_definition(before: str, after: str) -> str | None:
    """The column definition ``ALTER TABLE ... ADD COLUMN`` added to a
    table's SQL text (SQLite inserts ``, DEFINITION`` after the last column
    definition, before any table constraint such as a WITHOUT ROWID
    table's PRIMARY KEY, or before the closing parenthesis, and keeps the
    rest), or None when ``after`` is not ``before`` with one such
    insertion."""
    prefix = 0
    while prefix < len(before) and prefix < len(after) and before[prefix] == after[prefix]:
        prefix += 1
    suffix = 0
    while (suffix < len(before) - prefix and before[len(before) - 1 - suffix] == after[len(after) - 1 - suffix]):
        suffix += 1
    inserted = after[prefix:len(after) - suffix].strip()
    if len(after) - suffix < prefix:
        return None
    if inserted.startswith(","):
        return inserted[1:].strip() or None
    if inserted.endswith(",") and before[:prefix].rstrip().endswith(","):
        return inserted[:-1].strip() or None  # before the table constraints: "..., DEFINITION, PRIMARY KEY (...)"
    return None


def differences(before: Schema, after: Schema) -> list[tuple]:
    """What changed from ``before`` to ``after``, as steps:
    ``("create_table", table, sql)``, ``("drop_table", table)``,
    ``("rename_table", old, new)``, ``("add_column", table, column,
    definition)``, ``("rename_column", table, old, new)``,
    ``("drop_column", table, column)``, ``("redefine", table)`` (its columns
    changed otherwise: several at once, a key), ``("create_index", table,
    index, sql, columns)`` and ``("drop_index", table, index, columns)``."""
    found: list[tuple] = []
    gone = [before.tables[name] for name in before.tables if name not in after.tables]
    new = [after.tables[name] for name in after.tables if name not in before.tables]
    for table in list(gone):
        twin = next((candidate for candidate in new if candidate.columns == table.columns), None)
        if twin is not None:  # ALTER TABLE ... RENAME TO
            found.append(("rename_table", table.name, twin.name))
            gone.remove(table)
            new.remove(twin)
    found += [("drop_table", table.name) for table in gone]
    found += [("create_table", table.name, table.sql) for table in new]
    for name, old in before.tables.items():
        current = after.tables.get(name)
        if current is not None and current.columns != old.columns:
            found.append(_column_change(old, current))
    # An index whose text changed kept its name: a column it names was
    # renamed, which renames it at every site alike.
    found += [("create_index", index.table, index.name, index.sql, index.columns)
              for name, index in after.indexes.items() if name not in before.indexes]
    found += [("drop_index", index.table, index.name, index.columns)
              for name, index in before.indexes.items() if name not in after.indexes]
    return found


def _column_change(old: TableState, new: TableState) -> tuple:
    names, current = [c.name for c in old.columns], [c.name for c in new.columns]
    if len(current) == len(names) + 1 and old.columns == new.columns[:-1]:
        definition = added_definition(old.sql, new.sql)
        if definition is not None:
            return ("add_column", new.name, current[-1], definition)
    if len(current) == len(names) - 1:
        dropped = [column for column in old.columns if column.name not in current]
        if len(dropped) == 1 and tuple(c for c in old.columns if c != dropped[0]) == new.columns:
            return ("drop_column", new.name, dropped[0].name)
    if len(current) == len(names):
        renamed = [(a, b) for a, b in zip(old.columns, new.columns) if a != b]
        if len(renamed) == 1 and renamed[0][0]._replace(name=renamed[0][1].name) == renamed[0][1]:
            return ("rename_column", new.name, renamed[0][0].name, renamed[0][1].name)
    return ("redefine", new.name)
