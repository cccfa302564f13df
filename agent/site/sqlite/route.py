"""Rows that follow their parent: an article ``CHILD@->PARENT`` sends a
child row to the subscribers that get the parent row its foreign key
references (docs/site-database.md, "Rows that follow their parent").

Rules of this file:
* A child's *route* is the SUBSCRIBE BY value of the root of its chain
  (the first article up the chain partitioned by a column), looked up
  through the foreign keys when the row is captured: one indexed look-up
  per level per changed row, at the consolidated only.  Readers then
  select on the route as on a column of the row, with no query per row or
  per subscriber.
* A follow article stores its foreign key columns, the parent columns they
  reference and a *route template*: an SQL expression with ``{0}``,
  ``{1}``, ... for the child's key values and ``{schema}`` for the schema
  the tables are read from.  Capture triggers, rows written by hand and
  extraction fill it in; the catalogue is the one source.
* When a followed row's route changes (its SUBSCRIBE BY value, or its own
  foreign key to a parent with another route), a *move trigger* writes an
  UPDATE capture row for every descendant, the deepest first, whose old
  and new routes differ: readers turn it into a DELETE for the old
  subscribers and an INSERT of the full row for the new ones, in the same
  log transaction.
* Capture rows of a follow article hold the old route after the values of
  the widest UPDATE (value column ``2 * width``) and the new route after it
  (``2 * width + 1``).
* A chain that comes back to a table in it is refused; so is a child of a
  table that is not in the same publication, or a chain whose root has no
  SUBSCRIBE BY column.  Only this file reads the catalogue's follow columns.
* A remote's catalogue holds its follows too (written at extraction, with
  no route template): a row that follows its parent lives and dies with it
  there.  The connection that applies a peer's changes gets TEMP triggers
  (:func:`install_apply_triggers`): at the consolidated a row whose foreign
  key names no parent is refused (``NO_PARENT``), at a remote the
  consolidated's DELETE of a parent takes the rows that follow it along,
  each recorded as it went (a capture row flagged ``FLAG_WITH_PARENT``).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Callable, Sequence

from ..capture import FLAG_WITH_PARENT, KIND_DELETE
from ..errors import PublicationError
from ..follow_rules import chosen_key
from ._db import quote_ident

# The catalogue's columns read as a plan's (table, publication, columns,
# subscribe_by): a follow article's subscribe_by is agent.site.capture.ROUTE.
ARTICLE_ROWS = ("SELECT table_name, publication, columns,"
                " CASE WHEN follows IS NULL THEN subscribe_by ELSE char(0) || 'route' END FROM fieldsync_article")
MOVE_PREFIX = "fieldsync_move_"


@dataclass(frozen=True, slots=True)
class Follow:
    """How ``table`` follows ``parent``: its ``columns`` reference the
    parent's ``parent_columns``; ``template`` computes a row's route from
    the values of ``columns`` (empty at a remote, which has no routes)."""

    table: str
    parent: str
    columns: tuple[str, ...]
    parent_columns: tuple[str, ...]
    template: str

    def route(self, values: Sequence[str], schema: str = "") -> str:
        """The route of a row whose ``columns`` hold the SQL ``values``."""
        return self.template.format(*values, schema=schema)


def follows(conn: sqlite3.Connection) -> dict[str, Follow]:
    """Every follow article, by lowered table name."""
    found = {}
    for table, parent, columns, parent_columns, template in conn.execute(
            "SELECT table_name, follows, follow_columns, parent_columns, route_sql FROM fieldsync_article"
            " WHERE follows IS NOT NULL"):
        found[table.lower()] = Follow(table, parent, tuple(json.loads(columns)), tuple(json.loads(parent_columns)),
                                      template or "")
    return found


def resolve(conn: sqlite3.Connection, publication: str, table: str, parent: str,
            named: tuple[str, ...] | None) -> Follow:
    """The follow of ``table`` (its real name) after ``parent`` through its
    declared foreign key (``named``: the child's columns of that key, when
    it has several); PublicationError naming what is wrong."""
    article = conn.execute("SELECT table_name, publication, subscribe_by, follows FROM fieldsync_article"
                           " WHERE table_name = ? AND publication = ?", (parent, publication)).fetchone()
    if article is None:
        raise PublicationError(f"{table!r} follows {parent!r}, which is not an article of {publication!r}; "
                               f"publish {parent!r} in {publication!r} first (a parent comes before its children)")
    parent = article[0]
    if parent.lower() == table.lower():
        raise PublicationError(f"{table!r} cannot follow itself: a follow chain may not come back to a table in it")
    chain = [table.lower()]
    step = article
    while step[3] is not None:  # up to the root
        chain.append(step[0].lower())
        if step[3].lower() in chain:
            raise PublicationError(f"the follow chain of {table!r} comes back to {step[3]!r}: a table may "
                                   "appear in a chain once")
        step = conn.execute("SELECT table_name, publication, subscribe_by, follows FROM fieldsync_article"
                            " WHERE table_name = ? AND publication = ?", (step[3], publication)).fetchone()
    if step[2] is None:
        raise PublicationError(f"the chain of {table!r} starts at {step[0]!r}, which has no SUBSCRIBE BY column: "
                               f"its rows go to every subscriber; publish {table!r} without ->")
    keys: dict[int, list[tuple[str, str | None]]] = {}
    for row in conn.execute(f"PRAGMA foreign_key_list({quote_ident(table)})"):
        if row[2].lower() == parent.lower():
            keys.setdefault(row[0], []).append((row[3], row[4]))
    pairs = chosen_key(table, parent, [(tuple(child for child, _ in pairs), tuple(pairs))
                                       for _, pairs in sorted(keys.items())], named, str.lower)
    columns = tuple(child for child, _ in pairs)
    parent_columns = tuple(to for _, to in pairs)
    if any(to is None for to in parent_columns):  # REFERENCES parent: its primary key
        parent_columns = tuple(row[1] for row in sorted(
            (row for row in conn.execute(f"PRAGMA table_info({quote_ident(parent)})") if row[5]),
            key=lambda row: row[5]))
    if len(parent_columns) != len(columns):
        raise PublicationError(f"the foreign key of {table!r} to {parent!r} does not match {parent!r}'s key")
    return Follow(table, parent, columns, parent_columns, _template(conn, publication, parent, parent_columns, 0))


def _template(conn: sqlite3.Connection, publication: str, table: str, match: tuple[str, ...], depth: int) -> str:
    """The route template of the row of ``table`` (its article in
    ``publication``) whose ``match`` columns equal ``{0}``, ``{1}``, ...
    (at ``depth`` of nesting, for aliases)."""
    alias = f"fieldsync_r{depth}"
    article = conn.execute("SELECT subscribe_by, follows, follow_columns, parent_columns FROM fieldsync_article"
                           " WHERE table_name = ? AND publication = ?", (table, publication)).fetchone()
    where = " AND ".join(f"{alias}.{_brace(quote_ident(column))} = {{{index}}}" for index, column in enumerate(match))
    source = f"{{schema}}{_brace(quote_ident(table))} AS {alias}"
    if article[1] is None:
        return f"(SELECT {alias}.{_brace(quote_ident(article[0]))} FROM {source} WHERE {where})"
    inner = _template(conn, publication, article[1], tuple(json.loads(article[3])), depth + 1)
    columns = [f"{alias}.{_brace(quote_ident(column))}" for column in json.loads(article[2])]
    # The inner template's {0}, {1}, ... become this row's key columns; its {schema} stays.
    inner = inner.format(*(_brace(column) for column in columns), schema="{schema}")
    return f"(SELECT {inner} FROM {source} WHERE {where})"


def _brace(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def trigger_routes(follow: Follow) -> tuple[str, str]:
    """The old and new route of the row a capture trigger sees."""
    return (follow.route([f"OLD.{quote_ident(column)}" for column in follow.columns]),
            follow.route([f"NEW.{quote_ident(column)}" for column in follow.columns]))


def move_statements(conn: sqlite3.Connection, value_column: Callable[[int], str]) -> list[str]:
    """The move triggers of every followed table (none at a remote)."""
    chains = follows(conn)
    if not chains or conn.execute("SELECT role FROM fieldsync_site WHERE id = 1").fetchone()[0] != "consolidated":
        return []
    children: dict[str, list[Follow]] = {}
    for follow in chains.values():
        children.setdefault(follow.parent.lower(), []).append(follow)
    # A followed table is followed in one publication: its article there
    # says where its rows go (its articles elsewhere may have other subsets).
    chain_of = {table.lower(): publication for table, publication in conn.execute(
        "SELECT table_name, publication FROM fieldsync_article WHERE follows IS NOT NULL")}
    chain_of.update((follow.parent.lower(), chain_of[table]) for table, follow in chains.items())
    articles = {table.lower(): (table, by, shape) for table, publication, by, shape in conn.execute(
        "SELECT table_name, publication, subscribe_by, shape FROM fieldsync_article ORDER BY rowid")
        if chain_of.get(table.lower(), publication) == publication}
    shape_columns = {shape: json.loads(columns) for shape, columns in conn.execute(
        "SELECT id, columns FROM fieldsync_shape")}
    gone = _below_missing(conn, chains)
    statements = []
    for parent in children:
        if parent in gone:
            continue  # a dropped table has no trigger; one whose route reads through it, none that works
        table, subscribe_by, _ = articles[parent]
        own = chains.get(parent)
        if own is None:
            old, new = f"OLD.{quote_ident(subscribe_by)}", f"NEW.{quote_ident(subscribe_by)}"
        else:
            old, new = trigger_routes(own)
        levels: list[list[str]] = []
        # Every descendant, level by level, with the condition that picks its
        # rows under the changed row (row values: composite keys too).
        level = [(follow, f"{_row(follow.columns)} = {_row(follow.parent_columns, 'NEW.')}")
                 for follow in children[parent] if follow.table.lower() not in gone]
        if not level:
            continue
        while level:
            deeper = []
            levels.append([])
            for follow, under in level:
                child, _, shape = articles[follow.table.lower()]
                names = ", ".join(quote_ident(column) for column in shape_columns[shape])
                targets = ", ".join(value_column(index) for index in range(2 * len(shape_columns[shape]) + 2))
                levels[-1].append(f"INSERT INTO fieldsync_capture (shape, kind, {targets}) SELECT {shape}, 2, "
                                  f"{names}, {names}, {old}, {new} FROM {quote_ident(child)} WHERE {under}")
                for grand in children.get(follow.table.lower(), []):
                    if grand.table.lower() in gone:
                        continue
                    deeper.append((grand, f"{_row(grand.columns)} IN (SELECT "
                                          f"{', '.join(quote_ident(c) for c in grand.parent_columns)} FROM "
                                          f"{quote_ident(child)} WHERE {under})"))
            level = deeper
        # The deepest rows first (each statement reads the rows as the UPDATE
        # left them, in any order): a remote that loses them deletes each row
        # before its parent, so none goes along with its parent unrecorded,
        # which would lose a change of the remote's own to it when the same
        # transaction brings it back.
        body = [statement for statements_of_level in reversed(levels) for statement in statements_of_level]
        statements.append(f"CREATE TRIGGER {quote_ident(MOVE_PREFIX + table)} AFTER UPDATE ON {quote_ident(table)}"
                          f" FOR EACH ROW WHEN ({old}) IS NOT ({new}) BEGIN {'; '.join(body)}; END")
    return statements


def _below_missing(conn: sqlite3.Connection, chains: dict[str, Follow]) -> set[str]:
    """The tables of follow chains (lowered) that the database no longer
    has (an application dropped or renamed them: missing_tables), and
    those that follow one of them: no trigger may name them, or every
    UPDATE of the table it is on would fail (SQLite looks a trigger's
    tables up when a statement that fires it is prepared)."""
    present = {name.lower() for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    tables = {*chains, *(follow.parent.lower() for follow in chains.values())}
    gone = {table for table in tables if table not in present}
    grew = bool(gone)
    while grew:  # down the chains, a level at a time (a chain never comes back to a table)
        below = {table for table, follow in chains.items() if follow.parent.lower() in gone} - gone
        gone |= below
        grew = bool(below)
    return gone


def _row(columns: Sequence[str], prefix: str = "") -> str:
    return f"({', '.join(prefix + quote_ident(column) for column in columns)})"


def row_routes(conn: sqlite3.Connection, table: str, columns: Sequence[str], kind: int,
               values: Sequence) -> list:
    """The route values a capture row of ``table`` written by hand needs
    after its ``values`` (in shape ``columns`` order: old then new for an
    UPDATE): none for a table that follows no parent, nor at a remote
    (its follows have no route template, its capture rows no routes)."""
    follow = follows(conn).get(table.lower())
    if follow is None or not follow.template:
        return []
    positions = [list(columns).index(column) for column in follow.columns]
    images = [values[:len(columns)]] + ([values[len(columns):2 * len(columns)]] if kind == 2 else [])
    routes = []
    for image in images:
        placeholders = ["?"] * len(positions)
        routes.append(conn.execute(f"SELECT {follow.route(placeholders)}",
                                   [image[position] for position in positions]).fetchone()[0])
    return routes


def record_follow(conn: sqlite3.Connection, follow: Follow) -> None:
    """At a remote being extracted: its article of ``follow.table`` follows
    its parent (no route template: a remote routes nothing)."""
    conn.execute("UPDATE fieldsync_article SET follows = ?, follow_columns = ?, parent_columns = ?"
                 " WHERE table_name = ?",
                 (follow.parent, json.dumps(follow.columns), json.dumps(follow.parent_columns), follow.table))


# How a row refused by the consolidated's parent check is recorded, from the start.
NO_PARENT = "no parent row"
APPLY_PREFIX = "fieldsync_follow_"


def apply_triggers(conn: sqlite3.Connection, chains: dict[str, Follow]) -> list[str]:
    """The TEMP triggers of the connection that applies a peer's changes.
    At the consolidated: an INSERT, or an UPDATE of its foreign key, that
    leaves a row of a follow article naming no parent is refused (the row
    would have no route and reach nobody).  At a remote: a DELETE of a
    parent first deletes the rows that follow it (it left the remote's
    subset, or is gone, and they with it: the consolidated routes them by
    it); the remote's capture triggers skip those writes, as every write of
    the apply path.  A remote's table that carries no foreign key to its
    parent (a copy extracted from PostgreSQL before extraction carried
    them, docs/postgres.md) gets the consolidated's
    parent check too, refusing what the key would: a row the consolidated
    sent before it applied the remote's DELETE of its parent must not stay
    there without it."""
    # Only tables and columns this site has (an application may have dropped
    # or renamed one since it was published): a trigger naming another
    # would fail every write of its table.
    chains = {name: follow for name, follow in chains.items()
              if _has_columns(conn, follow.table, follow.columns)
              and _has_columns(conn, follow.parent, follow.parent_columns)}
    if not chains:
        return []
    if conn.execute("SELECT role FROM fieldsync_site WHERE id = 1").fetchone()[0] == "consolidated":
        return [statement for follow in chains.values() for statement in _parent_checks(follow)]
    children: dict[str, list[Follow]] = {}
    for follow in chains.values():
        children.setdefault(follow.parent, []).append(follow)
    shapes = {table.lower(): (shape, json.loads(columns)) for table, shape, columns in conn.execute(
        "SELECT a.table_name, a.shape, s.columns FROM fieldsync_article a JOIN fieldsync_shape s ON s.id = a.shape")}
    statements = [statement for follow in chains.values() if not _keyed(conn, follow)
                  for statement in _parent_checks(follow)]
    for parent, followers in children.items():
        body = []
        for follow in followers:
            under = _equal(follow.columns, [f"OLD.{quote_ident(key)}" for key in follow.parent_columns])
            shape = shapes.get(follow.table.lower())
            if shape is not None and _has_columns(conn, follow.table, shape[1]):  # as they go: apply/followers.py
                targets = ", ".join(f"v{index}" for index in range(len(shape[1])))
                names = ", ".join(quote_ident(column) for column in shape[1])
                body.append(f"INSERT INTO fieldsync_capture (shape, kind, flags, {targets}) SELECT {shape[0]},"
                            f" {KIND_DELETE}, {FLAG_WITH_PARENT}, {names} FROM {quote_ident(follow.table)}"
                            f" WHERE {under}")
            body.append(f"DELETE FROM {quote_ident(follow.table)} WHERE {under}")
        statements.append(f"CREATE TEMP TRIGGER {quote_ident(f'{APPLY_PREFIX}delete_{parent}')} BEFORE DELETE"
                          f" ON main.{quote_ident(parent)} BEGIN {'; '.join(body)}; END")
    return statements


def _parent_checks(follow: Follow) -> list[str]:
    """The consolidated's triggers that refuse a row of ``follow.table``
    whose foreign key names no parent (NULL in it names none: no check)."""
    new = [f"NEW.{quote_ident(column)}" for column in follow.columns]
    message = (f"{NO_PARENT}: no {follow.parent} row has the key this {follow.table} row names"
               f" (it follows {follow.parent})")
    when = (" AND ".join(f"{value} IS NOT NULL" for value in new) + f" AND NOT EXISTS (SELECT 1 FROM"
            f" main.{quote_ident(follow.parent)} WHERE {_equal(follow.parent_columns, new)})")
    raised = "SELECT RAISE(ABORT, '" + message.replace("'", "''") + "')"
    columns = ", ".join(quote_ident(column) for column in follow.columns)
    return [f"CREATE TEMP TRIGGER {quote_ident(f'{APPLY_PREFIX}{event.lower()}_{follow.table}')} BEFORE {event}{of}"
            f" ON main.{quote_ident(follow.table)} WHEN {when} BEGIN {raised}; END"
            for event, of in (("INSERT", ""), ("UPDATE", f" OF {columns}"))]


def _keyed(conn: sqlite3.Connection, follow: Follow) -> bool:
    """Whether ``follow.table`` declares the foreign key it follows its parent by here."""
    keys: dict[int, list[tuple[str, str, str]]] = {}
    primary: dict[str, list[str]] = {}  # a parent's key, which a REFERENCES without columns names
    for key_id, seq, parent, column, referenced, *_ in conn.execute(
            f"PRAGMA foreign_key_list({quote_ident(follow.table)})"):
        if referenced is None:
            if parent not in primary:
                primary[parent] = [name for _, name in sorted((row[5], row[1]) for row in conn.execute(
                    f"PRAGMA table_info({quote_ident(parent)})") if row[5])]
            referenced = primary[parent][seq] if seq < len(primary[parent]) else ""
        keys.setdefault(key_id, []).append((parent.lower(), column.lower(), referenced.lower()))
    wanted = sorted((follow.parent.lower(), column.lower(), referenced.lower())
                    for column, referenced in zip(follow.columns, follow.parent_columns))
    return any(sorted(columns) == wanted for columns in keys.values())


def _has_columns(conn: sqlite3.Connection, table: str, columns: Sequence[str]) -> bool:
    present = {row[1].lower() for row in conn.execute(f"PRAGMA table_info({quote_ident(table)})")}
    return bool(present) and all(column.lower() in present for column in columns)


def _equal(columns: Sequence[str], values: Sequence[str]) -> str:
    return " AND ".join(f"{quote_ident(column)} = {value}" for column, value in zip(columns, values))


def install_apply_triggers(conn: sqlite3.Connection, statements: list[str]) -> None:
    """Make the connection's TEMP triggers those ``statements`` (of
    :func:`apply_triggers`) make; checked at every batch: a rolled-back
    batch takes the TEMP triggers it made with it."""
    wanted = [statement.replace("CREATE TEMP TRIGGER", "CREATE TRIGGER", 1)  # as sqlite_temp_master holds it
              for statement in statements]
    present = conn.execute("SELECT name, sql FROM sqlite_temp_master WHERE type = 'trigger' AND name LIKE ?",
                           (APPLY_PREFIX + "%",)).fetchall()
    if sorted(sql for _, sql in present) == sorted(wanted):
        return
    for name, _ in present:
        conn.execute(f"DROP TRIGGER temp.{quote_ident(name)}")
    for statement in wanted:
        conn.execute(statement.replace("CREATE TRIGGER", "CREATE TEMP TRIGGER", 1))


def parent_missing(conn: sqlite3.Connection, follow: Follow, row: dict) -> bool:
    """Whether ``row`` (column values, its foreign key among them) names a
    parent this site does not hold."""
    if any(row.get(column) is None for column in follow.columns):
        return False
    match = _equal(follow.parent_columns, ["?"] * len(follow.columns))
    return conn.execute(f"SELECT 1 FROM {quote_ident(follow.parent)} WHERE {match}",
                        [row[column] for column in follow.columns]).fetchone() is None
