"""What a PostgreSQL site reads its log for subscribers with: the rows the
shared readers (agent.site.selection) are made from.

Rules of this file:
* Selection is agent.site.selection's and nothing else: this file only
  reads the catalogue's rows in the form a SQLite site's readers and a
  batch export take them: article rows ``(table, publication, columns as
  JSON or None, subscribe_by)`` (route.ARTICLE_ROWS' columns; a table as
  capture.shown_table shows it), subscription rows ``(publication, value,
  since, until)`` with the value as it was subscribed, and every shape as
  agent.site.capture.Shape.
* Rows written back to their origin (an apply's, a subscription
  change's) list the columns they send in ``fieldsync.returned``, which a
  reader reads by seq (:func:`returned_columns`).
* Functions here run inside the caller's transaction (REPEATABLE READ:
  the catalogue of one snapshot).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import psycopg

from ..capture import ROUTE, Shape
from ..change_rows import table_renames as renames_of
from ..concern import Concern
from ..identity import SiteIdentity
from ..reading import ConcernRows, ReaderRows
from ..selection import Shapes, SubscriberReader, check_subscribers
from .capture import load_shapes, shown_table
from .catalogue import table_order
from .subscriptions import VALUE_COLUMNS, stored_value


def article_rows(conn: psycopg.Connection) -> list[tuple]:
    """Every article as ``(table, publication, columns JSON, subscribe_by)``,
    by table; a follow article's ``subscribe_by`` is capture.ROUTE (its rows
    carry their routes: route.py)."""
    rows = [(shown_table(schema, name), publication, columns, subscribe_by if follows is None else ROUTE)
            for schema, name, publication, columns, subscribe_by, follows in conn.execute(
                "SELECT table_schema, table_name, publication, columns::text, subscribe_by, follows"
                " FROM fieldsync.article")]
    return sorted(rows, key=lambda row: table_order(row[0]))


def removed_articles(conn: psycopg.Connection) -> list[tuple]:
    """The articles removed since the log's truncation point, as
    :func:`article_rows` reads them with the commit offset of their removal
    last (None: no cut has given it one yet; agent.site.selection.plan_from_rows)."""
    return [(table, publication, columns, ROUTE if routed else subscribe_by, until)
            for table, publication, columns, subscribe_by, routed, until in conn.execute(
                "SELECT r.table_name, r.publication, r.columns, r.subscribe_by, r.routed, c.commit_offset"
                " FROM fieldsync.removed_article r JOIN fieldsync.schema_change c ON c.txid = r.txid"
                " ORDER BY c.commit_offset NULLS LAST, r.txid")]


def subscription_rows(conn: psycopg.Connection, remotes: Iterable[str] | None) -> dict[str, list[tuple]]:
    """The subscriptions of ``remotes`` (None: of every remote), ended ones
    included, as ``remote -> [(publication, value, since, until)]`` by
    publication and age."""
    found: dict[str, list[tuple]] = {} if remotes is None else {name: [] for name in remotes}
    where, parameters = ("", ()) if remotes is None else (" WHERE remote = ANY(%s)", (list(found),))
    return _by_remote(conn, where, parameters, found)


def _by_remote(conn: psycopg.Connection, where: str, parameters: tuple, found: dict[str, list[tuple]]
               ) -> dict[str, list[tuple]]:
    """The subscription rows ``where`` picks, added to ``found`` by remote, by publication and age."""
    for remote, publication, *values, since, until in conn.execute(
            f"SELECT remote, publication, {VALUE_COLUMNS}, since, until FROM fieldsync.subscription{where}"
            ' ORDER BY remote, publication COLLATE "C", id', parameters):
        found.setdefault(remote, []).append((publication, stored_value(*values), since, until))
    return found


def table_renames(conn: psycopg.Connection) -> dict[str, str]:
    """The site's table renames (change_rows.table_renames), from the
    changes that renamed a published table (changes.py)."""
    return renames_of(step for (steps,) in conn.execute(
        "SELECT steps FROM fieldsync.schema_change WHERE steps::text LIKE '%\"rename_table\"%'"
        " ORDER BY commit_offset NULLS LAST, txid") for step in steps)


def every_shape(conn: psycopg.Connection) -> list[Shape]:
    return [shape.shape for shape in load_shapes(conn).values()]


def check_remotes(conn: psycopg.Connection, identity: SiteIdentity, subscribers: list[str]) -> None:
    """Raise UnknownRemote, as a SQLite site does, for a subscriber that is no remote."""
    known = {name for (name,) in conn.execute("SELECT name FROM fieldsync.remote WHERE name = ANY(%s)",
                                              (subscribers,))}
    check_subscribers(identity, known, subscribers)


def readers(conn: psycopg.Connection, identity: SiteIdentity, shapes: Shapes, subscribers: list[str], *,
            runs: bool = False) -> list[SubscriberReader]:
    """A reader for each of ``subscribers`` (agent.site.selection's), finding
    shapes in ``shapes``."""
    rows = reader_rows(conn, identity, subscribers)
    return rows.readers(identity, shapes, subscribers, runs=runs)


def reader_rows(conn: psycopg.Connection, identity: SiteIdentity, subscribers: list[str] | None) -> ReaderRows:
    """What readers for ``subscribers`` are made from (agent.site.reading.ReaderRows);
    None: every remote's rows, unchecked (a look at which a range concerns)."""
    if subscribers is not None:
        check_remotes(conn, identity, subscribers)
    return ReaderRows(every_shape(conn), article_rows(conn), subscription_rows(conn, subscribers),
                      returned_columns(conn), table_renames(conn), removed_articles(conn))


def concern_rows(conn: psycopg.Connection) -> ConcernRows:
    """What finding the subscribers a range concerns reads
    (agent.site.reading.concerned_indexes), inside the caller's snapshot:
    the subscription rows are asked for once the range's rows are known,
    and only those that can match (agent.site.concern.Concern.wanted)."""
    # A removed article still concerns the log transactions before its removal.
    articles = article_rows(conn) + [row[:4] for row in removed_articles(conn)]
    return ConcernRows(articles, table_renames(conn), lambda found: _concerned_subscriptions(conn, found))


def _concerned_subscriptions(conn: psycopg.Connection, found: Concern) -> dict[str, list[tuple]]:
    """The subscription rows ``found`` can match, a superset of those whose
    value equals (as Python compares) one it holds: a number is looked for
    in both numeric columns, as an int where it is a whole one."""
    publications, pairs = found.wanted()
    if not publications and not pairs:
        return {}
    texts, integers, reals = [], [], []
    for publication, value in pairs:
        if type(value) is str:
            texts.append((publication, value))
            continue
        reals.append((publication, float(value)))
        if value == int(value) and -(1 << 63) <= int(value) < (1 << 63):
            integers.append((publication, int(value)))
    return _by_remote(conn, " WHERE publication = ANY(%s)"
                      " OR (publication, value_text) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
                      " OR (publication, value_integer) IN (SELECT * FROM unnest(%s::text[], %s::bigint[]))"
                      " OR (publication, value_real) IN (SELECT * FROM unnest(%s::text[], %s::float8[]))",
                      (publications, *_columns(texts), *_columns(integers), *_columns(reals)), {})


def _columns(pairs: list[tuple]) -> tuple[list, list]:
    return [publication for publication, _ in pairs], [value for _, value in pairs]


def selection_rows(conn: psycopg.Connection, identity: SiteIdentity, subscribers: list[str]
                   ) -> tuple[list[Shape], list[tuple], list[tuple]]:
    """What a batch export carries (SiteDatabase.selection_rows): every
    shape, the article rows and the subscribers' subscription rows
    ``(remote, publication, value, since, until)``."""
    check_remotes(conn, identity, subscribers)
    subscriptions = subscription_rows(conn, subscribers)
    return (every_shape(conn), article_rows(conn),
            [(remote, *row) for remote in subscribers for row in subscriptions[remote]])


def returned_columns(conn: psycopg.Connection) -> Callable[[int], str | None]:
    """The columns a row written back to its origin lists (apply/returns.py
    writes them to ``fieldsync.returned``), by capture seq; None: every
    column, or no such row.  Asked while a reader selects a chunk, on the
    site's connection, as the SQLite reader asks its own."""
    def columns(seq: int) -> str | None:
        found = conn.execute("SELECT columns::text FROM fieldsync.returned WHERE seq = %s", (seq,)).fetchone()
        return None if found is None else found[0]

    return columns
