"""Schema changes at a PostgreSQL consolidated: ``agent schema apply URI``
(docs/postgres.md, "Schema changes").

Rules of this file:
* One call works inside the caller's transaction: the SQL runs, what it
  did is read from the catalog before and after each piece, judged, the
  capture of the published tables it altered is made again (a new shape)
  and the change's row is written; a refusal (SchemaRefused, one line)
  rolls all of it back.  No SQL is parsed here: a column is known by its
  number, so an added, dropped, renamed or retyped column and a renamed
  table are told apart exactly.
* Each piece of SQL (an argument, a file) runs as one dynamic statement
  of a DO block (PL/pgSQL ``EXECUTE``): it may hold several statements,
  and PostgreSQL itself refuses transaction control in it and what cannot
  run inside a transaction (``VACUUM``, ``... CONCURRENTLY``).
* What reaches the remotes: a column added to a published table, with the
  value the table's rows got.  Every other change of a published table's
  columns, name or key is refused (not built on PostgreSQL yet), and so
  is writing its rows (data goes through the applications) or touching
  fieldsync's own tables and capture triggers.  Writing other rows and
  dropping a table need ``unchecked``; everything else (other tables,
  indexes, views, functions) runs at the consolidated only.
* The change's capture row (agent.site.change_rows) is the only one of
  its writing transaction; a cut makes that a log transaction of its own
  and records its offset in ``fieldsync.schema_change`` (log.cut_in).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..change_rows import SCHEMA_SHAPE, SchemaChangeResult, check_fits, row_value
from ..capture import KIND_SCHEMA
from ..errors import InvalidSetting, SchemaRefused, UnpublishableTable
from . import route
from .capture import TRIGGER_PREFIX, PgShape, install_capture, load_shapes, shown_table
from .extract import added_column_sql
from .schema import SCHEMA
from .typemap import KINDS
from .uri import PgTarget

# Every table of the application and of fieldsync, with its columns (by
# number), its key's column numbers, and whether it has rows written in
# this transaction (pg_stat_xact_user_tables: what the transaction wrote
# so far).  Generated columns are not captured: they are left out.
_TABLES = """
SELECT c.oid, n.nspname, c.relname,
       coalesce((SELECT jsonb_agg(jsonb_build_array(a.attnum, a.attname, a.atttypid, a.atttypmod) ORDER BY a.attnum)
                   FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
                '[]'::jsonb),
       (SELECT to_jsonb(k.conkey) FROM pg_catalog.pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'p'),
       coalesce((SELECT s.n_tup_ins + s.n_tup_upd + s.n_tup_del FROM pg_catalog.pg_stat_xact_user_tables s
                  WHERE s.relid = c.oid), 0)
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
"""
# The indexes of those tables, and fieldsync's triggers on them.
_INDEXES = """
SELECT i.indexrelid, ci.relname, i.indrelid FROM pg_catalog.pg_index i
  JOIN pg_catalog.pg_class ci ON ci.oid = i.indexrelid JOIN pg_catalog.pg_namespace n ON n.oid = ci.relnamespace
 WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
"""
_TRIGGERS = "SELECT tgrelid, tgname, tgfoid FROM pg_catalog.pg_trigger WHERE NOT tgisinternal AND tgname LIKE %s"
_ARTICLES = "SELECT DISTINCT table_oid, table_schema, table_name, columns IS NULL FROM fieldsync.article"


@dataclass(frozen=True, slots=True)
class _Table:
    schema: str
    name: str
    columns: dict[int, tuple[str, int, int]]  # attnum -> (name, type oid, type modifier)
    key: tuple[int, ...]
    written: int  # rows written in this transaction so far

    @property
    def shown(self) -> str:
        return shown_table(self.schema, self.name)


@dataclass(frozen=True, slots=True)
class _Catalog:
    tables: dict[int, _Table]
    indexes: dict[int, tuple[str, int]]  # index oid -> (name, table oid)
    triggers: frozenset[tuple]

    @classmethod
    def read(cls, conn: psycopg.Connection) -> "_Catalog":
        tables = {oid: _Table(schema, name, {number: (column, type_oid, modifier)
                                             for number, column, type_oid, modifier in columns},
                              tuple(key or ()), written)
                  for oid, schema, name, columns, key, written in conn.execute(_TABLES)}
        indexes = {oid: (name, table) for oid, name, table in conn.execute(_INDEXES)}
        triggers = frozenset(conn.execute(_TRIGGERS, (TRIGGER_PREFIX + "%",)).fetchall())
        return cls(tables, indexes, triggers)


def apply_schema_in(conn: psycopg.Connection, target: PgTarget, site: str, scripts: Iterable[str], *,
                    unchecked: bool, made_at: object) -> tuple[SchemaChangeResult, str | None]:
    """Run ``scripts`` as one schema change inside the caller's transaction;
    return what it did (its offset still to come: the cut gives it) and
    the writing transaction of its row (None: it changed no table, and
    nothing was logged)."""
    scripts = [script for script in scripts if script.strip()]
    if not scripts:
        raise InvalidSetting("no SQL statement to run")
    rows = conn.execute(_ARTICLES).fetchall()
    articles = {oid for oid, _schema, _name, _whole in rows}
    whole_tables = {oid for oid, _schema, _name, whole in rows if whole}  # an article publishes every column
    catalog = _Catalog.read(conn)
    steps: list[tuple] = []
    added: dict[int, list[int]] = {}  # published table oid -> the column numbers added to it
    for number, script in enumerate(scripts, 1):
        where = f"statement {number} ({' '.join(script.split())[:60]})"
        try:
            with conn.transaction():  # a savepoint: PostgreSQL's refusal is the statement's line
                conn.execute("SELECT pg_catalog.set_config('fieldsync.script', %s, true)", (script,))
                conn.execute("DO $fieldsync$ BEGIN EXECUTE pg_catalog.current_setting('fieldsync.script'); END"
                             " $fieldsync$")
        except psycopg.Error as error:
            raise SchemaRefused(f"{where}: {_first_line(error)}") from None
        after = _Catalog.read(conn)
        steps += _judge(catalog, after, articles, added, unchecked, where)
        catalog = after
    if not steps:
        return SchemaChangeResult((), (), (), (), len(scripts)), None
    published, shapes, tables = [], {}, []
    for oid, numbers in added.items():
        table = catalog.tables[oid]
        shape = _capture_again(conn, target, table)
        shapes[table.shown] = shape.id
        kinds = dict(zip(shape.layout.columns, shape.layout.kinds))
        for column in (table.columns[attnum][0] for attnum in sorted(numbers)):
            if column in kinds:  # not a generated column: it travels
                published.append(("add_column", table.shown, column,
                                  added_column_sql(column, kinds[column], _default(conn, oid, column, kinds[column],
                                                                                    table.shown))))
        if oid in whole_tables:
            tables.append(table)
    if added:
        route.install_moves(conn)
    travelling = {step[1:3]: step for step in published}
    steps = [travelling.get(step[1:3], step) if step[0] == "add_column" else step for step in steps]
    known = load_shapes(conn)
    check_fits(site, published, ((table, known[shape_id].shape) for table, shape_id in shapes.items()))
    conn.execute(sql.SQL("INSERT INTO {}.capture (shape, kind, v) VALUES ({}, {}, ARRAY[%s])").format(
        sql.Identifier(SCHEMA), sql.Literal(SCHEMA_SHAPE), sql.Literal(KIND_SCHEMA)),
        (row_value(published, shapes, {}),))
    (txid,) = conn.execute("INSERT INTO fieldsync.schema_change (txid, steps, statements, made_at)"
                           " VALUES (pg_catalog.pg_current_xact_id(), %s, %s, %s) RETURNING txid::text",
                           (Jsonb([list(step) for step in steps]), Jsonb(scripts), made_at)).fetchone()
    sent = sorted({table.shown for table in tables} & {step[1] for step in published})
    subscribers = [name for (name,) in conn.execute(
        "SELECT DISTINCT s.remote FROM fieldsync.subscription s JOIN fieldsync.article a"
        " ON a.publication = s.publication JOIN fieldsync.remote r ON r.name = s.remote"
        " WHERE s.until IS NULL AND r.peer_incarnation IS NOT NULL AND a.columns IS NULL"
        " AND (a.table_schema, a.table_name) IN (SELECT * FROM unnest(%s::text[], %s::text[])) ORDER BY s.remote",
        ([table.schema for table in tables if table.shown in sent], [table.name for table in tables
                                                                      if table.shown in sent]))]
    return SchemaChangeResult((), tuple(steps), tuple(sent), tuple(subscribers), len(scripts)), txid


def change_offset(conn: psycopg.Connection, txid: str) -> int | None:
    """The commit offset of the change made in writing transaction ``txid``
    (None: no cut has taken it yet)."""
    found = conn.execute("SELECT commit_offset FROM fieldsync.schema_change WHERE txid = %s::xid8",
                         (txid,)).fetchone()
    return None if found is None else found[0]


def schema_version(conn: psycopg.Connection) -> int | None:
    """The offset of the last change a cut has taken (None: none)."""
    return conn.execute("SELECT max(commit_offset) FROM fieldsync.schema_change").fetchone()[0]


def _judge(before: _Catalog, after: _Catalog, articles: set[int], added: dict[int, list[int]],
           unchecked: bool, where: str) -> list[tuple]:
    """The steps one piece of SQL made (``before`` and ``after`` it), as
    agent.site.sqlite.ddl.differences names them; SchemaRefused for what it
    may not do.  The columns it added to published tables go to ``added``."""
    steps: list[tuple] = []
    other = None
    for oid, old in before.tables.items():
        new = after.tables.get(oid)
        published = oid in articles
        if old.schema == SCHEMA or (new is not None and new.schema == SCHEMA):
            if new is None or (new.schema, new.name, new.columns, new.key) != (old.schema, old.name, old.columns,
                                                                                 old.key):
                raise SchemaRefused(f"{where}: fieldsync's own tables are not the application's to change")
            if new.written != old.written:
                raise SchemaRefused(f"{where}: it writes rows of a published table (or of fieldsync's own tables): "
                                    "agent schema apply on PostgreSQL changes the schema only; let the "
                                    "applications write the rows, before or after it")
            continue
        if new is None:
            if published:
                raise SchemaRefused(f"{where}: {old.shown} is published: dropping a published table is refused "
                                    f"(remove its article first: agent publication remove DB {old.shown})")
            steps.append(("drop_table", old.shown))
            other = other or "DROP TABLE"
            continue
        if new.written != old.written:
            other = other or "a data statement"
        if (new.schema, new.name) != (old.schema, old.name):
            if published:
                raise SchemaRefused(f"{where}: it renames the published table {old.shown}: renaming a published "
                                    "table is not supported on a PostgreSQL consolidated yet")
            steps.append(("rename_table", old.shown, new.shown))
        steps += _columns(old, new, published, where)
        if published:
            if new.key != old.key:
                raise SchemaRefused(f"{where}: it re-keys the published table {new.shown}: refused")
            added.setdefault(oid, []).extend(number for number in new.columns if number not in old.columns)
    if {trigger for trigger in before.triggers if trigger[0] in after.tables} != after.triggers:
        raise SchemaRefused(f"{where}: the capture triggers of the published tables are fieldsync's; they are not "
                            "the application's to change")
    made = [table for oid, table in after.tables.items() if oid not in before.tables]
    steps += [("create_table", table.shown) for table in made]
    if any(table.written for table in made):
        other = other or "a data statement"
    steps += [("create_index", after.tables[table].shown, name) for oid, (name, table) in after.indexes.items()
              if oid not in before.indexes and table in before.tables]
    steps += [("drop_index", before.tables[table].shown, name) for oid, (name, table) in before.indexes.items()
              if oid not in after.indexes and table in after.tables]
    if other is not None and not unchecked:
        raise SchemaRefused(f"{where}: {other} is not a change agent schema apply checks and sends; add --unchecked "
                            "to run it at the consolidated only (docs/postgres.md, \"Schema changes\")")
    return steps


def _columns(old: _Table, new: _Table, published: bool, where: str) -> list[tuple]:
    """The column steps between two states of one table; on a published one,
    only added columns (the rest is refused)."""
    steps: list[tuple] = []
    for number, (name, type_oid, modifier) in old.columns.items():
        now = new.columns.get(number)
        if now is None:
            verb, step = "dropping", ("drop_column", new.shown, name)
        elif now[0] != name:
            verb, step = "renaming", ("rename_column", new.shown, name, now[0])
        elif now[1:] != (type_oid, modifier):
            verb, step = "changing the type of", ("redefine", new.shown)
        else:
            continue
        if published:
            raise SchemaRefused(f"{where}: {verb} column {new.shown}.{name} of a published table is not supported on "
                                "a PostgreSQL consolidated yet (adding a column is)")
        steps.append(step)
    steps += [("add_column", new.shown, column, None) for number, (column, _type, _modifier) in new.columns.items()
              if number not in old.columns]
    return steps


def _capture_again(conn: psycopg.Connection, target: PgTarget, table: _Table) -> PgShape:
    """Capture ``table`` in its new shape (with its route when it follows
    its parent) and point its articles at the shape."""
    routed = route.follows(conn).get((table.schema, table.name))
    try:
        shape = install_capture(conn, target, table.shown, None if routed is None else route.capture_route(
            route.chain_of(conn, *routed)))
    except UnpublishableTable as error:  # a column of a type outside the types table
        said = str(error).removeprefix(f"cannot publish table {table.shown}: ")
        raise SchemaRefused(f"{table.shown} is published, and a column added to it cannot travel: {said}") from None
    conn.execute("UPDATE fieldsync.article SET shape = %s WHERE table_schema = %s AND table_name = %s",
                 (shape.id, table.schema, table.name))
    return shape


def _default(conn: psycopg.Connection, oid: int, column: str, kind: str, shown: str) -> object:
    """The value the table's rows got in the added ``column`` (of the types
    table's ``kind``), as the log carries values: a constant default's
    (PostgreSQL keeps it as the column's missing value); None when they got
    none.  SchemaRefused when each row got its own (a volatile default)."""
    found = conn.execute("SELECT a.atthasmissing, a.atthasdef, pg_catalog.format_type(a.atttypid, a.atttypmod)"
                         " FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s AND a.attname = %s",
                         (oid, column)).fetchone()
    assert found is not None
    missing, has_default, type_name = found
    if missing:
        value_sql = sql.SQL(KINDS[kind].capture).format(sql.SQL("m.value"))
        (text,) = conn.execute(sql.SQL(
            "SELECT {} FROM (SELECT (a.attmissingval::text::{}[])[1] AS value FROM pg_catalog.pg_attribute a"
            " WHERE a.attrelid = %s AND a.attname = %s) AS m").format(value_sql, sql.SQL(type_name)),
            (oid, column)).fetchone()
        return None if text is None else KINDS[kind].load(text)
    if has_default and conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(
            sql.Identifier(*_name(conn, oid)))).fetchone()[0]:
        raise SchemaRefused(f"column {shown}.{column} was added with a default that gives each row its own value, "
                            "which the remotes cannot compute: add it without one, then set the rows' values "
                            "with an UPDATE of the applications")
    return None


def _name(conn: psycopg.Connection, oid: int) -> tuple[str, str]:
    found = conn.execute("SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
                         " ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,)).fetchone()
    assert found is not None
    return found[0], found[1]


def _first_line(error: psycopg.Error) -> str:
    diagnostic = error.diag.message_primary
    return diagnostic or (str(error).strip().splitlines() or ["failed"])[0]
