"""Schema changes at the consolidated: ``agent schema apply`` (docs/site-database.md,
"Schema changes").

Rules of this file:
* One call works inside the caller's write transaction: what the
  statements did, the capture made again and the change's log entry
  commit together, and a refusal (:class:`SchemaRefused`, one line) rolls
  all of it back.
* What a statement would do is asked of SQLite before it runs
  (agent.site.sqlite.ddl.actions), what it did is read after it
  (ddl.differences); both are judged here against the catalogue.
* A change is one capture row (agent.site.change_rows) in a log
  transaction of its own; ``fieldsync_schema_change`` keeps every change:
  the history that maps a remote's rows in an old shape
  (agent/site/sqlite/apply/reshape.py) and keeps a retired name from being given
  again.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Callable, Iterable, NamedTuple

from codec.changes import PASSTHROUGH, RENAME_TABLE

from ..capture import FLAG_RETURN_TO_ORIGIN, KIND_INSERT, KIND_SCHEMA
from ..change_rows import (SCHEMA_SHAPE, SchemaChangeResult, check_fits, drop_change, names_after, row_value,
                           subscriber_change, table_renames)
from ..errors import InvalidSetting, SchemaRefused, WrongRole
from ..identity import Role, SiteIdentity
from ._db import quote_ident
from .capture import ShapeCache, drop_capture, drop_moves, refresh_changed_tables, table_info, value_column
from .ddl import Action, actions, differences, read_schema, split_statements
from .extract import published_table_sql
from .log import cut_locked, log_end
from .publications import drop_publication_locked, remove_article_locked
from .schema import SCHEMA_ROWS
from .route import ARTICLE_ROWS, follows
from .selection import renames


class _Article(NamedTuple):
    """A published table's articles, in every publication that holds it."""

    table: str
    columns: tuple[str, ...] | None  # a column subset (its key included), None: every column (some article's)
    subscribe_by: frozenset[str]  # lowered SUBSCRIBE BY columns
    route: frozenset[str]  # lowered columns a route names: its foreign key, and the key its children follow
    key: tuple[str, ...]  # the table's key columns when the change began
    listed: frozenset[str] = frozenset()  # lowered columns an article with a column subset lists


def _catalogue(conn: sqlite3.Connection) -> dict[str, _Article]:
    rows = conn.execute("SELECT table_name, columns, subscribe_by, follows, follow_columns, parent_columns"
                        " FROM fieldsync_article").fetchall()
    named: dict[str, set[str]] = {}
    for table, _columns, _by, follows, follow_columns, parent_columns in rows:
        if follows is not None:
            named.setdefault(table.lower(), set()).update(c.lower() for c in json.loads(follow_columns))
            named.setdefault(follows.lower(), set()).update(c.lower() for c in json.loads(parent_columns))
    tables = read_schema(conn).tables
    found: dict[str, _Article] = {}
    for table, columns, by, *_ in rows:
        listed = None if columns is None else tuple(json.loads(columns))
        held = found.get(table.lower())
        if held is not None:  # the table is in several publications: what all its articles need
            published = None if held.columns is None or listed is None else tuple(
                dict.fromkeys((*held.columns, *listed)))
            found[table.lower()] = held._replace(
                columns=published, subscribe_by=held.subscribe_by | ({by.lower()} if by else set()),
                listed=held.listed | {column.lower() for column in listed or ()})
            continue
        found[table.lower()] = _Article(table, listed, frozenset({by.lower()} if by else ()),
                                        frozenset(named.get(table.lower(), ())),
                                        tables[table.lower()].key if table.lower() in tables else (),
                                        frozenset(column.lower() for column in listed or ()))
    return found


def schema_version(conn: sqlite3.Connection) -> int | None:
    """The offset of the last change made or applied here (None: none).
    At the consolidated every row is one it made, at a remote one it
    applied (or the consolidated's last at its extraction), so the
    largest offset is the version either way."""
    return conn.execute(f"SELECT max(commit_offset) FROM fieldsync_schema_change WHERE {SCHEMA_ROWS}").fetchone()[0]


