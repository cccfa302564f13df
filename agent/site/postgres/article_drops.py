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
"""

from __future__ import annotations

from typing import Iterable

import psycopg

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


def send_article_drops_in(conn: psycopg.Connection, site: str, removed: list[tuple[str, str]],
                          to: dict[str, list[str]], made_at: object) -> tuple[str, ...]:
    """Inside the transaction that removed the articles ``removed`` (``(shown
    table, publication)``): the change of ``drop_article`` steps that sends
    each to ``to``, the remotes :func:`article_drops_to` found for its
    publication before.  Returns the remotes it reaches, sorted."""
    change = drop_change(removed, to, table_renames(conn))
    if change.steps:
        write_change(conn, site, change.steps, {}, change.steps, [], made_at, to=change.to)
    return change.reached
