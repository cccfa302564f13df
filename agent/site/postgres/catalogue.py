"""Publications and articles of a PostgreSQL site: what is published, and
the capture triggers that follow from it.

Rules of this file:
* The rules are a SQLite site's (agent.site.publication_rules,
  agent.site.sqlite.publications): a table may be an article of several
  publications, once in each, each with its own columns and SUBSCRIBE BY
  column (its key always among the columns); it follows a parent in one
  publication at most, and is followed in one at most; the same refusals
  with the same lines.
* A table has one capture whatever its articles (its shape holds every
  column; its rows carry a route when one of its articles follows a
  parent): every article of the table names that shape, and it goes with
  the table's last article.
* A table is named as PostgreSQL resolves it (``customer`` on the
  ``search_path``, or ``sales.customer``); an article is shown as
  ``capture.shown_table`` shows it (plain in ``public``).  A column is
  found by its exact name, else by its name in lower case (how PostgreSQL
  folds a name written without quotes).
* Publishing a table installs its capture triggers (capture.install_capture,
  which refuses unpublishable tables and column types); no longer
  publishing it removes them, found by the table's oid, so a table renamed
  since (or missing: missing_tables) loses them too.
* An article may follow its parent (``follows=``): route.py resolves its
  foreign key and makes its capture carry routes; every change of the
  articles makes the move triggers again (route.install_moves).  A parent
  with children is not unpublished before them.
* Functions here run inside the caller's transaction.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Callable, Iterable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..clock import in_utc
from ..errors import PublicationError, SiteError, UnknownPublication
from ..publication_rules import (Article, Publication, as_article, check_followed_once, check_publication_name,
                                 check_table_articles, parents_first, published_columns, subscribe_by_column)
from . import route
from .capture import PgShape, describe_table, drop_capture_of, install_capture, shown_table
from .uri import PgTarget

log = logging.getLogger("fieldsync.site")

# The schema and name a text names, as PostgreSQL resolves it (none: no such relation).
_RESOLVE = ("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = to_regclass(%s)")


def table_order(shown: str) -> tuple[str, str]:
    """Tables in a SQLite site's order (its table names are ``COLLATE NOCASE``)."""
    return shown.lower(), shown


def _publication_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM fieldsync.publication WHERE name = %s", (name,)).fetchone() is not None


def _finder(columns: Iterable[str]) -> Callable[[str], str | None]:
    names = set(columns)

    def find(column: str) -> str | None:
        if column in names:
            return column
        folded = column.lower()
        return folded if folded in names else None
    return find


def create_publication(conn: psycopg.Connection, target: PgTarget, name: str, articles: Iterable[Article | str],
                       now: datetime) -> None:
    check_publication_name(name)
    if _publication_exists(conn, name):
        raise PublicationError(f"publication {name!r} exists already; add articles to it instead")
    conn.execute("INSERT INTO fieldsync.publication (name, created_at) VALUES (%s, %s)", (name, in_utc(now)))
    for article in articles:
        add_article(conn, target, name, as_article(article))


def add_article(conn: psycopg.Connection, target: PgTarget, publication: str, article: Article) -> Article:
    if not _publication_exists(conn, publication):
        raise UnknownPublication(f"no publication named {publication!r}; create it first")
    description = describe_table(conn, article.table)
    layout = description.layout
    held = conn.execute("SELECT publication, follows FROM fieldsync.article WHERE (table_schema = %s AND"
                        " table_name = %s) OR table_oid = %s",
                        (layout.schema, layout.table, description.oid)).fetchall()
    check_table_articles(layout.shown, publication, article.follows, held)
    find = _finder(layout.columns)
    columns = published_columns(layout.shown, layout.columns, layout.key_columns, article.columns, find)
    subscribe_by = subscribe_by_column(layout.shown, article.subscribe_by, find)
    follow = None
    if article.follows is not None:
        follow = route.resolve(conn, publication, layout.schema, layout.table, description.oid, article.follows,
                               article.follow_columns, find)
        check_followed_once(follow[0], [other for (other,) in conn.execute(
            "SELECT DISTINCT publication FROM fieldsync.article WHERE follows = %s AND publication <> %s",
            (follow[0], publication))])
    # The table's one capture: with the route of the article that follows a
    # parent, this one or one of another publication.
    routed = (follow[0], follow[1], follow[2], publication) if follow is not None else \
        route.follows(conn).get((layout.schema, layout.table))
    shape = capture_again(conn, target, layout.schema, layout.table, article.table, routed)
    conn.execute("INSERT INTO fieldsync.article (table_schema, table_name, table_oid, publication, columns,"
                 " subscribe_by, shape, follows, follow_columns, parent_columns)"
                 " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                 (layout.schema, layout.table, description.oid, publication,
                  None if columns is None else Jsonb(list(columns)), subscribe_by, shape.id,
                  *((None, None, None) if follow is None else (follow[0], Jsonb(list(follow[1])),
                                                                Jsonb(list(follow[2]))))))
    route.install_moves(conn)
    if follow is not None:
        return Article(layout.shown, columns, None, follow[0], follow[1])
    return Article(layout.shown, columns, subscribe_by)