def history(conn: sqlite3.Connection) -> list[list]:
    """Every step of the changes made at this site, in order."""
    return [step for (steps,) in conn.execute("SELECT steps FROM fieldsync_schema_change WHERE peer IS NULL"
                                              " ORDER BY commit_offset") for step in json.loads(steps)]


def retired_names(steps: Iterable[list]) -> dict[str, set[str]]:
    """By lowered table (its name now): the lowered column names its
    history renamed away or dropped, under any name it had."""
    retired: dict[str, set[str]] = {}
    for step in steps:
        if step[0] in ("rename_column", "drop_column"):
            retired.setdefault(step[1].lower(), set()).add(step[2].lower())
        elif step[0] == RENAME_TABLE and step[1].lower() in retired:
            retired[step[2].lower()] = retired.pop(step[1].lower())
    return retired


def apply_schema_locked(conn: sqlite3.Connection, identity: SiteIdentity, scripts: Iterable[str], *,
                        unchecked: bool, made_at: str) -> SchemaChangeResult:
    """Run the statements of ``scripts`` as one schema change (inside the
    caller's write transaction); SchemaRefused leaves it to be rolled back."""
    if identity.role is not Role.CONSOLIDATED:
        raise WrongRole(f"{identity.name} is a remote: schema changes are made at the consolidated and reach the "
                        "remotes through their streams")
    statements = [statement for script in scripts for statement in split_statements(script)]
    if not statements:
        raise InvalidSetting("no SQL statement to run")
    refresh_changed_tables(conn)
    cut_locked(conn, identity.name)  # everything before the change, in the old shape
    catalogue = _catalogue(conn)
    steps_before = history(conn)
    retired = retired_names(steps_before)
    retired_tables = set(table_renames(steps_before))
    writer = _ChangeWriter(conn, identity, catalogue, made_at)
    for number, statement in enumerate(statements, 1):
        where = f"statement {number} ({' '.join(statement.split())[:60]})"
        try:
            altered, writes = _judge(actions(conn, statement), catalogue, unchecked, where)
        except sqlite3.Error as error:
            raise SchemaRefused(f"{where}: {error}") from None
        if writes:
            writer.flush()  # a change before it goes first; its rows are captured in the shape of now
        for table in altered:  # SQLite refuses to drop a column a trigger names: made again below
            drop_capture(conn, table)
            drop_moves(conn)
        before = read_schema(conn)
        try:
            conn.execute(statement).fetchall()
        except sqlite3.Error as error:
            raise SchemaRefused(f"{where}: {error}") from None
        after = read_schema(conn)
        for step in differences(before, after):
            _check(step, catalogue, retired, retired_tables, where)
            if step[0] == RENAME_TABLE and step[1].lower() in catalogue:
                _rename_article(conn, catalogue, retired, retired_tables, step)
            writer.add(step)
        if not writes:
            writer.statements.append(statement)  # the change's record; a data statement's rows are the log's
        refresh_changed_tables(conn)
        if writes:
            cut_locked(conn, identity.name)  # the statement's rows, a log transaction of their own
    tables = read_schema(conn).tables
    for name, article in catalogue.items():
        if article.key and (name not in tables or len(tables[name].key) != len(article.key)):
            raise SchemaRefused(f"the statements re-key or drop the published table {article.table}: refused")
    writer.flush()
    return writer.result(len(statements))


def passthrough_locked(conn: sqlite3.Connection, identity: SiteIdentity, scripts: Iterable[str],
                       remotes: Iterable[str], *, made_at: str) -> int:
    """Send the data statements of ``scripts`` to ``remotes`` only, to run
    there as their own writes (docs/site-database.md, "Passthrough"; inside
    the caller's write transaction): one change of passthrough steps,
    alone in its log transaction; nothing runs here.  Returns its commit
    offset; SchemaRefused (nothing logged) for a statement that is no data
    statement here, or a name that is no remote."""
    if identity.role is not Role.CONSOLIDATED:
        raise WrongRole(f"{identity.name} is a remote: passthrough SQL is sent by the consolidated")
    steps, statements = passthrough_steps(
        conn, scripts, remotes, identity.name,
        lambda remote: conn.execute("SELECT 1 FROM fieldsync_remote WHERE name = ?", (remote,)).fetchone() is not None)
    cut_locked(conn, identity.name)  # everything before it: the change is alone in its log transaction
    offset, _ = write_change(conn, identity, ShapeCache(conn), steps, {}, {}, steps, statements, made_at)
    return offset


