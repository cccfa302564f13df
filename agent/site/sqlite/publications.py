"""Publications and subscriptions: the catalogue of what each subscriber
receives (what it is then sent: agent.site.selection, agent.site.reading).

Rules of this file:
* A publication is a set of *articles*; an article is one table, optionally
  restricted to some columns (the key columns are always included) and
  optionally with a ``SUBSCRIBE BY`` column.  A table may be an article of
  several publications, each with its own columns and subset; it is
  captured once (its shape holds every column), and a subscriber of
  several of them gets each row once, with the columns of the articles
  that keep it (agent.site.union).  A table follows a parent in one
  publication at most, and is a followed parent in one at most: its
  capture rows hold one route.
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
import sqlite3
from datetime import datetime
from typing import Iterable

from ..clock import utc_now
from ..errors import PublicationError, UnknownPublication, UnknownRemote
from ..publication_rules import (Article, Publication, Subscription, Value, as_article, check_followed_once,
                                 check_publication_name, check_subscription_value, check_table_articles,
                                 parents_first, published_columns, subscribe_by_column)
from ._db import format_time, parse_time
from .capture import drop_capture, install_capture, install_moves, table_info
from .selection import renames
from .route import resolve


def create_publication_locked(conn: sqlite3.Connection, name: str, articles: Iterable[Article | str],
                              now: datetime | None) -> None:
    check_publication_name(name)
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (name,)).fetchone():
        raise PublicationError(f"publication {name!r} exists already; add articles to it instead")
    conn.execute("INSERT INTO fieldsync_publication (name, created_at) VALUES (?, ?)",
                 (name, format_time(now or utc_now())))
    for article in articles:
        add_article_locked(conn, name, as_article(article))

def add_article_locked(conn: sqlite3.Connection, publication: str, article: Article) -> Article:
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (publication,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {publication!r}; create it first")
    info = table_info(conn, article.table)
    if info.name.lower() in renames(conn):  # such rows would be read, and a remote's applied, as the renamed table's
        raise PublicationError(f"{info.name!r} was the name of a published table before a schema change renamed it; "
                               "rows logged under that name may still be on their way: give the table another name")
    check_other_articles(conn, publication, info.name, article.follows)
    known = {column.lower(): column for column in info.columns}

    def find(column: str) -> str | None:  # SQLite's column names ignore case
        return known.get(column.lower())

    columns = published_columns(info.name, info.columns, info.key_columns, article.columns, find)
    subscribe_by = subscribe_by_column(info.name, article.subscribe_by, find)
    follow = None
    if article.follows is not None:
        follow = resolve(conn, publication, info.name, article.follows, article.follow_columns)
    shape = install_capture(conn, info, follow)
    # One capture per table: its other articles read the new shape too.
    conn.execute("UPDATE fieldsync_article SET shape = ? WHERE table_name = ?", (shape, info.name))
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

def check_other_articles(conn: sqlite3.Connection, publication: str, table: str, follows: str | None) -> None:
    """Raise unless ``table`` may become an article of ``publication``
    (following ``follows``) beside its articles in other publications."""
    check_table_articles(table, publication, follows, conn.execute(
        "SELECT publication, follows FROM fieldsync_article WHERE table_name = ?", (table,)).fetchall())
    if follows is not None:
        check_followed_once(follows, [other for (other,) in conn.execute(
            "SELECT DISTINCT publication FROM fieldsync_article WHERE follows = ? COLLATE NOCASE AND publication != ?",
            (follows, publication))])
    extracted = conn.execute(
        "SELECT s.remote, a.publication FROM fieldsync_subscription s JOIN fieldsync_subscription t"
        " ON t.remote = s.remote AND t.until IS NULL JOIN fieldsync_article a ON a.publication = t.publication"
        " JOIN fieldsync_remote r ON r.name = s.remote WHERE s.publication = ? AND s.until IS NULL"
        " AND a.table_name = ? AND r.peer_incarnation IS NOT NULL", (publication, table)).fetchone()
    if extracted:
        raise PublicationError(f"{extracted[0]!r} subscribes to {publication!r} and gets {table!r} through "
                               f"{extracted[1]!r} already; publish {table!r} in {publication!r} before extracting "
                               "such a remote")


def remove_article_locked(conn: sqlite3.Connection, table: str, publication: str | None = None
                          ) -> list[tuple[str, str]]:
    """Stop publishing ``table`` in ``publication`` (None: in every
    publication that holds it); its capture goes with its last article.
    Returns the articles removed: ``(table, publication)``."""
    rows = conn.execute("SELECT table_name, publication FROM fieldsync_article WHERE table_name = ?"
                        + ("" if publication is None else " AND publication = ?"),
                        (table,) if publication is None else (table, publication)).fetchall()
    if not rows:
        raise PublicationError(f"table {table!r} is not published"
                               + ("" if publication is None else f" in {publication!r}"))
    name = rows[0][0]
    followers = [child for child, held in conn.execute(
        "SELECT table_name, publication FROM fieldsync_article WHERE follows = ? COLLATE NOCASE", (name,))
        if any(held == other for _, other in rows)]
    if followers:
        raise PublicationError(f"{', '.join(followers)} follow {name!r}: remove them first")
    routed = any(conn.execute("SELECT 1 FROM fieldsync_article WHERE table_name = ? AND publication = ?"
                              " AND follows IS NOT NULL", (name, other)).fetchone() for _, other in rows)
    for _, other in rows:
        conn.execute("DELETE FROM fieldsync_article WHERE table_name = ? AND publication = ?", (name, other))
    _after_removal(conn, name, routed)
    install_moves(conn)
    return [(name, other) for _, other in rows]


def _after_removal(conn: sqlite3.Connection, table: str, routed: bool) -> None:
    """The capture of ``table`` once some of its articles are gone: none
    when no publication holds it any more; made again without routes when
    the article that followed a parent went (its triggers look the route
    up in the parent's table)."""
    if conn.execute("SELECT 1 FROM fieldsync_article WHERE table_name = ?", (table,)).fetchone() is None:
        drop_capture(conn, table)
    elif routed and conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                                 (table,)).fetchone():
        shape = install_capture(conn, table_info(conn, table))
        conn.execute("UPDATE fieldsync_article SET shape = ? WHERE table_name = ?", (shape, table))

