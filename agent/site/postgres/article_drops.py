"""An article removed where extracted remotes hold its table: sent to them
through their streams, so that they stop capturing the table
(docs/site-database.md, "Removing an article"; a SQLite consolidated's
changes.send_article_drops_locked).

Rules of this file:
* The remotes are found before the articles go (:func:`article_drops_to`:
  the extracted remotes subscribed to each publication; dropping a
  publication deletes its subscriptions) and named in the change's row,
  which no later row of the site knows any more.
* The change is written in the transaction that removes the articles,
  which writes no other capture row (the table's capture triggers go in
  it): the cut makes it a log transaction of its own.
* The articles sent (``removed_article``) and a dropped publication's
  subscriptions (ended through ``subscription_change``) hold for the log
  transactions before the change, for a remote that reads them later:
  until the cut gives the change its offset, for every one logged.
"""

from __future__ import annotations

from typing import Iterable

import psycopg

from ..capture import ROUTE
from ..change_rows import drop_change
from .changes import write_change
from .reading import table_renames


def article_drops_to(conn: psycopg.Connection, publications: Iterable[str]) -> dict[str, list[str]]:
    """By publication: the extracted remotes subscribed to it."""
    found: dict[str, list[str]] = {}
    for publication, remote in conn.execute(
            "SELECT DISTINCT s.publication, s.remote FROM fieldsync.subscription s"
            " JOIN fieldsync.remote r ON r.name = s.remote WHERE s.publication = ANY(%s) AND s.until IS NULL"
            " AND r.peer_incarnation IS NOT NULL ORDER BY 1, 2", (list(dict.fromkeys(publications)),)):
        found.setdefault(publication, []).append(remote)
    return found


def send_article_drops_in(conn: psycopg.Connection, site: str, removed: list[tuple], to: dict[str, list[str]],
                          made_at: object, *, dropped: str | None = None) -> tuple[str, ...]:
    """Inside the transaction that removed the articles ``removed`` (their
    reading.article_rows): the change of ``drop_article`` steps that sends
    each to ``to``, the remotes :func:`article_drops_to` found for its
    publication before.  The articles sent, and the subscriptions of a
    publication ``dropped`` whole, hold for the log transactions before the
    change (its cut ends them).  Returns the remotes it reaches, sorted."""
    change = drop_change([row[:2] for row in removed], to, table_renames(conn))
    if change.steps:
        write_change(conn, site, change.steps, {}, change.steps, [], made_at, to=change.to)
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO fieldsync.removed_article (table_name, publication, columns, subscribe_by,"
                               " routed) VALUES (%s, %s, %s, %s, %s)",
                               [(*row[:3], None if row[3] == ROUTE else row[3], row[3] == ROUTE)
                                for row in removed if row[1] in change.to])
    if dropped is not None and dropped in change.to:
        conn.execute("INSERT INTO fieldsync.subscription_change (ends) SELECT id FROM fieldsync.subscription"
                     " WHERE publication = %s AND until IS NULL", (dropped,))
    elif dropped is not None:  # no remote reads it any more
        conn.execute("DELETE FROM fieldsync.subscription WHERE publication = %s", (dropped,))
    return change.reached