def passthrough_steps(check: sqlite3.Connection, scripts: Iterable[str], remotes: Iterable[str], site: str,
                      is_remote: Callable[[str], bool], hint: str = "") -> tuple[list[tuple], list[str]]:
    """The steps of passthrough ``scripts`` to ``remotes`` and its
    statements, each checked by preparing it on ``check`` (nothing runs;
    ``hint`` ends the line of one that does not prepare).  SchemaRefused
    for a statement that is no data statement or a name that is no remote
    (``is_remote``) of ``site``."""
    statements = [statement for script in scripts for statement in split_statements(script)]
    targets = list(dict.fromkeys(remotes))
    if not statements:
        raise InvalidSetting("no SQL statement to send")
    if not targets:
        raise InvalidSetting("name the remotes the passthrough SQL goes to (--to REMOTE)")
    for remote in targets:
        if not is_remote(remote):
            raise SchemaRefused(f"no remote named {remote!r} at site {site!r}: nothing was sent")
    for number, statement in enumerate(statements, 1):
        where = f"statement {number} ({' '.join(statement.split())[:60]})"
        try:
            found = actions(check, statement)
        except sqlite3.Error as error:
            raise SchemaRefused(f"{where}: {error}{hint}") from None
        data_only(found, where)
    return [(PASSTHROUGH, remote, statement) for remote in targets for statement in statements], statements


def data_only(found: tuple[Action, ...], where: str) -> None:
    """Refuse a passthrough statement that does anything but read and write
    rows of the application's tables in the main database."""
    for action in found:
        if action.trigger is not None and action.trigger.lower().startswith("fieldsync_"):
            continue  # fieldsync's capture, fired by a write
        names = (action.first, action.second)
        if action.code not in _WRITES:
            what = (_HARD.get(action.code) or _NAMES.get(action.code)
                    or ("a schema change (agent schema apply makes those)" if action.code in _TAKEN
                        else "this kind of statement"))
            raise SchemaRefused(f"{where}: passthrough carries data statements only (INSERT, UPDATE, DELETE), "
                                f"not {what}")
        if any(map(_own, names)) or action.database not in (None, "main"):
            raise SchemaRefused(f"{where}: passthrough writes the application's own tables only")


_HARD = {sqlite3.SQLITE_TRANSACTION: "BEGIN, COMMIT or ROLLBACK", sqlite3.SQLITE_SAVEPOINT: "a savepoint",
         sqlite3.SQLITE_ATTACH: "ATTACH", sqlite3.SQLITE_DETACH: "DETACH"}
_WRITES = (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE)
_TAKEN = (sqlite3.SQLITE_ALTER_TABLE, sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX,
          sqlite3.SQLITE_DROP_INDEX)
_NAMES = {sqlite3.SQLITE_PRAGMA: "a PRAGMA", sqlite3.SQLITE_CREATE_VIEW: "CREATE VIEW",
          sqlite3.SQLITE_DROP_VIEW: "DROP VIEW", sqlite3.SQLITE_CREATE_TRIGGER: "CREATE TRIGGER",
          sqlite3.SQLITE_DROP_TRIGGER: "DROP TRIGGER", sqlite3.SQLITE_DROP_TABLE: "DROP TABLE",
          sqlite3.SQLITE_ANALYZE: "ANALYZE", sqlite3.SQLITE_REINDEX: "REINDEX"}


def _own(name: str | None) -> bool:
    return name is not None and name.lower().startswith(("fieldsync_", "sqlite_"))


