"""Extracting a SQLite remote from a PostgreSQL consolidated: the
consolidated side of agent.site.sqlite.extract (its ExtractionSource), which
makes the remote's file as it does from a SQLite consolidated.

Rules of this file:
* One consistent point: the extraction cuts the log in a REPEATABLE READ
  transaction that takes the cut lock before its first query (log.begin_cut,
  log.cut_in), so the transaction's snapshot S is the cut's and the new
  log end E is the last offset of exactly the transactions visible in S:
  those visible in S are at or below E, those not visible in S (running
  then, or begun later) get offsets above E at later cuts.  A second
  connection imports S (``pg_export_snapshot``, ``SET TRANSACTION
  SNAPSHOT``) before the cut commits, and the rows are read there, while
  the applications and the agent's cuts go on: the copy holds exactly the
  changes at or below E, and the remote's stream starts after E.
  docs/postgres.md, "Extraction".
* The remote's tables come from the articles' shapes, the layout the log
  carries: each column declared as the types table says (typemap.KINDS'
  ``sqlite_type``), the key as the primary key (NOT NULL), the foreign
  keys and indexes SQLite can keep alike (foreign_keys.py, indexes.py).
  Other constraints stay at the consolidated.
* Rows are read as the log carries them: each column through its capture
  text and its load (typemap.py), so a value of the copy equals the value
  a later change of that row carries; a row is the remote's when its
  SUBSCRIBE BY value, so read, is one of its values in Python's terms, as
  the log's readers select (agent.site.selection); a row that follows
  its parent by its route, looked up in the same snapshot (route.py).
* A table the remote gets through several articles (in several of its
  publications) is one table with the columns of them all; a row is
  copied once when any of them keeps it, with their columns and NULL in
  the others (union_rows; agent/site/sqlite/extract_union.py's rules).
* Functions here open their own transactions on the site's connection,
  under the site's lock; PostgreSQL's errors leave as the site's.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql

from ..capture import ROUTE
from ..extraction import COPY_CHUNK, PREFILTER_VALUES, SwitchOver
from ..identity import SiteIdentity
from ..remote_rules import RemoteUser
from ..sqlite._db import format_time, quote_ident, write_transaction
from ..sqlite.capture import TableInfo
from ..sqlite.extract import Follow, TablePlan
from ..sqlite.extract_union import union_plan
from . import remotes as remote_rows
from . import route
from .capture import PgShape, load_shapes, shown_table
from .catalogue import table_order
from .connect import connect, translate
from .foreign_keys import ACTIONS, PgForeignKey, foreign_keys, kept_keys
from .indexes import indexes, kept_indexes
from .log import begin_cut, cut_in, truncated_through
from .read_positions import leaving
from .schema import CHANGE_ROWS
from .subscriptions import VALUE_COLUMNS, candidate_texts, stored_value
from .typemap import KINDS, loader
from .uri import PgTarget

_ARTICLES = """
SELECT a.table_schema, a.table_name, a.publication, a.columns, a.subscribe_by, a.shape, a.follows IS NOT NULL
  FROM fieldsync.article a
 WHERE a.publication IN (SELECT publication FROM fieldsync.subscription WHERE remote = %s AND until IS NULL)
"""


def remote_table_sql(shape: PgShape, columns: tuple[str, ...], keys: Sequence[PgForeignKey] = ()) -> str:
    """The CREATE TABLE of ``shape``'s table at a SQLite remote: the
    published ``columns`` (shape order), each declared as the types table
    says, the key, and the foreign keys ``keys`` (foreign_keys.kept_keys), with
    their actions."""
    layout = shape.layout
    kinds = dict(zip(layout.columns, layout.kinds))
    definitions = [f"{quote_ident(column)} {KINDS[kinds[column]].sqlite_type}"
                   + (" NOT NULL" if column in layout.key_columns else "") for column in columns]
    definitions.append(f"PRIMARY KEY ({', '.join(quote_ident(column) for column in layout.key_columns)})")
    definitions += [f"FOREIGN KEY ({', '.join(map(quote_ident, key.columns))}) REFERENCES {quote_ident(key.parent)}"
                    f" ({', '.join(map(quote_ident, key.parent_columns))}) ON DELETE {ACTIONS[key.on_delete]}"
                    f" ON UPDATE {ACTIONS[key.on_update]}" for key in keys]
    return f"CREATE TABLE {quote_ident(layout.shown)} ({', '.join(definitions)})"


def added_column_sql(column: str, kind: str, default: object = None) -> str:
    """The definition a SQLite remote adds a column of the types table's
    ``kind`` with (``ALTER TABLE ... ADD COLUMN``, changes.py): declared as
    extraction declares it, with ``default`` (a value as the log carries
    it; None: none) as its DEFAULT, so the rows the remote holds get the
    value the consolidated's rows got."""
    definition = f"{quote_ident(column)} {KINDS[kind].sqlite_type}"
    return definition if default is None else f"{definition} DEFAULT {_sqlite_literal(default)}"