def capture_again(conn: psycopg.Connection, target: PgTarget, schema: str, name: str, table: str,
                  routed: tuple | None) -> PgShape:
    """Make the capture of ``schema.name`` (``table``: a text that names it)
    again, in its shape of now, with the route of ``routed`` (the parent it
    follows, as route.follows gives it; None: no route), and point its
    articles at the shape."""
    shape = install_capture(conn, target, table, None if routed is None else route.capture_route(
        route.chain_of(conn, *routed)))
    conn.execute("UPDATE fieldsync.article SET shape = %s WHERE table_schema = %s AND table_name = %s",
                 (shape.id, schema, name))
    return shape


# Each published table as it is now against its capture's shape: its
# columns in table order (generated ones are never captured).
_LIVE = """
SELECT DISTINCT a.table_schema, a.table_name, s.columns, s.key_columns,
       ARRAY(SELECT t.attname::text FROM pg_catalog.pg_attribute t WHERE t.attrelid = c.oid AND t.attnum > 0
               AND NOT t.attisdropped AND t.attgenerated = '' ORDER BY t.attnum)
  FROM fieldsync.article a JOIN fieldsync.shape s ON s.id = a.shape
  JOIN pg_catalog.pg_namespace n ON n.nspname = a.table_schema
  JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = a.table_name
 ORDER BY a.table_schema, a.table_name
"""


def recapture_altered(conn: psycopg.Connection, target: PgTarget) -> list[str]:
    """Make the capture of each published table altered outside ``agent
    schema apply`` (its columns are not its shape's) again, in its shape of
    now, one transaction each, as a SQLite site's scan does: its capture
    triggers named the columns it had, so a column dropped by hand failed
    every write to the table, and one added was not captured.  The change
    reaches no remote (docs/postgres.md, "Schema changes").  A table whose
    key changed, or that cannot be captured now, is left as it is, said in
    one warning.  Returns the tables captured again.  The connection is in
    autocommit mode, with no transaction open."""
    done = []
    for schema, name, columns, key_columns, live in conn.execute(_LIVE).fetchall():
        if list(live) == list(columns):
            continue
        shown = shown_table(schema, name)
        text = sql.Identifier(schema, name).as_string(conn)
        try:
            with conn.transaction():
                if list(describe_table(conn, text).layout.key_columns) != list(key_columns):
                    log.warning("published table %s was re-keyed outside agent schema apply: its capture is left as "
                                "it was; give it back its key, or remove its article", shown)
                    continue
                capture_again(conn, target, schema, name, text, route.follows(conn).get((schema, name)))
                route.install_moves(conn)
        except (SiteError, psycopg.Error) as error:
            log.warning("published table %s was altered outside agent schema apply and its capture cannot be made "
                        "again (%s); give it back what its articles need, or remove them", shown, error)
            continue
        log.warning("published table %s was altered outside agent schema apply: its capture is made again in its "
                    "new shape, which reaches no remote (make schema changes with agent schema apply)", shown)
        done.append(shown)
    return done


def _resolve(conn: psycopg.Connection, table: str) -> tuple[str, str] | None:
    """The schema and name ``table`` names now, or None (no such table, or
    a text PostgreSQL cannot read as a name)."""
    try:
        with conn.transaction():  # a savepoint: a malformed name leaves the caller's transaction usable
            found = conn.execute(_RESOLVE, (table,)).fetchone()
    except psycopg.Error:
        return None
    return None if found is None else (found[0], found[1])