def _judge(found: tuple[Action, ...], catalogue: dict[str, _Article], unchecked: bool,
           where: str) -> tuple[list[str], bool]:
    """The published tables a statement alters, and whether it writes
    rows; SchemaRefused for what it may not do."""
    altered: list[str] = []
    writes = False
    other = None
    created = {action.first for action in found if action.code == sqlite3.SQLITE_CREATE_INDEX}
    for action in found:
        if action.trigger is not None and action.trigger.lower().startswith("fieldsync_"):
            continue  # fieldsync's capture, fired by a write
        if action.code == sqlite3.SQLITE_REINDEX and action.first in created:
            continue  # CREATE INDEX fills the index it makes
        if action.code in _HARD:
            raise SchemaRefused(f"{where}: {_HARD[action.code]} cannot run inside the change's own transaction; "
                                "give the statements alone")
        names = (action.first, action.second) if action.code != sqlite3.SQLITE_ALTER_TABLE else (action.second,)
        if any(map(_own, names)):
            raise SchemaRefused(f"{where}: fieldsync's and SQLite's own tables are not the application's to change")
        if action.code == sqlite3.SQLITE_DROP_TABLE and (action.first or "").lower() in catalogue:
            raise SchemaRefused(f"{where}: {action.first} is published: dropping a published table is refused "
                                f"(remove its article first: agent publication remove DB {action.first})")
        if action.code in _WRITES:
            writes = True
            other = other or "a data statement"
        elif action.code == sqlite3.SQLITE_ALTER_TABLE and action.first not in (None, "main"):
            other = other or "a change of another database's table"
        elif action.code == sqlite3.SQLITE_ALTER_TABLE:
            if (action.second or "").lower() in catalogue:
                altered.append(catalogue[action.second.lower()].table)  # type: ignore[union-attr]
        elif action.code not in _TAKEN:
            other = other or _NAMES.get(action.code, "this kind of statement")
    if other is not None and not unchecked:
        raise SchemaRefused(f"{where}: {other} is not a change agent schema apply checks and sends; add --unchecked "
                            "to run it at the consolidated only (docs/site-database.md, \"Schema changes\")")
    return altered, writes


def _check(step: tuple, catalogue: dict[str, _Article], retired: dict[str, set[str]], retired_tables: set[str],
           where: str) -> None:
    """Refuse a step on a published table that the remotes, or rows still
    on their way, could not follow; note the names it retires."""
    verb, table = step[0], step[1]
    named = step[2] if verb == RENAME_TABLE else table if verb == "create_table" else None
    if named is not None and named.lower() in retired_tables:
        raise SchemaRefused(f"{where}: {named} was the name of a published table before it was renamed: rows "
                            "logged under that name may still be on their way; choose another")
    article = catalogue.get(table.lower())
    if article is None:
        return
    if verb == RENAME_TABLE:
        if article.route:
            raise SchemaRefused(f"{where}: {table} follows its parent or has rows that follow it: renaming a table "
                                "of a follow chain is not supported yet")
        return
    if verb == "drop_table":  # not DROP TABLE (refused before it ran): a RENAME TO out of the application's names
        raise SchemaRefused(f"{where}: it renames the published table {table} to one of fieldsync's and SQLite's "
                            "own table names: refused")
    if verb == "redefine":
        raise SchemaRefused(f"{where}: it redefines the published table {table} (its key or several columns at "
                            "once): re-keying a published table is refused")
    gone = retired.setdefault(table.lower(), set())
    listed = article.listed
    given = step[2] if verb == "add_column" else step[3] if verb == "rename_column" else None
    if given is not None and given.lower() in gone:
        raise SchemaRefused(f"{where}: {table}.{given} was a column of the published table before (renamed "
                            "or dropped): rows in the old shape may still carry that name; choose another")
    if verb == "rename_column":
        old = step[2].lower()
        if old in article.subscribe_by or old in listed or old in article.route:
            raise SchemaRefused(f"{where}: {table}.{step[2]} is the SUBSCRIBE BY column, a column the article "
                                "lists or a column a follow route names: renaming it is not supported yet")
        gone.add(old)
    elif verb == "drop_column":
        column = step[2].lower()
        if (column in article.subscribe_by or column in listed or column in article.route
                or column in {key.lower() for key in article.key}):
            raise SchemaRefused(f"{where}: {table}.{step[2]} is needed by its article (the SUBSCRIBE BY column, a "
                                "listed or a key column, or a column a follow route names): dropping it is refused")
        gone.add(column)


