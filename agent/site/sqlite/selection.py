"""The rows a SQLite site's readers are made from (agent.site.selection):
a subscriber's plan, and its readers, from the catalogue, the subscription
rows and the shapes.

Rules of this file:
* Each function reads in the caller's transaction, under the site's lock,
  once; what it returns selects with no query of its own but one: the
  columns a row written back to its origin lists (``fieldsync_returned``).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Callable

from ..change_rows import table_renames
from ..identity import SiteIdentity
from ..concern import Concern
from ..reading import ConcernRows, ReaderRows
from ..selection import SelectionPlan, SubscriberReader, check_subscribers, plan_from_rows, value_columns_read
from .capture import ShapeCache, all_shapes
from .route import ARTICLE_ROWS


def selection_plan(conn: sqlite3.Connection, identity: SiteIdentity, subscriber: str) -> SelectionPlan:
    """What ``subscriber`` receives from this site (raises for an unknown remote)."""
    known = {name for (name,) in conn.execute("SELECT name FROM fieldsync_remote WHERE name = ?", (subscriber,))}
    check_subscribers(identity, known, [subscriber])
    articles = conn.execute(ARTICLE_ROWS).fetchall()
    subscriptions = conn.execute("SELECT publication, value, since, until FROM fieldsync_subscription"
                                 " WHERE remote = ?", (subscriber,)).fetchall()
    return plan_from_rows(subscriber, identity.role, articles, subscriptions, renames(conn), removed_articles(conn))


def removed_articles(conn: sqlite3.Connection) -> list[tuple]:
    """The articles removed since the log's truncation point, as
    ARTICLE_ROWS reads them with the commit offset of their removal last
    (agent.site.selection.plan_from_rows)."""
    return conn.execute("SELECT table_name, publication, columns, subscribe_by, until FROM fieldsync_removed_article"
                        " ORDER BY until, rowid").fetchall()


def export_rows(conn: sqlite3.Connection, identity: SiteIdentity, subscribers: list[str]
                ) -> tuple[list[tuple], list[tuple]]:
    """What a batch export carries to select for ``subscribers``: the
    article rows (ARTICLE_ROWS, by table) and their subscription rows
    (remote, publication, value, since, until), ended ones included.
    Raises for an unknown remote."""
    _check_remotes(conn, identity, subscribers)
    articles = conn.execute(ARTICLE_ROWS + " ORDER BY table_name").fetchall()
    subscriptions = [row for name in subscribers for row in conn.execute(
        "SELECT remote, publication, value, since, until FROM fieldsync_subscription WHERE remote = ?"
        " ORDER BY publication, rowid", (name,))]
    return articles, subscriptions


def renames(conn: sqlite3.Connection) -> dict[str, str]:
    """The site's table renames (change_rows.table_renames): the changes it
    made (the consolidated) or applied (a remote), in order."""
    return table_renames(step for (steps,) in conn.execute(
        "SELECT steps FROM fieldsync_schema_change WHERE instr(steps, '\"rename_table\"') ORDER BY commit_offset")
        for step in json.loads(steps))


def subscriber_reader(conn: sqlite3.Connection, identity: SiteIdentity, shapes: ShapeCache,
                      subscriber: str) -> SubscriberReader:
    """The reader of ``subscriber``.  Capture rows are read only as wide as
    the widest shape of a table it receives (old and new row), not as wide
    as the capture table."""
    plan = selection_plan(conn, identity, subscriber)
    return SubscriberReader(plan, shapes, _returned_columns(conn), value_columns_read(all_shapes(conn), plan))


def reader_rows(conn: sqlite3.Connection, identity: SiteIdentity, subscribers: list[str] | None) -> ReaderRows:
    """What readers for ``subscribers`` are made from (agent.site.reading.ReaderRows);
    None: every remote's rows, unchecked (a look at which a range concerns)."""
    # Only the subscribers' own rows are read (a group of a send phase at a
    # consolidated of 100,000 is a few thousand of them).
    where, parameters = "", ()
    if subscribers is not None:
        _check_remotes(conn, identity, subscribers)
        where, parameters = " WHERE remote IN (SELECT value FROM json_each(?))", (json.dumps(subscribers),)
    subscriptions: dict[str, list[tuple]] = {}
    for remote, publication, value, since, until in conn.execute(
            f"SELECT remote, publication, value, since, until FROM fieldsync_subscription{where} ORDER BY rowid",
            parameters):
        subscriptions.setdefault(remote, []).append((publication, value, since, until))
    return ReaderRows(all_shapes(conn), conn.execute(ARTICLE_ROWS).fetchall(), subscriptions,
                      _returned_columns(conn), renames(conn), removed_articles(conn))


def _check_remotes(conn: sqlite3.Connection, identity: SiteIdentity, subscribers: list[str]) -> None:
    """Raise UnknownRemote for the first of ``subscribers`` that is no remote, in one query."""
    known = {name for (name,) in conn.execute(
        "SELECT name FROM fieldsync_remote WHERE name IN (SELECT value FROM json_each(?))", (json.dumps(subscribers),))}
    check_subscribers(identity, known, subscribers)


def _returned_columns(conn: sqlite3.Connection) -> Callable[[int], str | None]:
    """The columns a row written back to its origin lists, by its seq (None: all)."""

    def returned_columns(seq: int) -> str | None:
        found = conn.execute("SELECT columns FROM fieldsync_returned WHERE seq = ?", (seq,)).fetchone()
        return None if found is None else found[0]

    return returned_columns


def concern_rows(conn: sqlite3.Connection) -> ConcernRows:
    """What finding the subscribers a range concerns reads
    (agent.site.reading.concerned_indexes): the subscription rows are asked
    for once the range's rows are known, and only those that can match."""

    def subscriptions(found: Concern) -> dict[str, list[tuple]]:
        publications, pairs = found.wanted()
        rows: dict[str, list[tuple]] = {}
        if not publications and not pairs:
            return rows
        for remote, publication, value, since, until in conn.execute(
                "SELECT remote, publication, value, since, until FROM fieldsync_subscription"
                " WHERE publication IN (SELECT value FROM json_each(?)) OR (publication, value) IN"
                " (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))"
                " ORDER BY rowid", (json.dumps(publications), json.dumps(pairs))):
            rows.setdefault(remote, []).append((publication, value, since, until))
        return rows

    # A removed article still concerns the log transactions before its removal.
    articles = conn.execute(ARTICLE_ROWS).fetchall() + [row[:4] for row in removed_articles(conn)]
    return ConcernRows(articles, renames(conn), subscriptions)
