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
* What reaches the remotes: the columns of a published table added (with
  the value the table's rows got), renamed and dropped, and the table
  renamed (not one of a follow chain), with SQLite's checks
  (agent/site/sqlite/changes.py: what its article needs stays, a retired
  name, of a column or a table, is never given again); its indexes SQLite
  can make alike, made and dropped (indexes.py); a column retyped to a
  type that travels as before stays here.  Other retypes of a published
  column, re-keying or dropping a published table are refused (not built
  on PostgreSQL yet), and so is writing its rows (data goes through the
  applications) or touching fieldsync's own tables and capture triggers.
  Writing other rows and dropping a table need ``unchecked``; everything
  else (other tables, views, functions) runs at the consolidated only.
* ``fieldsync.schema_change`` keeps every change's steps: the history that
  maps a remote's rows in an old shape (agent.site.apply.reshape) and keeps
  a retired name from being given again.
* The change's capture row (agent.site.change_rows) is the only one of
  its writing transaction; a cut makes that a log transaction of its own
  and records its offset in ``fieldsync.schema_change`` (log.cut_in).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import errors as pg_errors, sql
from psycopg.types.json import Jsonb

from codec.changes import RENAME_TABLE

from ..apply.reshape import column_moves
from ..change_rows import SCHEMA_SHAPE, SchemaChangeResult, check_fits, row_value, table_renames
from ..capture import KIND_SCHEMA
from ..errors import InvalidSetting, SchemaRefused, UnpublishableTable
from . import route
from .capture import TRIGGER_PREFIX, describe_table, load_shapes, shown_table
from .catalogue import capture_again
from .extract import added_column_sql, schema_version_row
from .indexes import indexes, remote_name
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
    indexes: frozenset[tuple[int, str]]  # (table oid, index name): an index rebuilt under its name is the same
    triggers: frozenset[tuple]
    index_oids: dict[tuple[int, str], int]  # the oid of each of ``indexes``

    @classmethod
    def read(cls, conn: psycopg.Connection) -> "_Catalog":
        tables = {oid: _Table(schema, name, {number: (column, type_oid, modifier)
                                             for number, column, type_oid, modifier in columns},
                              tuple(key or ()), written)
                  for oid, schema, name, columns, key, written in conn.execute(_TABLES)}
        index_oids = {(table, name): oid for oid, name, table in conn.execute(_INDEXES)}
        triggers = frozenset(conn.execute(_TRIGGERS, (TRIGGER_PREFIX + "%",)).fetchall())
        return cls(tables, frozenset(index_oids), triggers, index_oids)


# How long a statement of a change waits for a lock by default, in seconds.
# A statement waiting for its table's lock holds up every later user of
# the table (PostgreSQL queues them behind it): it gives up instead, and
# nothing changes.
LOCK_TIMEOUT = 10.0


def apply_schema_in(conn: psycopg.Connection, target: PgTarget, site: str, scripts: Iterable[str], *,
                    unchecked: bool, made_at: object, lock_timeout: float | None = None
                    ) -> tuple[SchemaChangeResult, str | None]:
    """Run ``scripts`` as one schema change inside the caller's transaction;
    return what it did (its offset still to come: the cut gives it) and
    the writing transaction of its row (None: it changed no table, and
    nothing was logged).  Each statement waits ``lock_timeout`` seconds at
    most for a lock (None: LOCK_TIMEOUT; 0: no limit)."""
    scripts = [script for script in scripts if script.strip()]
    if not scripts:
        raise InvalidSetting("no SQL statement to run")
    seconds = LOCK_TIMEOUT if lock_timeout is None else lock_timeout
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise InvalidSetting(f"the lock timeout must be a number of seconds, 0 or more; got {seconds}")
    steps_before = history(conn)
    change = _Change(conn, _articles(conn), column_moves(steps_before), set(table_renames(steps_before)), unchecked)
    catalog = _Catalog.read(conn)
    for number, script in enumerate(scripts, 1):
        where = f"statement {number} ({' '.join(script.split())[:60]})"
        try:
            with conn.transaction():  # a savepoint: PostgreSQL's refusal is the statement's line
                conn.execute("SELECT pg_catalog.set_config('fieldsync.script', %s, true),"
                             " pg_catalog.set_config('lock_timeout', %s, true)",
                             (script, f"{max(1, round(seconds * 1000)) if seconds else 0}ms"))
                conn.execute("DO $fieldsync$ BEGIN EXECUTE pg_catalog.current_setting('fieldsync.script'); END"
                             " $fieldsync$")
                conn.execute("SELECT pg_catalog.set_config('lock_timeout', '0', true)")  # fieldsync's own steps wait
        except pg_errors.LockNotAvailable:
            raise SchemaRefused(f"{where}: a lock it needs was not granted within {seconds:g} s (an open transaction "
                                "holds its table; while it waited, the table's other users queued behind it); nothing "
                                "changed: run it again when the table is less busy, or give --lock-timeout"
                                ) from None
        except psycopg.Error as error:
            raise SchemaRefused(f"{where}: {_first_line(error)}") from None
        after = _Catalog.read(conn)
        change.judge(catalog, after, where)
        catalog = after
    if not change.steps:
        return SchemaChangeResult((), (), (), (), len(scripts)), None
    shapes: dict[str, int] = {}
    change.rename_articles()
    for oid in sorted(change.altered):
        table = catalog.tables[oid]
        shapes[table.shown] = capture_again(conn, target, table.schema, table.name, table.shown,
                                            route.follows(conn).get((table.schema, table.name))).id
    for oid in change.sent - change.altered:  # an index made or dropped: the shape it has
        shapes[catalog.tables[oid].shown] = conn.execute("SELECT shape FROM fieldsync.article WHERE table_oid = %s"
                                                         " LIMIT 1", (oid,)).fetchone()[0]
    if change.altered:
        route.install_moves(conn)
    txid = write_change(conn, site, change.published, shapes, change.steps, scripts, made_at,
                        indexes=change.index_columns)
    # A column step reaches the articles of every column, an index those that hold its columns.
    sent = [catalog.tables[oid] for oid in sorted(change.sent, key=lambda oid: catalog.tables[oid].shown)
            if change.articles[oid].whole or oid in change.indexed]
    indexed = [catalog.tables[oid] for oid in change.indexed]
    subscribers = [name for (name,) in conn.execute(
        "SELECT DISTINCT s.remote FROM fieldsync.subscription s JOIN fieldsync.article a"
        " ON a.publication = s.publication JOIN fieldsync.remote r ON r.name = s.remote"
        " WHERE s.until IS NULL AND r.peer_incarnation IS NOT NULL"
        " AND (a.columns IS NULL AND (a.table_schema, a.table_name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
        " OR (a.table_schema, a.table_name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))) ORDER BY s.remote",
        ([table.schema for table in sent], [table.name for table in sent],
         [table.schema for table in indexed], [table.name for table in indexed]))]
    return SchemaChangeResult((), tuple(change.steps), tuple(table.shown for table in sent), tuple(subscribers),
                              len(scripts)), txid


def write_change(conn: psycopg.Connection, site: str, published: list[tuple], shapes: dict[str, int],
                 steps: list[tuple], statements: list[str], made_at: object, *,
                 indexes: dict[str, list[str]] | None = None, to: dict[str, list[str]] | None = None) -> str:
    """Log a change in the caller's transaction: its capture row
    (agent.site.change_rows; ``published`` the steps that travel, ``shapes``
    each of their tables' shape id now, ``indexes`` the columns of each
    index a step makes, ``to`` the remotes of ``drop_article`` steps) and its ``fieldsync.schema_change``
    row (``steps``, all of them).  Returns the writing transaction's id,
    which the cut gives the change's offset by.  SchemaRefused when it
    could not travel in one message."""
    known = load_shapes(conn)
    check_fits(site, published, ((table, known[shape_id].shape) for table, shape_id in shapes.items()))
    conn.execute(sql.SQL("INSERT INTO {}.capture (shape, kind, v) VALUES ({}, {}, ARRAY[%s])").format(
        sql.Identifier(SCHEMA), sql.Literal(SCHEMA_SHAPE), sql.Literal(KIND_SCHEMA)),
        (row_value(published, shapes, indexes or {}, to),))
    (txid,) = conn.execute("INSERT INTO fieldsync.schema_change (txid, steps, statements, made_at)"
                           " VALUES (pg_catalog.pg_current_xact_id(), %s, %s, %s) RETURNING txid::text",
                           (Jsonb([list(step) for step in steps]), Jsonb(statements), made_at)).fetchone()
    return txid


def change_offset(conn: psycopg.Connection, txid: str) -> int | None:
    """The commit offset of the change made in writing transaction ``txid``
    (None: no cut has taken it yet)."""
    found = conn.execute("SELECT commit_offset FROM fieldsync.schema_change WHERE txid = %s::xid8",
                         (txid,)).fetchone()
    return None if found is None else found[0]


def schema_version(conn: psycopg.Connection) -> int | None:
    """The offset of the last change a cut has taken (None: none)."""
    found = schema_version_row(conn)
    return None if found is None else found[0]


def history(conn: psycopg.Connection) -> list[list]:
    """Every step of the changes made at this site, in order (what maps a
    remote's row in an old shape: agent.site.apply.reshape)."""
    return [step for (steps,) in conn.execute("SELECT steps FROM fieldsync.schema_change"
                                              " ORDER BY commit_offset NULLS LAST, txid") for step in steps]


@dataclass(frozen=True, slots=True)
class _Article:
    """What the articles of one published table need of its columns (lowered names)."""

    whole: bool  # some article publishes every column (the others list theirs)
    subscribe_by: frozenset[str]
    listed: frozenset[str]  # the columns an article with a column subset lists
    route: frozenset[str]  # its follow key, and the parent columns the tables that follow it reference


def _articles(conn: psycopg.Connection) -> dict[int, _Article]:
    rows = conn.execute("SELECT table_oid, table_schema, table_name, columns, subscribe_by, follows, follow_columns,"
                        " parent_columns FROM fieldsync.article").fetchall()
    followed: dict[str, set[str]] = {}
    for *_, follows, _columns, parent_columns in rows:
        if follows is not None:
            followed.setdefault(follows.lower(), set()).update(column.lower() for column in parent_columns or ())
    found: dict[int, _Article] = {}
    for oid, schema, name, columns, subscribe_by, _follows, follow_columns, _parent in rows:
        known = found.get(oid, _Article(False, frozenset(), frozenset(),
                                        frozenset(followed.get(shown_table(schema, name).lower(), ()))))
        found[oid] = _Article(known.whole or columns is None,
                              known.subscribe_by | ({subscribe_by.lower()} if subscribe_by else set()),
                              known.listed | {column.lower() for column in columns or ()},
                              known.route | {column.lower() for column in follow_columns or ()})
    return found


class _Change:
    """The steps of the change being made, judged piece by piece."""

    def __init__(self, conn: psycopg.Connection, articles: dict[int, _Article], moves: dict[str, list[list]],
                 retired_tables: set[str], unchecked: bool) -> None:
        self.conn, self.articles, self.unchecked = conn, articles, unchecked
        # By lowered table: the lowered column names renamed away or dropped (never given again).
        self.retired = {table: {step[2].lower() for step in steps} for table, steps in moves.items()}
        self.retired_tables = retired_tables  # the names published tables had before a rename (lowered)
        self.renamed: list[tuple[_Table, _Table]] = []  # published tables renamed, in order: their articles follow
        self.steps: list[tuple] = []  # every step, as agent.site.sqlite.ddl.differences names them
        self.published: list[tuple] = []  # the steps on published tables, as they travel
        self.altered: set[int] = set()  # the published tables whose columns changed
        self.sent: set[int] = set()  # those of them with steps that travel
        self.index_columns: dict[str, list[str]] = {}  # the columns of each index a step makes, by its remote name
        self.indexed: set[int] = set()  # the published tables with index steps that travel

    def judge(self, before: _Catalog, after: _Catalog, where: str) -> None:
        """The steps one piece of SQL made (``before`` and ``after`` it);
        SchemaRefused for what it may not do."""
        other = None
        # The published tables' indexes that went (by hand, or with a column
        # dropped): gone at the remotes before any column step, as SQLite
        # drops no column an index uses.
        for table, name in sorted(before.indexes - after.indexes):
            remote = remote_name(before.tables[table].schema, name) if table in before.tables else None
            if table in self.articles and table in after.tables and remote is not None:
                self.published.append(("drop_index", after.tables[table].shown, remote))
                self.sent.add(table)
                self.indexed.add(table)
        for oid, old in before.tables.items():
            new = after.tables.get(oid)
            published = oid in self.articles
            if old.schema == SCHEMA or (new is not None and new.schema == SCHEMA):
                if new is None or (new.schema, new.name, new.columns, new.key) != (old.schema, old.name,
                                                                                     old.columns, old.key):
                    raise SchemaRefused(f"{where}: fieldsync's own tables are not the application's to change")
                if new.written != old.written:
                    raise SchemaRefused(f"{where}: it writes rows of a published table (or of fieldsync's own "
                                        "tables): agent schema apply on PostgreSQL changes the schema only; let the "
                                        "applications write the rows, before or after it")
                continue
            if new is None:
                if published:
                    raise SchemaRefused(f"{where}: {old.shown} is published: dropping a published table is refused "
                                        f"(remove its article first: agent publication remove DB {old.shown})")
                self.steps.append(("drop_table", old.shown))
                other = other or "DROP TABLE"
                continue
            if new.written != old.written:
                other = other or "a data statement"
            if (new.schema, new.name) != (old.schema, old.name):
                if published:
                    self._rename(oid, old, new, where)
                else:
                    self.steps.append((RENAME_TABLE, old.shown, new.shown))
            if published:
                if new.key != old.key:
                    raise SchemaRefused(f"{where}: it re-keys the published table {new.shown}: refused")
                self._published_columns(oid, old, new, where)
            else:
                self.steps += _columns(old, new)
        if {trigger for trigger in before.triggers if trigger[0] in after.tables} != after.triggers:
            raise SchemaRefused(f"{where}: the capture triggers of the published tables are fieldsync's; they are "
                                "not the application's to change")
        made = [table for oid, table in after.tables.items() if oid not in before.tables]
        for table in made:
            self._check_not_retired(table.shown, where)
        self.steps += [("create_table", table.shown) for table in made]
        if any(table.written for table in made):
            other = other or "a data statement"
        self.steps += [("create_index", after.tables[table].shown, name) for table, name
                       in sorted(after.indexes - before.indexes) if table in before.tables]
        self.steps += [("drop_index", before.tables[table].shown, name) for table, name
                       in sorted(before.indexes - after.indexes) if table in after.tables]
        for table, name in sorted(after.indexes - before.indexes):  # those the remotes can have go to them
            if table in self.articles and table in before.tables:
                for index in (found for carried in indexes(self.conn, index=after.index_oids[(table, name)]).values()
                              for found in carried):
                    self.published.append(("create_index", index.table, index.name, index.sql()))
                    self.index_columns[index.name] = list(index.columns)
                    self.sent.add(table)
                    self.indexed.add(table)
        if other is not None and not self.unchecked:
            raise SchemaRefused(f"{where}: {other} is not a change agent schema apply checks and sends; add "
                                "--unchecked to run it at the consolidated only (docs/postgres.md, \"Schema "
                                "changes\")")

    def _check_not_retired(self, table: str, where: str) -> None:
        """Refuse giving ``table`` a name a published table had before it was renamed."""
        if table.lower() in self.retired_tables:
            raise SchemaRefused(f"{where}: {table} was the name of a published table before it was renamed: rows "
                                "logged under that name may still be on their way; choose another")

    def rename_articles(self) -> None:
        """The articles and conflict policies of the published tables renamed
        follow them, once every statement was judged (so that no statement
        is judged with fieldsync's own writes in it)."""
        for old, new in self.renamed:
            for table in ("article", "conflict_policy"):
                self.conn.execute(sql.SQL("UPDATE fieldsync.{} SET table_schema = %s, table_name = %s"
                                          " WHERE table_schema = %s AND table_name = %s").format(sql.Identifier(table)),
                                  (new.schema, new.name, old.schema, old.name))

    def _rename(self, oid: int, old: _Table, new: _Table, where: str) -> None:
        """A published table renamed (docs/site-database.md, "Renaming a
        published table"): a step that travels first among the table's;
        its articles and conflict policy follow it (:meth:`rename_articles`),
        and its capture is made again under the new name, a new shape, with
        the other tables'.
        Refused for a table of a follow chain (its route names tables) and
        for a name a published table had before (rows logged under it may
        still be on their way)."""
        if self.articles[oid].route:
            raise SchemaRefused(f"{where}: {old.shown} follows its parent or has rows that follow it: renaming a "
                                "table of a follow chain is not supported yet")
        if new.shown.lower().startswith(("fieldsync", "sqlite_")):
            raise SchemaRefused(f"{where}: it renames the published table {old.shown} to {new.shown}, a name of "
                                "fieldsync's and SQLite's own tables at the remotes: refused")
        self._check_not_retired(new.shown, where)
        step = (RENAME_TABLE, old.shown, new.shown)
        self.steps.append(step)
        self.published.append(step)
        self.renamed.append((old, new))
        self.retired_tables.add(old.shown.lower())
        if old.shown.lower() in self.retired:
            self.retired[new.shown.lower()] = self.retired.pop(old.shown.lower())
        self.altered.add(oid)
        self.sent.add(oid)

    def _published_columns(self, oid: int, old: _Table, new: _Table, where: str) -> None:
        """The column steps of a published table, as the remotes that hold it
        can follow them (docs/site-database.md, "Schema changes"): its
        SUBSCRIBE BY column, a column an article lists and a follow key
        column are neither dropped nor renamed, nor is a key column dropped;
        a retired name is not given again.  A column takes a new type only
        when it travels as before (its row of the types table: varchar(20)
        to varchar(40), integer to bigint): the remotes then change nothing,
        and the step is the consolidated's only."""
        article, table = self.articles[oid], new.shown
        gone = self.retired.setdefault(table.lower(), set())
        keys = {old.columns[number][0].lower() for number in old.key}
        steps, retyped, recorded = [], [], []
        for number, (name, type_oid, modifier) in old.columns.items():
            now, lowered = new.columns.get(number), name.lower()
            if now is None:
                if lowered in article.subscribe_by | article.listed | article.route | keys:
                    raise SchemaRefused(f"{where}: {table}.{name} is needed by its article (the SUBSCRIBE BY "
                                        "column, a listed or a key column, or a column a follow route names): "
                                        "dropping it is refused")
                gone.add(lowered)
                steps.append(("drop_column", table, name))
            elif now[0] != name:
                if lowered in article.subscribe_by | article.listed | article.route:
                    raise SchemaRefused(f"{where}: {table}.{name} is the SUBSCRIBE BY column, a column the article "
                                        "lists or a column a follow route names: renaming it is not supported yet")
                if now[0].lower() in gone:
                    raise SchemaRefused(f"{where}: {table}.{now[0]} was a column of the published table before "
                                        "(renamed or dropped): rows in the old shape may still carry that name; "
                                        "choose another")
                gone.add(lowered)
                steps.append(("rename_column", table, name, now[0]))
            if now is not None and now[1:] != (type_oid, modifier):
                retyped.append((name, now[0]))
        added = [name for number, (name, _type, _modifier) in new.columns.items() if number not in old.columns]
        kinds = self._kinds(new) if added or retyped else {}
        if retyped:
            travelled = self._travelling(oid)
            for name, now_named in retyped:
                if travelled.get(name) != kinds[now_named]:
                    raise SchemaRefused(f"{where}: changing the type of column {table}.{now_named} of a published "
                                        f"table is refused: it travels as {travelled.get(name, 'a new column')} and "
                                        f"would travel as {kinds[now_named]} (a type that travels as before is "
                                        "taken: varchar(20) to varchar(40), integer to bigint)")
                recorded.append(("retype_column", table, now_named))
            self.altered.add(oid)  # captured in a new shape: its declared type changed
        if added:
            for name in added:
                if name.lower() in gone:
                    raise SchemaRefused(f"{where}: {table}.{name} was a column of the published table before "
                                        "(renamed or dropped): rows in the old shape may still carry that name; "
                                        "choose another")
                steps.append(("add_column", table, name,
                              added_column_sql(name, kinds[name], _default(self.conn, oid, name, kinds[name], table))))
        if steps:
            self.steps += steps
            self.published += steps
            self.altered.add(oid)
            self.sent.add(oid)
        self.steps += recorded

    def _travelling(self, oid: int) -> dict[str, str]:
        """Each column's row of the types table in the shape the table is
        captured in now (before this change)."""
        found = self.conn.execute("SELECT s.columns, s.kinds FROM fieldsync.article a JOIN fieldsync.shape s"
                                  " ON s.id = a.shape WHERE a.table_oid = %s LIMIT 1", (oid,)).fetchone()
        return {} if found is None else dict(zip(found[0], found[1]))

    def _kinds(self, table: _Table) -> dict[str, str]:
        """Each column's row of the types table, as capture will read it."""
        try:
            layout = describe_table(self.conn, table.shown).layout
        except UnpublishableTable as error:  # a column of a type outside the types table
            said = str(error).removeprefix(f"cannot publish table {table.shown}: ")
            raise SchemaRefused(f"{table.shown} is published, and a column added to it cannot travel: {said}"
                                ) from None
        return dict(zip(layout.columns, layout.kinds))


def _columns(old: _Table, new: _Table) -> list[tuple]:
    """The column steps between two states of a table no article holds."""
    steps: list[tuple] = []
    for number, (name, type_oid, modifier) in old.columns.items():
        now = new.columns.get(number)
        if now is None:
            steps.append(("drop_column", new.shown, name))
        elif now[0] != name:
            steps.append(("rename_column", new.shown, name, now[0]))
        elif now[1:] != (type_oid, modifier):
            steps.append(("redefine", new.shown))
    steps += [("add_column", new.shown, column, None) for number, (column, _type, _modifier) in new.columns.items()
              if number not in old.columns]
    return steps


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