def _rename_article(conn: sqlite3.Connection, catalogue: dict[str, _Article], retired: dict[str, set[str]],
                    retired_tables: set[str], step: tuple) -> None:
    """A published table renamed: its article, its conflict policy, and the
    change's own view of the catalogue and of the names retired follow it
    (its capture is made again, a new shape, with the other tables')."""
    _, old, new = step
    conn.execute("UPDATE fieldsync_article SET table_name = ? WHERE table_name = ?", (new, old))
    conn.execute("UPDATE fieldsync_conflict_policy SET table_name = ? WHERE table_name = ?", (new, old))
    catalogue[new.lower()] = catalogue.pop(old.lower())._replace(table=new)
    if old.lower() in retired:
        retired[new.lower()] = retired.pop(old.lower())
    retired_tables.add(old.lower())


class _ChangeWriter:
    """The steps of the change being made, written as a change (a capture
    row alone in its log transaction, and its fieldsync_schema_change row)
    when :meth:`flush` is called."""

    def __init__(self, conn: sqlite3.Connection, identity: SiteIdentity, catalogue: dict[str, _Article],
                 made_at: str) -> None:
        self.conn, self.identity, self.catalogue, self.made_at = conn, identity, catalogue, made_at
        self.shapes = ShapeCache(conn)
        self.steps: list[tuple] = []
        self.statements: list[str] = []
        self.done: list[tuple] = []
        self.offsets: list[int] = []
        self.sent: set[str] = set()

    def add(self, step: tuple) -> None:
        self.steps.append(step)

    def flush(self) -> None:
        if not self.steps:
            self.statements = []
            return
        conn = self.conn
        published, indexes, shape_ids = [], {}, {}
        # A table renamed in the change is published under its new name.
        for step, final in zip(self.steps, names_after(self.steps)):
            if final.lower() not in self.catalogue or step[0] not in _SENT:
                continue
            if step[0] == "create_index":
                indexes[step[2]] = list(step[4])
            published.append(_wire(step))
            shape_ids[final] = conn.execute("SELECT shape FROM fieldsync_article WHERE table_name = ?",
                                            (final,)).fetchone()[0]
        offset, value = write_change(conn, self.identity, self.shapes, published, shape_ids, indexes,
                                     self.steps, self.statements, self.made_at)
        catalogue = self.catalogue
        sent = subscriber_change(value, lambda table: (catalogue[table].columns, None, None) if table in catalogue
                                 else None, self.shapes.get)
        self.sent.update(() if sent is None else sent.tables())
        self.offsets.append(offset)
        self.done += self.steps
        self.steps, self.statements = [], []

    def result(self, statements: int) -> SchemaChangeResult:
        tables = sorted(self.sent)
        subscribers = [name for (name,) in self.conn.execute(
            "SELECT DISTINCT s.remote FROM fieldsync_subscription s JOIN fieldsync_article a"
            " ON a.publication = s.publication JOIN fieldsync_remote r ON r.name = s.remote"
            f" WHERE s.until IS NULL AND r.peer_incarnation IS NOT NULL AND a.table_name IN"
            f" ({', '.join('?' * len(tables))}) ORDER BY s.remote", tables)] if tables else []
        return SchemaChangeResult(tuple(self.offsets), tuple(self.done), tuple(tables), tuple(subscribers),
                                  statements)


# The steps a change sends (docs/message-format.md, "Schema changes").
_SENT = frozenset({"add_column", "rename_column", "drop_column", RENAME_TABLE, "create_index", "drop_index"})


def _wire(step: tuple) -> tuple:
    """A step of ddl.differences as it travels: an index's without the
    columns it uses (the capture row keeps them apart)."""
    if step[0] == "create_index":
        return step[:4]
    if step[0] == "drop_index":
        return step[:3]
    return step