def _sqlite_literal(value: object) -> str:
    if type(value) is int:
        return str(value)
    if type(value) is float:
        return repr(value) if math.isfinite(value) else ("9e999" if value > 0 else "-9e999")
    if type(value) is bytes:
        return f"X'{value.hex()}'"
    return "'" + str(value).replace("'", "''") + "'"


def schema_version_row(conn: psycopg.Connection) -> tuple[int, str] | None:
    """The offset of the last schema change a cut has taken (changes.py)
    and the time it was made (ISO 8601 text); None: none."""
    found = conn.execute("SELECT commit_offset, made_at FROM fieldsync.schema_change WHERE commit_offset IS NOT NULL"
                         f" AND {CHANGE_ROWS} ORDER BY commit_offset DESC LIMIT 1").fetchone()
    return None if found is None else (found[0], format_time(found[1]) or "")


def record_schema_version(copy: sqlite3.Connection, version: tuple[int, str] | None, consolidated: str) -> None:
    """Give a copy the consolidated's schema version at its extraction point
    (``version``: the offset and time of the last change, changes.py; None:
    none): a change with no steps, which came with the extraction (its
    tables were copied in that shape), as a SQLite consolidated's copy has."""
    if version is not None:
        copy.execute("INSERT INTO main.fieldsync_schema_change (commit_offset, peer, steps, made_at)"
                     " VALUES (?, ?, '[]', ?)", (version[0], consolidated, version[1]))


