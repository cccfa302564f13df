"""Rows that follow their parent at a PostgreSQL consolidated: an article
``CHILD@->PARENT`` sends a child row to the subscribers that get the
parent row its foreign key references (docs/site-database.md, "Rows that
follow their parent"; docs/postgres.md, "Rows that follow their parent").

Rules of this file:
* The rules are a SQLite site's (agent/site/sqlite/route.py): the parent is
  an article of the same publication, published first; the chain's root
  has a SUBSCRIBE BY column; a chain that comes back to a table in it, and
  a foreign key that is missing or ambiguous, are refused with one line.
* A child's *route* is the root's SUBSCRIBE BY value, as it travels, looked
  up through the foreign keys when the row is captured, one level at a
  time, and stored after the row's images (agent.site.capture.ROUTE):
  readers select on it as on a column, with no query per row or per
  subscriber.
* Under concurrency the look-up locks each parent row it reads ``FOR
  SHARE``: a transaction that changes a parent's route (its SUBSCRIBE BY
  value, or its own foreign key) waits for every open transaction that
  wrote a child under it, and a child written under a parent whose route
  is being changed waits for that change to commit, then reads the new
  route.  Either way the move and the child's own capture row agree, and
  the log puts the one that committed first first.
* When a followed row's route changes, its *move trigger* (``0fieldsync_move``,
  which fires before the row's own capture trigger) writes an UPDATE
  capture row for every descendant, the deepest first, whose old and new
  routes are the row's: a DELETE for the subscribers that lose it, an
  INSERT of the whole row for those that gain it, in the same transaction.
* Only this file reads the catalogue's follow columns.
* Functions here run inside the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import psycopg
from psycopg import sql

from ..errors import PublicationError
from ..follow_rules import chosen_key
from .capture import CaptureRoute, PgShape, load_shapes, shown_table
from .errors import ValueNotConvertible
from .schema import SCHEMA
from .typemap import KINDS, dump

MOVE_TRIGGER = "0fieldsync_move"

_ARTICLE = ("SELECT a.table_schema, a.table_name, a.publication, a.subscribe_by, a.follows, a.follow_columns,"
            " a.parent_columns, a.shape, a.table_oid FROM fieldsync.article a")


@dataclass(frozen=True, slots=True)
class Level:
    """One step up a chain: the rows of ``schema.table`` whose ``match``
    columns hold the values below, and what is read of them: the columns
    of the next step's foreign key, or at the root its SUBSCRIBE BY
    column (``read``, one column, of types table row ``kind``)."""

    schema: str
    table: str
    match: tuple[str, ...]
    read: tuple[str, ...]
    kind: str | None  # the root's SUBSCRIBE BY kind; None below it


@dataclass(frozen=True, slots=True)
class Chain:
    """How a follow article's row finds its route: its foreign key
    ``columns``, then the levels up to the root."""

    columns: tuple[str, ...]
    levels: tuple[Level, ...]

    @property
    def kind(self) -> str:
        kind = self.levels[-1].kind
        assert kind is not None
        return kind


def _rows(conn: psycopg.Connection) -> list[tuple]:
    """Every article (a table in each publication that holds it)."""
    return conn.execute(_ARTICLE + " ORDER BY a.table_schema, a.table_name, a.publication").fetchall()


def _articles(conn: psycopg.Connection) -> dict[tuple[str, str], tuple]:
    """An article of each published table, by (schema, table): the one that
    follows its parent when there is one (a table follows in one
    publication at most); the articles of a table share its shape."""
    return {(row[0], row[1]): row for row in sorted(_rows(conn), key=lambda row: row[4] is not None)}


def _parent_article(rows: list[tuple], shown: str, publication: str) -> tuple | None:
    """The article of ``shown`` in ``publication`` (a chain lies in one publication)."""
    return next((row for row in rows if shown_table(row[0], row[1]) == shown and row[2] == publication), None)


def _followed_in(rows: list[tuple], parent: str) -> str:
    """The publication in which rows follow ``parent`` (one at most)."""
    return next(row[2] for row in rows if row[4] == parent)


def resolve(conn: psycopg.Connection, publication: str, schema: str, table: str, oid: int, parent: str,
            named: tuple[str, ...] | None, find: Callable[[str], str | None]
            ) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The follow of ``schema.table`` after ``parent`` (named as PostgreSQL
    resolves it) through its declared foreign key (``named``: the child's
    columns of that key, when it has several; ``find`` finds a column of
    the child): the parent's shown name, the child's columns and the
    parent's columns they reference.  PublicationError naming what is
    wrong."""
    shown = shown_table(schema, table)
    rows = _rows(conn)
    try:
        with conn.transaction():  # a savepoint: a malformed name leaves the caller's transaction usable
            found = conn.execute("SELECT n.nspname, c.relname, c.oid FROM pg_class c JOIN pg_namespace n"
                                 " ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)", (parent,)).fetchone()
    except psycopg.Error:
        found = None
    article = None if found is None else _parent_article(rows, shown_table(found[0], found[1]), publication)
    if article is None:
        raise PublicationError(f"{shown!r} follows {parent!r}, which is not an article of {publication!r}; "
                               f"publish {parent!r} in {publication!r} first (a parent comes before its children)")
    assert found is not None
    parent_shown = shown_table(found[0], found[1])
    if found[2] == oid:
        raise PublicationError(f"{shown!r} cannot follow itself: a follow chain may not come back to a table in it")
    chain = [shown]
    step = article
    while step[4] is not None:  # up to the root
        chain.append(shown_table(step[0], step[1]))
        if step[4] in chain:
            raise PublicationError(f"the follow chain of {shown!r} comes back to {step[4]!r}: a table may "
                                   "appear in a chain once")
        step = _parent_article(rows, step[4], publication)
        assert step is not None
    if step[3] is None:
        raise PublicationError(f"the chain of {shown!r} starts at {shown_table(step[0], step[1])!r}, which has no "
                               f"SUBSCRIBE BY column: its rows go to every subscriber; publish {shown!r} without ->")
    keys = conn.execute(
        "SELECT (SELECT array_agg(a.attname ORDER BY k.position) FROM unnest(c.conkey) WITH ORDINALITY"
        "        AS k (attnum, position) JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum),"
        "       (SELECT array_agg(a.attname ORDER BY k.position) FROM unnest(c.confkey) WITH ORDINALITY"
        "        AS k (attnum, position) JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum)"
        "  FROM pg_constraint c WHERE c.contype = 'f' AND c.conrelid = %s AND c.confrelid = %s ORDER BY c.conname",
        (oid, found[2])).fetchall()
    columns, parent_columns = chosen_key(shown, parent_shown, [(tuple(columns), (tuple(columns), tuple(parents)))
                                                               for columns, parents in keys],
                                         named, lambda column: find(column) or column)
    return parent_shown, columns, parent_columns