def write_change(conn: sqlite3.Connection, identity: SiteIdentity, shapes: ShapeCache, published: list[tuple],
                 shape_ids: dict[str, int], indexes: dict[str, list], steps: list[tuple], statements: list[str] | None,
                 made_at: str, to: dict[str, list[str]] | None = None) -> tuple[int, str]:
    """Log a change: its capture row (agent.site.change_rows; ``published``
    the steps that travel) alone in a log transaction, and its
    fieldsync_schema_change row (``steps``, all of them).  Returns its
    commit offset and the row's value.  SchemaRefused when it could not
    travel in one message."""
    check_fits(identity.name, published, ((table, shapes.get(shape)) for table, shape in shape_ids.items()))
    value = row_value(published, shape_ids, indexes, to)
    conn.execute(f"INSERT INTO fieldsync_capture (shape, kind, v0) VALUES ({SCHEMA_SHAPE}, {KIND_SCHEMA}, ?)",
                 (value,))
    offset = cut_locked(conn, identity.name)
    conn.execute("INSERT INTO fieldsync_schema_change (commit_offset, peer, steps, statements, made_at)"
                 " VALUES (?, NULL, ?, ?, ?)", (offset, json.dumps([list(step) for step in steps]),
                                                None if statements is None else json.dumps(statements), made_at))
    return offset, value


def send_new_article_locked(conn: sqlite3.Connection, identity: SiteIdentity, publication: str, table: str,
                            made_at: str) -> tuple[int, ...]:
    """At the consolidated, right after ``table`` was published in
    ``publication`` (inside the same write transaction): send it to the
    extracted remotes subscribed to the publication, with no new
    extraction: a change that creates it (its published columns, and the
    indexes on them) and, after it, one log transaction holding each of
    its rows as an INSERT, which readers select for each subscriber as any
    INSERT.  Returns the two commit offsets (none: no such remote)."""
    if identity.role is not Role.CONSOLIDATED or conn.execute(
            "SELECT 1 FROM fieldsync_subscription s JOIN fieldsync_remote r ON r.name = s.remote"
            " WHERE s.publication = ? AND s.until IS NULL AND r.peer_incarnation IS NOT NULL",
            (publication,)).fetchone() is None:
        return ()
    shapes = ShapeCache(conn)
    info = table_info(conn, table)
    shape_id, columns, subscribe_by = conn.execute(
        "SELECT shape, columns, CASE WHEN follows IS NULL THEN subscribe_by END FROM fieldsync_article"
        " WHERE table_name = ? AND publication = ?", (info.name, publication)).fetchone()
    published = info.columns if columns is None else tuple(json.loads(columns))
    steps: list[tuple] = [("create_table", info.name, published_table_sql(conn, info, published), publication,
                           subscribe_by)]
    indexes = {}
    for index in read_schema(conn).indexes.values():
        if index.table.lower() == info.name.lower() and all(
                column in published if column is not None else columns is None for column in index.columns):
            steps.append(("create_index", info.name, index.name, index.sql))
            indexes[index.name] = list(index.columns)
    cut_locked(conn, identity.name)
    change, _ = write_change(conn, identity, shapes, steps, {info.name: shape_id}, indexes, steps, None, made_at)
    shape = shapes.get(shape_id)
    names = [f"{quote_ident(info.name)}.{quote_ident(column)}" for column in shape.columns]
    values = [value_column(index) for index in range(len(names))]
    follow = follows(conn).get(info.name.lower())
    if follow is not None:  # its route after the widest image (agent/site/sqlite/route.py)
        names.append(follow.route([f"{quote_ident(info.name)}.{quote_ident(c)}" for c in follow.columns]))
        values.append(value_column(2 * len(shape.columns)))
    select = f"{', '.join(names)} FROM {quote_ident(info.name)}"
    if conn.execute("SELECT count(*) FROM fieldsync_article WHERE table_name = ?", (info.name,)).fetchone()[0] == 1:
        conn.execute(f"INSERT INTO fieldsync_capture (shape, kind, {', '.join(values)}) SELECT {shape_id},"
                     f" {KIND_INSERT}, {select}")
        rows = cut_locked(conn, identity.name)
        return (change,) if rows == change else (change, rows)
    # The table is in other publications too: its rows go to each extracted
    # subscriber of this one alone (written back to it, as a subscription
    # change writes them), not again to those that get it through another.
    offsets = [change]
    for (remote,) in conn.execute(
            "SELECT DISTINCT s.remote FROM fieldsync_subscription s JOIN fieldsync_remote r ON r.name = s.remote"
            " WHERE s.publication = ? AND s.until IS NULL AND r.peer_incarnation IS NOT NULL ORDER BY s.remote",
            (publication,)).fetchall():
        end = log_end(conn)
        conn.execute(f"INSERT INTO fieldsync_capture (shape, kind, flags, {', '.join(values)}) SELECT {shape_id},"
                     f" {KIND_INSERT}, {FLAG_RETURN_TO_ORIGIN}, {select}")
        conn.execute("INSERT INTO fieldsync_returned (seq, columns) SELECT seq, '[]' FROM fieldsync_capture"
                     " WHERE seq > ?", (end,))
        offset = cut_locked(conn, remote, end)
        if offset != offsets[-1]:
            offsets.append(offset)
    return tuple(offsets)