@dataclass(frozen=True, slots=True)
class PgConsolidated:
    """A PostgreSQL consolidated as extraction uses it: the site's
    connection, the lock of every use of it, its identity and where it is
    (a second connection reads the rows)."""

    conn: psycopg.Connection
    lock: threading.RLock
    identity: SiteIdentity
    target: PgTarget
    shapes: dict[str, PgShape]  # filled by plan: the shape of each table the remote gets, by its name there

    def plan(self, remote: str) -> tuple[RemoteUser, list[TablePlan], list[tuple[str, list[str]]]]:
        with self._transaction(f"planning the extraction of {remote!r}", snapshot=True) as conn:
            row = remote_rows.get_remote(conn, remote)
            values: dict[str, set] = {}
            for publication, *stored in conn.execute(f"SELECT publication, {VALUE_COLUMNS} FROM"
                                                     " fieldsync.subscription WHERE remote = %s AND until IS NULL",
                                                     (remote,)):
                bucket = values.setdefault(publication, set())
                value = stored_value(*stored)
                if value is not None:
                    bucket.add(value)
            shapes = load_shapes(conn)
            articles = sorted(conn.execute(_ARTICLES, (remote,)).fetchall(),
                              key=lambda found: table_order(shown_table(found[0], found[1])))
            # What the remote's catalogue records of each follow (no route
            # template: a remote routes nothing; agent.site.sqlite.route.record_follow).
            follows = {table: Follow(shown_table(*table), parent, columns, parent_columns, "")
                       for table, (parent, columns, parent_columns) in route.follows(conn).items()}
            keys = foreign_keys(conn)
            table_indexes = indexes(conn)
        found: dict[tuple[str, str], list[TablePlan]] = {}
        for schema, table, publication, columns, subscribe_by, shape_id, following in articles:
            follow = follows.get((schema, table)) if following else None
            if follow is not None:
                subscribe_by = ROUTE  # the rows follow their parent: selected by their route (route.py)
            shape = shapes[shape_id]
            layout = shape.layout
            published = layout.columns if columns is None else tuple(
                column for column in layout.columns if column in set(columns) | set(layout.key_columns))
            found.setdefault((schema, table), []).append(TablePlan(
                TableInfo(layout.shown, layout.columns, layout.key_columns, "", False), publication, published,
                subscribe_by, frozenset(values[publication]) if subscribe_by else None, published != layout.columns,
                follow))
            self.shapes[layout.shown] = shape
        plans, statements = [], []
        # A table in several of the remote's publications: one table with
        # the columns of all its articles (agent/site/sqlite/extract_union.py).
        merged = [parts[0] if len(parts) == 1 else union_plan(parts) for parts in found.values()]
        parents = {plan.info.name: plan.info.key_columns for plan in merged}
        for plan in merged:
            create = remote_table_sql(self.shapes[plan.info.name], plan.columns,
                                      kept_keys(keys.get(plan.info.name, ()), plan.columns, parents))
            plans.append(dataclasses.replace(plan, info=dataclasses.replace(plan.info, sql=create)))
            statements.append((create, [index.sql() for index in kept_indexes(table_indexes.get(plan.info.name, ()),
                                                                              plan.columns)]))
        return row, plans, statements

    def copy_rows(self, copy: sqlite3.Connection, remote: str, plans: list[TablePlan]
                  ) -> tuple[int, dict[str, int], RemoteUser]:
        try:
            reader = connect(self.target)
        except psycopg.Error as error:
            raise translate(error, self.target, f"reading the rows of {remote!r}") from None
        try:
            with reader.transaction():
                reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                offset, rows, version = self.cut_and_share(reader, [remote])
                before = rows[remote]
                with write_transaction(copy, f"copying the rows of {remote!r}"):
                    record_schema_version(copy, version, self.identity.name)
                    counts = {plan.info.name: _copy_rows(reader, copy, plan, self.shapes[plan.info.name])
                              for plan in plans}
            return offset, counts, before
        except psycopg.Error as error:
            raise translate(error, self.target, f"reading the rows of {remote!r}") from None
        finally:
            reader.close()

    def cut_and_share(self, reader: psycopg.Connection, remotes: Sequence[str]
                      ) -> tuple[int, dict[str, RemoteUser], tuple[int, str] | None]:
        """Cut the log and hand the cut's snapshot to ``reader`` (its
        transaction begun, nothing read yet) before the cut commits; return
        the log end, the rows of ``remotes`` and the schema version
        (:func:`schema_version_row`: the cut gives a change its offset, which
        the shared snapshot does not show yet) at that point."""
        with self.lock:
            try:
                with self.conn.transaction():
                    begin_cut(self.conn)
                    made = cut_in(self.conn, self.identity.name)
                    if len(remotes) == 1:
                        rows = {remotes[0]: remote_rows.get_remote(self.conn, remotes[0])}
                    else:
                        every = {row.name: row for row in remote_rows.list_remotes(self.conn)}
                        rows = {name: every.get(name) or remote_rows.get_remote(self.conn, name) for name in remotes}
                    version = schema_version_row(self.conn)
                    [(snapshot,)] = self.conn.execute("SELECT pg_catalog.pg_export_snapshot()").fetchall()
                    reader.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            except psycopg.Error as error:
                raise translate(error, self.target, "fixing the extraction point of "
                                + (repr(remotes[0]) if len(remotes) == 1 else f"{len(remotes)} remotes")) from None
        return made.log_end, rows, version

    def switch_over(self, change: SwitchOver, name_copy: Callable[[], None]) -> None:
        with self._transaction(f"switching {change.remote!r} over to its new copy") as conn:
            current = remote_rows.get_remote(conn, change.remote, for_update=True)
            change.check(current, truncated_through(conn))
            columns = change.columns
            conn.execute(sql.SQL("UPDATE fieldsync.remote SET {}{} WHERE name = %s").format(
                sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(name)) for name in columns),
                leaving(columns)), (*columns.values(), change.remote))
            if current.peer_incarnation is not None:
                conn.execute("INSERT INTO fieldsync.replaced_copy (remote, incarnation, replaced_at)"
                             " VALUES (%s, %s, now()) ON CONFLICT DO NOTHING",
                             (change.remote, current.peer_incarnation))
            name_copy()

    @contextmanager
    def _transaction(self, doing: str, *, snapshot: bool = False) -> Iterator[psycopg.Connection]:
        with self.lock:
            try:
                with self.conn.transaction():
                    if snapshot:
                        self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    yield self.conn
            except psycopg.Error as error:
                raise translate(error, self.target, doing) from None