def remove_article(conn: psycopg.Connection, target: PgTarget, table: str, publication: str | None = None
                   ) -> list[tuple[str, str]]:
    """Stop publishing ``table`` (named as it is now, or as its article
    shows it when it is missing) in ``publication`` (None: in every
    publication that holds it); its capture goes with its last article.
    Returns the articles removed: ``(shown table, publication)``."""
    resolved = _resolve(conn, table)
    rows = [(schema, name, oid, held) for schema, name, oid, held in conn.execute(
            "SELECT table_schema, table_name, table_oid, publication FROM fieldsync.article"
            " ORDER BY table_schema, table_name, publication").fetchall()
            if (resolved == (schema, name) or shown_table(schema, name) == table) and publication in (None, held)]
    if not rows:
        raise PublicationError(f"table {table!r} is not published"
                               + ("" if publication is None else f" in {publication!r}"))
    schema, name = rows[0][0], rows[0][1]
    rows = [row for row in rows if (row[0], row[1]) == (schema, name)]
    shown = shown_table(schema, name)
    followers = [shown_table(*found) for found in conn.execute(
        "SELECT table_schema, table_name FROM fieldsync.article WHERE follows = %s AND publication = ANY(%s)"
        " ORDER BY 1, 2", (shown, [row[3] for row in rows]))]
    if followers:
        raise PublicationError(f"{', '.join(followers)} follow {shown!r}: remove them first")
    for row in rows:
        _remove(conn, target, *row)
    route.install_moves(conn)
    return [(shown, row[3]) for row in rows]


def _remove(conn: psycopg.Connection, target: PgTarget, schema: str, name: str, oid: int, publication: str) -> None:
    """Delete the article of ``schema.name`` in ``publication``; then drop
    the table's capture when no article is left, or make it again without
    routes when the one that followed a parent went (its triggers look
    the route up)."""
    (routed,) = conn.execute("DELETE FROM fieldsync.article WHERE table_schema = %s AND table_name = %s"
                             " AND publication = %s RETURNING follows IS NOT NULL", (schema, name, publication)
                             ).fetchone()
    if conn.execute("SELECT 1 FROM fieldsync.article WHERE table_schema = %s AND table_name = %s",
                    (schema, name)).fetchone() is None:
        drop_capture_of(conn, target, oid)
    elif routed and (found := conn.execute("SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_class c"
                                           " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
                                           (oid,)).fetchone()):
        capture_again(conn, target, schema, name, found[0], None)


def drop_publication(conn: psycopg.Connection, target: PgTarget, name: str) -> list[tuple[str, str]]:
    """Drop publication ``name`` and its articles (not its subscriptions:
    article_drops.send_article_drops_in ends them); returns the articles
    removed: ``(shown table, publication)``, those that follow a parent
    before it (the order a remote can remove them in)."""
    if not _publication_exists(conn, name):
        raise UnknownPublication(f"no publication named {name!r}")
    found = {shown_table(row[0], row[1]): row for row in conn.execute(
        "SELECT table_schema, table_name, table_oid, publication, follows FROM fieldsync.article"
        " WHERE publication = %s ORDER BY table_schema, table_name", (name,)).fetchall()}
    rows = [found[shown][:4] for shown in parents_first(  # each after those that follow it
        list(found), lambda shown: [child for child, row in found.items() if row[4] == shown], str)]
    for row in rows:
        _remove(conn, target, *row)  # the articles that follow first: their parents' routes go with them
    route.install_moves(conn)
    conn.execute("DELETE FROM fieldsync.publication WHERE name = %s", (name,))
    return [(shown_table(schema, table), name) for schema, table, _oid, _publication in rows]


def missing_tables(conn: psycopg.Connection) -> tuple[str, ...]:
    """Published tables the database no longer has under their name
    (renamed or dropped by an application): their article stays until it
    is removed."""
    return tuple(sorted((shown_table(schema, name) for schema, name in conn.execute(
        "SELECT DISTINCT table_schema, table_name FROM fieldsync.article"
        " WHERE to_regclass(format('%I.%I', table_schema, table_name)) IS NULL")), key=table_order))


def list_publications(conn: psycopg.Connection) -> tuple[Publication, ...]:
    articles: dict[str, list[Article]] = {name: [] for (name,) in conn.execute(
        'SELECT name FROM fieldsync.publication ORDER BY name COLLATE "C"')}
    for schema, name, publication, columns, subscribe_by, follows, follow_columns in conn.execute(
            "SELECT table_schema, table_name, publication, columns, subscribe_by, follows, follow_columns"
            " FROM fieldsync.article ORDER BY publication"):
        articles[publication].append(Article(shown_table(schema, name), None if columns is None else tuple(columns),
                                             subscribe_by, follows,
                                             None if follow_columns is None else tuple(follow_columns)))
    return tuple(Publication(name, tuple(sorted(items, key=lambda item: table_order(item.table))))
                 for name, items in articles.items())
