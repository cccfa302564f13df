"""Publications and subscriptions: the catalogue of what each subscriber
receives (what it is then sent: agent.site.selection, agent.site.reading).

Rules of this file:
* A publication is a set of *articles*; an article is one table, optionally
  restricted to some columns (the key columns are always included) and
  optionally with a ``SUBSCRIBE BY`` column.  A table belongs to at most one
  publication, so each subscriber sees each table through one article.
* At the consolidated, a remote subscribes to a publication with a value
  (several values make several subscriptions); it receives the rows whose
  SUBSCRIBE BY column equals one of its values (``NULL`` never matches;
  ``7`` and ``7.0`` match, ``'7'`` and ``7`` do not: Python equality on
  SQLite values).  Articles without SUBSCRIBE BY send every row.
* At a remote, the consolidated receives every row of every article: the
  remote's data already is its subset.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from ._db import format_time, parse_time, utc_now
from .capture import drop_capture, install_capture, install_moves, table_info
from .errors import InvalidSetting, PublicationError, UnknownPublication, UnknownRemote
from .route import resolve
from .values import value_problem

Value = None | int | float | str | bytes


@dataclass(frozen=True, slots=True)
class Article:
    """One table of a publication.  ``columns`` None means every column."""

    table: str
    columns: tuple[str, ...] | None = None
    subscribe_by: str | None = None
    # The parent table whose subscribers get this table's rows, through the
    # foreign key of ``follow_columns`` (None: the one foreign key to it).
    follows: str | None = None
    follow_columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if type(self.table) is not str or not self.table:
            raise InvalidSetting(f"article table must be a non-empty string, got {self.table!r}")
        if self.columns is not None:
            if isinstance(self.columns, str) or not all(type(c) is str and c for c in self.columns):
                raise InvalidSetting(f"article columns of {self.table} must be a sequence of column names")
            object.__setattr__(self, "columns", tuple(self.columns))
        if self.subscribe_by is not None and (type(self.subscribe_by) is not str or not self.subscribe_by):
            raise InvalidSetting(f"SUBSCRIBE BY column of {self.table} must be a column name")
        if self.follows is not None and (type(self.follows) is not str or not self.follows
                                         or self.subscribe_by is not None):
            raise InvalidSetting(f"{self.table} follows a parent table or is subscribed by a column, not both")
        if self.follow_columns is not None:
            if self.follows is None or isinstance(self.follow_columns, str) or not all(
                    type(c) is str and c for c in self.follow_columns):
                raise InvalidSetting(f"the foreign key columns of {self.table} name its columns toward the "
                                     "parent it follows")
            object.__setattr__(self, "follow_columns", tuple(self.follow_columns))

@dataclass(frozen=True, slots=True)
class Publication:
    name: str
    articles: tuple[Article, ...]

@dataclass(frozen=True, slots=True)
class Subscription:
    remote: str
    publication: str
    value: Value
    created_at: datetime

def check_publication_name(name: object) -> str:
    if type(name) is not str or not name or len(name) > 128 or not name.isprintable():
        shown = name if type(name) is not str or len(name) <= 40 else name[:40] + "..."
        raise InvalidSetting(f"publication name must be 1-128 printable characters, got {shown!r}")
    return name  # type: ignore[return-value]

def _as_article(item: Article | str) -> Article:
    return item if isinstance(item, Article) else Article(item)

def create_publication_locked(conn: sqlite3.Connection, name: str, articles: Iterable[Article | str],
                              now: datetime | None) -> None:
    check_publication_name(name)
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (name,)).fetchone():
        raise PublicationError(f"publication {name!r} exists already; add articles to it instead")
    conn.execute("INSERT INTO fieldsync_publication (name, created_at) VALUES (?, ?)",
                 (name, format_time(now or utc_now())))
    for article in articles:
        add_article_locked(conn, name, _as_article(article))

def add_article_locked(conn: sqlite3.Connection, publication: str, article: Article) -> Article:
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (publication,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {publication!r}; create it first")
    info = table_info(conn, article.table)
    taken = conn.execute("SELECT publication FROM fieldsync_article WHERE table_name = ?", (info.name,)).fetchone()
    if taken:
        raise PublicationError(f"table {info.name!r} is already published in {taken[0]!r}; a table belongs to "
                               "one publication")
    known = {column.lower(): column for column in info.columns}
    columns = None
    if article.columns is not None:
        wanted = set()
        for column in article.columns:
            if column.lower() not in known:
                raise PublicationError(f"table {info.name!r} has no column {column!r} to publish")
            wanted.add(known[column.lower()])
        wanted.update(info.key_columns)
        columns = tuple(column for column in info.columns if column in wanted)
        if columns == info.columns:
            columns = None
    subscribe_by = None
    if article.subscribe_by is not None:
        if article.subscribe_by.lower() not in known:
            raise PublicationError(f"SUBSCRIBE BY column {article.subscribe_by!r} is not a stored column of "
                                   f"{info.name!r}")
        subscribe_by = known[article.subscribe_by.lower()]
    follow = None
    if article.follows is not None:
        follow = resolve(conn, publication, info.name, article.follows, article.follow_columns)
    shape = install_capture(conn, info, follow)
    conn.execute("INSERT INTO fieldsync_article (table_name, publication, columns, subscribe_by, shape, follows,"
                 " follow_columns, parent_columns, route_sql) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (info.name, publication, None if columns is None else json.dumps(columns), subscribe_by, shape,
                  None if follow is None else follow.parent, None if follow is None else json.dumps(follow.columns),
                  None if follow is None else json.dumps(follow.parent_columns),
                  None if follow is None else follow.template))
    if follow is not None:
        install_moves(conn)
        return Article(info.name, columns, None, follow.parent, follow.columns)
    return Article(info.name, columns, subscribe_by)

def remove_article_locked(conn: sqlite3.Connection, table: str) -> None:
    row = conn.execute("SELECT table_name FROM fieldsync_article WHERE table_name = ?", (table,)).fetchone()
    if row is None:
        raise PublicationError(f"table {table!r} is not published")
    followers = [name for (name,) in conn.execute("SELECT table_name FROM fieldsync_article WHERE follows = ?"
                                                  " COLLATE NOCASE", (row[0],))]
    if followers:
        raise PublicationError(f"{', '.join(followers)} follow {row[0]!r}: remove them first")
    drop_capture(conn, row[0])
    conn.execute("DELETE FROM fieldsync_article WHERE table_name = ?", (row[0],))
    install_moves(conn)

def drop_publication_locked(conn: sqlite3.Connection, name: str) -> None:
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (name,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {name!r}")
    for (table,) in conn.execute("SELECT table_name FROM fieldsync_article WHERE publication = ?",
                                 (name,)).fetchall():
        drop_capture(conn, table)
    conn.execute("DELETE FROM fieldsync_article WHERE publication = ?", (name,))
    install_moves(conn)
    conn.execute("DELETE FROM fieldsync_subscription WHERE publication = ?", (name,))
    conn.execute("DELETE FROM fieldsync_publication WHERE name = ?", (name,))

def missing_tables(conn: sqlite3.Connection) -> tuple[str, ...]:
    """Published tables the database no longer has (renamed or dropped by
    an application): their article stays until it is removed."""
    return tuple(table for (table,) in conn.execute(
        "SELECT a.table_name FROM fieldsync_article a WHERE NOT EXISTS (SELECT 1 FROM sqlite_master m"
        " WHERE m.type = 'table' AND m.name = a.table_name COLLATE NOCASE) ORDER BY a.table_name"))

def list_publications(conn: sqlite3.Connection) -> tuple[Publication, ...]:
    articles: dict[str, list[Article]] = {}
    for (name,) in conn.execute("SELECT name FROM fieldsync_publication ORDER BY name"):
        articles[name] = []
    for table, publication, columns, subscribe_by, follows, follow_columns in conn.execute(
            "SELECT table_name, publication, columns, subscribe_by, follows, follow_columns FROM fieldsync_article"
            " ORDER BY table_name"):
        articles[publication].append(
            Article(table, None if columns is None else tuple(json.loads(columns)), subscribe_by, follows,
                    None if follow_columns is None else tuple(json.loads(follow_columns))))
    return tuple(Publication(name, tuple(items)) for name, items in articles.items())

def check_subscription(conn: sqlite3.Connection, remote: str, publication: str, value: Value) -> None:
    """Raise unless ``remote`` and ``publication`` exist and ``value`` can be a subscription value."""
    if conn.execute("SELECT 1 FROM fieldsync_remote WHERE name = ?", (remote,)).fetchone() is None:
        raise UnknownRemote(f"no remote named {remote!r}; add it before subscribing it")
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (publication,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {publication!r}")
    problem = value_problem(value)
    if problem is not None:
        raise InvalidSetting(f"subscription value: {problem}")
    if isinstance(value, float) and math.isnan(value):
        raise InvalidSetting("subscription value cannot be NaN (SQLite stores NaN as NULL, which matches nothing)")

def list_subscriptions(conn: sqlite3.Connection, remote: str | None = None) -> tuple[Subscription, ...]:
    """The subscriptions that hold (ended ones are history, kept for the log's readers)."""
    query = "SELECT remote, publication, value, created_at FROM fieldsync_subscription WHERE until IS NULL"
    params: tuple = ()
    if remote is not None:
        query += " AND remote = ?"
        params = (remote,)
    rows = conn.execute(query + " ORDER BY remote, publication, rowid", params).fetchall()
    return tuple(Subscription(r, p, v, parse_time(t)) for r, p, v, t in rows)  # type: ignore[arg-type]