def _copy_rows(reader: psycopg.Connection, copy: sqlite3.Connection, plan: TablePlan, shape: PgShape) -> int:
    """Copy ``plan``'s rows, as the log carries them, from ``reader``'s
    snapshot into ``copy``; return how many."""
    width, values = len(plan.columns), plan.values
    insert = (f"INSERT INTO main.{quote_ident(plan.info.name)} ({', '.join(map(quote_ident, plan.columns))})"
              f" VALUES ({', '.join('?' * width)})")
    total = 0
    for rows in union_rows(reader, plan, shape) if plan.parts else read_rows(reader, plan, shape, values):
        if values is not None:
            # The log readers' test (Python equality): the copy and the
            # stream agree on which rows are the remote's.
            rows = [row[:width] for row in rows if row[width] in values]
        copy.executemany(insert, rows)
        total += len(rows)
    return total


def union_rows(reader: psycopg.Connection, plan: TablePlan, shape: PgShape) -> Iterator[list[tuple]]:
    """The rows of a table the remote gets through the articles of
    ``plan.parts``, chunk by chunk: each row any of them keeps, once, with
    the columns of those that keep it and NULL in the others (the test
    each article's reader applies: agent/site/sqlite/extract_union.py)."""
    width = len(plan.columns)
    index = {column: position for position, column in enumerate(plan.columns)}
    filtered = [part for part in plan.parts if part.values is not None]
    tests = [(tuple(index[column] for column in part.columns),
              None if part.values is None else width + filtered.index(part), part.values) for part in plan.parts]
    for rows in _read(reader, plan, shape, filtered, None):
        copied = []
        for row in rows:
            kept = set().union(*(positions for positions, at, values in tests if at is None or row[at] in values))
            if kept:
                copied.append(tuple(row[i] if i in kept else None for i in range(width)))
        yield copied


def read_rows(reader: psycopg.Connection, plan: TablePlan, shape: PgShape, values: frozenset | None
              ) -> Iterator[list[tuple]]:
    """``plan``'s table read once in ``reader``'s snapshot, chunk by chunk,
    each row as the log carries it: its published columns, then (when
    ``values`` is given) its SUBSCRIBE BY value; with few ``values``, only
    the rows that may hold one of them (the caller keeps those that do)."""
    return _read(reader, plan, shape, [] if values is None else [plan], values)


def _read(reader: psycopg.Connection, plan: TablePlan, shape: PgShape, filtered: list[TablePlan],
          values: frozenset | None) -> Iterator[list[tuple]]:
    """``plan``'s columns, then what selects the rows of each of
    ``filtered`` (its route or its SUBSCRIBE BY value), each as the log
    carries it; prefiltered by ``values`` (the last one's) when few."""
    layout = shape.layout
    kinds = dict(zip(layout.columns, layout.kinds))
    read = [kinds[column] for column in plan.columns]
    texts: list[sql.Composable] = [sql.SQL(KINDS[kinds[column]].capture).format(sql.Identifier(column))
                                   for column in plan.columns]
    for part in filtered:
        if part.subscribe_by == ROUTE:  # the row's route, looked up in the same snapshot
            follow = part.follow
            assert follow is not None
            chain = route.chain_of(reader, follow.parent, follow.columns, follow.parent_columns)
            read.append(chain.kind)
            texts.append(route.route_expression(chain, [sql.Identifier(layout.schema, layout.table, column)
                                                        for column in follow.columns]))
        else:  # read alongside, even when published
            read.append(kinds[part.subscribe_by])  # type: ignore[index]
            texts.append(sql.SQL(KINDS[read[-1]].capture).format(sql.Identifier(part.subscribe_by)))
    query = sql.SQL("SELECT ARRAY[{}] FROM {}").format(sql.SQL(", ").join(texts),
                                                       sql.Identifier(layout.schema, layout.table))
    parameters: tuple = ()
    if values is not None and len(values) <= PREFILTER_VALUES:
        wanted = candidate_texts(KINDS[read[-1]], values)
        if wanted is not None:  # the rows that may hold a value
            query += sql.SQL(" WHERE {} = ANY(%s)").format(texts[-1])
            parameters = (wanted,)
    load = loader(tuple(KINDS[kind] for kind in read))
    with reader.cursor(name="fieldsync_extract") as cursor:
        cursor.itersize = COPY_CHUNK
        cursor.execute(query, parameters)
        while True:
            found = cursor.fetchmany(COPY_CHUNK)
            if not found:
                return
            yield [load(captured) for (captured,) in found]