def unpublish_locked(conn: sqlite3.Connection, identity: SiteIdentity, made_at: str, table: str | None,
                     publication: str | None) -> tuple[str, ...]:
    """Stop publishing ``table`` in ``publication`` (None: in every one),
    or drop ``publication`` whole (``table`` None), and send the articles
    removed to the extracted remotes that hold them
    (:func:`send_article_drops_locked`); returns those remotes."""
    held = {(row[0].lower(), row[1]): row for row in conn.execute(ARTICLE_ROWS)}  # as they are before they go
    if table is None:
        to = article_drops_to(conn, identity, [publication])
        removed = drop_publication_locked(conn, publication)
    else:
        removed = remove_article_locked(conn, table, publication)
        to = article_drops_to(conn, identity, [held for _, held in removed])  # its subscriptions stay
    rows = [held[name.lower(), publication] for name, publication in removed]
    return send_article_drops_locked(conn, identity, rows, to, made_at, dropped=publication if table is None else None)


def article_drops_to(conn: sqlite3.Connection, identity: SiteIdentity, publications: Iterable[str]
                     ) -> dict[str, list[str]]:
    """By publication: the extracted remotes subscribed to it, which an
    article removed from it reaches (none at a remote)."""
    if identity.role is not Role.CONSOLIDATED:
        return {}
    found = {}
    for publication in dict.fromkeys(publications):
        remotes = [name for (name,) in conn.execute(
            "SELECT DISTINCT s.remote FROM fieldsync_subscription s JOIN fieldsync_remote r ON r.name = s.remote"
            " WHERE s.publication = ? AND s.until IS NULL AND r.peer_incarnation IS NOT NULL ORDER BY s.remote",
            (publication,))]
        if remotes:
            found[publication] = remotes
    return found


def send_article_drops_locked(conn: sqlite3.Connection, identity: SiteIdentity, removed: list[tuple],
                              to: dict[str, list[str]], made_at: str, *, dropped: str | None = None) -> tuple[str, ...]:
    """Right after the articles ``removed`` (their ARTICLE_ROWS) went,
    inside the same write transaction: send each to ``to``, the remotes
    :func:`article_drops_to` found for its publication before, as a change
    of ``drop_article`` steps alone in its log transaction, so that they
    stop capturing the table (docs/site-database.md, "Removing an
    article").  The articles sent, and the subscriptions of a publication
    ``dropped`` whole, hold for the log transactions before the change:
    a remote that has not read them yet is sent them as they were
    logged.  Returns the remotes it reaches, sorted."""
    change = drop_change([row[:2] for row in removed], to, renames(conn))
    offset = None
    if change.steps:
        cut_locked(conn, identity.name)  # what was captured before: the change is alone in its log transaction
        offset, _ = write_change(conn, identity, ShapeCache(conn), change.steps, {}, {}, change.steps, None, made_at,
                                 change.to)
        conn.executemany("INSERT INTO fieldsync_removed_article (table_name, publication, columns, subscribe_by,"
                         " until) VALUES (?, ?, ?, ?, ?)", [(*row, offset) for row in removed if row[1] in change.to])
    if dropped is not None and dropped in change.to:
        conn.execute("UPDATE fieldsync_subscription SET until = ? WHERE publication = ? AND until IS NULL",
                     (offset, dropped))
    elif dropped is not None:  # no remote reads it any more
        conn.execute("DELETE FROM fieldsync_subscription WHERE publication = ?", (dropped,))
    return change.reached