def chain_of(conn: psycopg.Connection, parent: str, columns: tuple[str, ...],
             parent_columns: tuple[str, ...], publication: str | None = None) -> Chain:
    """How a row whose ``columns`` reference ``parent``'s ``parent_columns``
    finds its route (the parent, and its own chain, published in
    ``publication``; None: where rows follow ``parent`` already)."""
    rows = _rows(conn)
    publication = publication or _followed_in(rows, parent)
    shapes = load_shapes(conn)
    levels = []
    match, step = parent_columns, _parent_article(rows, parent, publication)
    while step is not None:
        schema, table, _publication, subscribe_by, follows, follow_columns, next_columns, shape_id, _oid = step
        if follows is None:
            layout = shapes[shape_id].layout
            kind = layout.kinds[layout.columns.index(subscribe_by)]
            levels.append(Level(schema, table, tuple(match), (subscribe_by,), kind))
            break
        levels.append(Level(schema, table, tuple(match), tuple(follow_columns), None))
        match, step = tuple(next_columns), _parent_article(rows, follows, publication)
    return Chain(columns, tuple(levels))


def follows(conn: psycopg.Connection) -> dict[tuple[str, str], tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """Every follow article, by (schema, table): its parent's shown name,
    its foreign key columns and the parent columns they reference."""
    return {(row[0], row[1]): (row[4], tuple(row[5]), tuple(row[6]))
            for row in _articles(conn).values() if row[4] is not None}


def chains(conn: psycopg.Connection) -> dict[tuple[str, str], Chain]:
    """The chain of every follow article, by (schema, table)."""
    return {table: chain_of(conn, parent, columns, parent_columns)
            for table, (parent, columns, parent_columns) in follows(conn).items()}


# -- the route as a value: extraction, the apply's filters, rows written by hand


def route_expression(chain: Chain, values: list[sql.Composable]) -> sql.Composable:
    """The route's capture text for a row whose foreign key columns hold
    ``values`` (SQL expressions): nested scalar subqueries, one indexed
    look-up per level, read in the statement's snapshot (no lock)."""
    def level_at(depth: int, below: list[sql.Composable]) -> sql.Composable:
        level = chain.levels[depth]
        alias = sql.Identifier(f"fieldsync_r{depth}")
        where = sql.SQL(" AND ").join(sql.SQL("{}.{} = {}").format(alias, sql.Identifier(column), value)
                                      for column, value in zip(level.match, below))
        if level.kind is not None:
            read = sql.SQL(KINDS[level.kind].capture).format(sql.SQL("{}.{}").format(
                alias, sql.Identifier(level.read[0])))
        else:
            read = level_at(depth + 1, [sql.SQL("{}.{}").format(alias, sql.Identifier(column))
                                        for column in level.read])
        return sql.SQL("(SELECT {} FROM {} AS {} WHERE {})").format(
            read, sql.Identifier(level.schema, level.table), alias, where)
    return level_at(0, values)


# -- triggers


def _lookups(chain: Chain, image: str, shapes_of: str) -> tuple[list[str], list[str]]:
    """The PL/pgSQL declarations and statements that set ``fieldsync_route_<image>``
    (text) to the route of the row ``image`` (OLD or NEW) of a table whose
    foreign key is ``chain.columns``, locking each parent row it reads FOR
    SHARE (see the rules above)."""
    declarations, statements = [], []
    values = [f'{image}.{_quote(column)}' for column in chain.columns]
    for depth, level in enumerate(chain.levels):
        table = f"{_quote(level.schema)}.{_quote(level.table)}"
        where = " AND ".join(f"fieldsync_p.{_quote(column)} = {value}" for column, value in zip(level.match, values))
        if level.kind is not None:
            read = KINDS[level.kind].capture.format(f"fieldsync_p.{_quote(level.read[0])}")
            statements.append(f"SELECT {read} INTO fieldsync_route_{image.lower()} FROM {table} AS fieldsync_p"
                              f" WHERE {where} FOR SHARE OF fieldsync_p;")
            break
        names = [f"fieldsync_{shapes_of}{image.lower()}_{depth}_{index}" for index in range(len(level.read))]
        declarations += [f"{name} {table}.{_quote(column)}%TYPE;" for name, column in zip(names, level.read)]
        reads = ", ".join(f"fieldsync_p.{_quote(column)}" for column in level.read)
        statements.append(f"SELECT {reads} INTO {', '.join(names)} FROM {table} AS fieldsync_p WHERE {where}"
                          " FOR SHARE OF fieldsync_p;")
        values = names
    return declarations, statements


# The trigger functions' bodies are PL/pgSQL text: names and literals in
# them are quoted by psycopg's own rules.
def _quote(name: str) -> str:
    return sql.Identifier(name).as_string(None)


def _literal(text: str) -> str:
    return sql.Literal(text).as_string(None)


def capture_route(chain: Chain) -> CaptureRoute:
    """What a follow article's capture triggers run to find a row's routes."""
    old_declarations, old = _lookups(chain, "OLD", "")
    new_declarations, new = _lookups(chain, "NEW", "")
    same = " AND ".join(f"OLD.{_quote(column)} IS NOT DISTINCT FROM NEW.{_quote(column)}" for column in chain.columns)
    return CaptureRoute(chain.kind, "\n    ".join(old_declarations + new_declarations), "\n    ".join(old),
                        "\n    ".join(new), same)


def install_moves(conn: psycopg.Connection) -> None:
    """(Re)make the move trigger of every followed table (and drop those of
    tables no longer followed): after any article is added or removed,
    since a move names its descendants' shapes; a table whose rows wait to
    be sent (new_tables.py) is left out until they are."""
    rows = _rows(conn)
    for (oid,) in conn.execute("SELECT tgrelid FROM pg_trigger WHERE tgname = %s", (MOVE_TRIGGER,)).fetchall():
        found = conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n"
                             " ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,)).fetchone()
        conn.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(MOVE_TRIGGER), sql.Identifier(*found)))
    # A table whose rows wait to be sent (new_tables.py) is no descendant
    # yet: its rows go with the route they have when they are sent.
    waiting = set(conn.execute("SELECT n.nspname, c.relname FROM fieldsync.table_send w JOIN pg_catalog.pg_class c"
                               " ON c.oid = w.table_oid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                               ).fetchall())
    followed = {table: follow for table, follow in follows(conn).items() if table not in waiting}
    if not followed:
        return
    shapes = load_shapes(conn)
    children: dict[str, list[tuple[str, str]]] = {}
    for table, (parent, _columns, _parent_columns) in followed.items():
        children.setdefault(parent, []).append(table)
    for parent in children:  # its article where rows follow it
        row = _parent_article(rows, parent, _followed_in(rows, parent))
        if row is not None:
            _install_move(conn, row, children, followed, shapes)


def _install_move(conn: psycopg.Connection, article: tuple, children: dict[str, list[tuple[str, str]]],
                  followed: dict, shapes: dict[int, PgShape]) -> None:
    schema, table, _publication, subscribe_by, parent, columns, parent_columns, _shape, oid = article
    table_sql = f"{_quote(schema)}.{_quote(table)}"
    if parent is None:
        layout = shapes[article[7]].layout
        capture = KINDS[layout.kinds[layout.columns.index(subscribe_by)]].capture
        declarations: list[str] = []
        routes = [f"fieldsync_route_old := {capture.format('OLD.' + _quote(subscribe_by))};",
                  f"fieldsync_route_new := {capture.format('NEW.' + _quote(subscribe_by))};"]
        when = f"OLD.{_quote(subscribe_by)} IS DISTINCT FROM NEW.{_quote(subscribe_by)}"
    else:
        chain = chain_of(conn, parent, tuple(columns), tuple(parent_columns), article[2])
        old_declarations, old = _lookups(chain, "OLD", "m")
        new_declarations, new = _lookups(chain, "NEW", "m")
        declarations, routes = old_declarations + new_declarations, old + new
        when = (f"ROW({', '.join('OLD.' + _quote(c) for c in columns)}) IS DISTINCT FROM"
                f" ROW({', '.join('NEW.' + _quote(c) for c in columns)})")
    # Every descendant, level by level, with the condition that picks its rows
    # under the changed row (by its old or new key: a cascade of a key
    # change runs after this trigger).
    shown = shown_table(schema, table)
    level = []
    for child in children[shown]:
        _parent, child_columns, keys = followed[child]
        row_of = f"ROW({', '.join('fieldsync_c.' + _quote(c) for c in child_columns)})"
        level.append((child, f"({row_of} = ROW({', '.join('OLD.' + _quote(k) for k in keys)}) OR {row_of} ="
                             f" ROW({', '.join('NEW.' + _quote(k) for k in keys)}))", []))
    articles = _articles(conn)
    levels: list[list[str]] = []
    while level:
        deeper = []
        levels.append([])
        for (child_schema, child_table), under, above in level:
            child_sql = f"{_quote(child_schema)}.{_quote(child_table)}"
            shape = shapes[articles[(child_schema, child_table)][7]]
            images = [KINDS[kind].capture.format(f"fieldsync_c.{_quote(column)}")
                      for column, kind in zip(shape.layout.columns, shape.layout.kinds)]
            # Only while the tables it reads are there: an application may drop
            # a followed table, and its parent's writes must not fail for it.
            present = " AND ".join(f"pg_catalog.to_regclass({_literal(name)}) IS NOT NULL"
                                   for name in [*above, child_sql])
            levels[-1].append(f"IF {present} THEN INSERT INTO {SCHEMA}.capture (shape, kind, v) SELECT {shape.id}, 2,"
                              f" ARRAY[{', '.join(images + images)}, fieldsync_route_old, fieldsync_route_new]"
                              f" FROM {child_sql} AS fieldsync_c WHERE {under}; END IF;")
            for grand in children.get(shown_table(child_schema, child_table), []):
                _parent, grand_columns, keys = followed[grand]
                deeper.append((grand, f"ROW({', '.join('fieldsync_c.' + _quote(c) for c in grand_columns)}) IN"
                                      f" (SELECT {', '.join('fieldsync_c.' + _quote(k) for k in keys)}"
                                      f" FROM {child_sql} AS fieldsync_c WHERE {under})", [*above, child_sql]))
        level = deeper
    # The deepest rows first: a remote that loses them deletes each row
    # before its parent (docs/site-database.md, "Rows that follow their parent").
    body = [statement for statements in reversed(levels) for statement in statements]
    function = sql.Identifier(SCHEMA, f"move_{oid}")
    lines = ["DECLARE", "fieldsync_route_old text;", "fieldsync_route_new text;", *declarations, "BEGIN", *routes,
             "IF fieldsync_route_old IS NOT DISTINCT FROM fieldsync_route_new THEN", "    RETURN NULL;", "END IF;",
             *body, "RETURN NULL;"]
    text = "\n    ".join(lines) + "\nEND"
    conn.execute(sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER"
                         " AS {}").format(function, sql.Literal(text)))
    conn.execute(sql.SQL("CREATE TRIGGER {} AFTER UPDATE ON {} FOR EACH ROW WHEN ({}) EXECUTE FUNCTION {}()").format(
        sql.Identifier(MOVE_TRIGGER), sql.SQL(table_sql), sql.SQL(when), function))


# -- routes looked up by the apply path


@dataclass(frozen=True, slots=True)
class RouteFinder:
    """The route of a row of a follow article, from the values of its
    foreign key as they travel: its capture text (:meth:`text`), or the
    value as it travels (:meth:`value`), read in the apply's transaction."""

    conn: psycopg.Connection
    publication: str
    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    query: sql.Composable
    kind: str

    def text(self, key: Sequence[Any]) -> str | None:
        try:
            params = [dump(KINDS[kind], column, value) for kind, column, value in zip(self.kinds, self.columns, key)]
        except ValueNotConvertible:  # no parent here can hold it
            return None
        try:
            with self.conn.transaction():  # a savepoint: a value its column's type refuses names no parent
                found = self.conn.execute(self.query, params).fetchone()
        except (psycopg.DataError, psycopg.IntegrityError):
            return None
        return None if found is None else found[0]

    def value(self, key: Sequence[Any]) -> Any:
        text = self.text(key)
        return None if text is None else KINDS[self.kind].load(text)


def finders(conn: psycopg.Connection) -> dict[tuple[str, str], RouteFinder]:
    """A route finder for every follow article, by (schema, table)."""
    shapes = load_shapes(conn)
    found = {}
    for (schema, table), chain in chains(conn).items():
        article = _articles(conn)[(schema, table)]
        layout = shapes[article[7]].layout
        positions = [layout.columns.index(column) for column in chain.columns]
        query = sql.SQL("SELECT {}").format(route_expression(chain, [
            sql.SQL("%s::{}").format(sql.SQL(layout.declared[position])) for position in positions]))
        found[(schema, table)] = RouteFinder(conn, article[2], chain.columns,
                                             tuple(layout.kinds[position] for position in positions), query,
                                             chain.kind)
    return found