def drop_publication_locked(conn: sqlite3.Connection, name: str) -> list[tuple[str, str]]:
    """Drop publication ``name`` and its articles (not its subscriptions:
    changes.send_article_drops_locked ends them); returns the articles
    removed: ``(table, publication)``, those that follow a parent before it
    (the order a remote can remove them in)."""
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (name,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {name!r}")
    follows = dict(conn.execute("SELECT table_name, follows FROM fieldsync_article WHERE publication = ?"
                                " ORDER BY rowid", (name,)).fetchall())
    tables = [(table, follows[table] is not None) for table in parents_first(  # each after those that follow it
        list(follows), lambda table: [child for child, parent in follows.items()
                                      if parent is not None and parent.lower() == table.lower()], str.lower)]
    conn.execute("DELETE FROM fieldsync_article WHERE publication = ?", (name,))
    for table, routed in tables:
        _after_removal(conn, table, bool(routed))
    install_moves(conn)
    conn.execute("DELETE FROM fieldsync_publication WHERE name = ?", (name,))
    return [(table, name) for table, _ in tables]

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
    check_subscription_value(value)

def list_subscriptions(conn: sqlite3.Connection, remote: str | None = None) -> tuple[Subscription, ...]:
    """The subscriptions that hold (ended ones are history, kept for the log's readers)."""
    query = "SELECT remote, publication, value, created_at FROM fieldsync_subscription WHERE until IS NULL"
    params: tuple = ()
    if remote is not None:
        query += " AND remote = ?"
        params = (remote,)
    rows = conn.execute(query + " ORDER BY remote, publication, rowid", params).fetchall()
    return tuple(Subscription(r, p, v, parse_time(t)) for r, p, v, t in rows)  # type: ignore[arg-type]
