"""Changing a remote's subscriptions through its stream (SQL Remote's
SYNCHRONIZE SUBSCRIPTION): docs/site-database.md, "Changing a remote's
subscriptions".

Rules of this file:
* One change is one call inside the caller's write transaction: it cuts
  what the applications captured, writes the rows that leave the remote's
  subset as DELETEs and those that enter it as INSERTs (marked *return to
  origin*, so only that remote gets them) into one log transaction whose
  origin is the remote, and records from which commit offset the
  subscription holds (``since``) or no longer holds (``until``).
* A remote with no stream yet (never extracted) gets no rows through the
  log: extraction gives it its subset.  A change that moves no row writes
  nothing to the log and holds from the next commit on.
* Membership is the reader's own test (:meth:`View.contains`), so what
  enters or leaves is exactly what a reader of the new or old plan would
  select.
"""

from __future__ import annotations

import json
import sqlite3
from itertools import chain, islice
from typing import Iterator

from ..capture import FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_UPDATE, Shape
from ..identity import Role, SiteIdentity
from ..publication_rules import SubscriptionChange, Value, find_subscription, not_subscribed, parents_first
from ..union import UnionView, make_view
from ..view import View
from ._db import quote_ident
from .capture import ShapeCache, refresh_changed_tables, value_column
from .log import cut_locked, log_end
from .publications import check_subscription
from .route import ARTICLE_ROWS, follows
from .selection import plan_from_rows

# Rows written to the capture table per statement.
_BATCH = 1000


def change_locked(conn: sqlite3.Connection, identity: SiteIdentity, shapes: ShapeCache, remote: str,
                  publication: str, value: Value, *, subscribe: bool, created_at: str) -> SubscriptionChange:
    """Subscribe ``remote`` to (or unsubscribe it from) ``publication`` with
    ``value``, in the caller's write transaction."""
    check_subscription(conn, remote, publication, value)
    current = conn.execute("SELECT rowid, publication, value FROM fieldsync_subscription"
                           " WHERE remote = ? AND until IS NULL ORDER BY rowid", (remote,)).fetchall()
    found = find_subscription(current, publication, value)
    if subscribe and found is not None:
        return SubscriptionChange(remote, publication, value, subscribe, changed=False)
    if not subscribe and found is None:
        raise not_subscribed(remote, publication, value, current)
    streamed = identity.role is Role.CONSOLIDATED and conn.execute(
        "SELECT peer_incarnation IS NOT NULL FROM fieldsync_remote WHERE name = ?", (remote,)).fetchone()[0]
    matching = _matching(conn, publication, value)
    if not streamed:
        # Nothing was ever sent to it through the log: extraction gives it its subset.
        if subscribe:
            conn.execute("INSERT INTO fieldsync_subscription (remote, publication, value, created_at)"
                         " VALUES (?, ?, ?, ?)", (remote, publication, value, created_at))
        else:
            conn.execute("DELETE FROM fieldsync_subscription WHERE rowid = ?", (found,))
        return SubscriptionChange(remote, publication, value, subscribe, matching=matching)
    refresh_changed_tables(conn)
    end = cut_locked(conn, identity.name)
    before = [(pub, held) for _, pub, held in current]
    after = before + [(publication, value)] if subscribe else [
        (pub, held) for rowid, pub, held in current if rowid != found]
    # The publication's tables, with their articles in every publication:
    # a row another subscription of the remote keeps stays (agent.site.union).
    articles = conn.execute(ARTICLE_ROWS + " WHERE table_name IN (SELECT table_name FROM fieldsync_article"
                            " WHERE publication = ?)", (publication,)).fetchall()
    old = plan_from_rows(remote, identity.role, articles, before).articles
    new = plan_from_rows(remote, identity.role, articles, after).articles
    shape_of = dict(conn.execute("SELECT table_name, shape FROM fieldsync_article WHERE publication = ?",
                                 (publication,)).fetchall())
    tables = _parents_first(conn, list(shape_of))
    views = {}
    for table in tables:
        shape = shapes.get(shape_of[table])
        was, will = old.get(table.lower()), new.get(table.lower())
        views[table] = (shape, None if was is None else make_view(shape, was),
                        None if will is None else make_view(shape, will))
    # Two passes over each table, so memory holds one batch of rows
    # whatever the subset's size: DELETEs, children before parents; then
    # INSERTs, parents before children.
    deletes = sum(_write(conn, views[table][0], KIND_DELETE, _moving(conn, *views[table], value, leaving=True))
                  for table in reversed(tables))
    inserts = sum(_write(conn, views[table][0], KIND_INSERT, _moving(conn, *views[table], value, leaving=False))
                  for table in tables)
    offset = None
    if deletes or inserts:
        conn.execute("INSERT INTO fieldsync_returned (seq, columns) SELECT seq, '[]' FROM fieldsync_capture"
                     " WHERE seq > ?", (end,))
    # Rows the remote keeps, through another subscription, whose columns
    # the change alters: an UPDATE of those columns.
    reshaped = sum(_reshape(conn, *views[table], value) for table in tables)
    if deletes or inserts or reshaped:
        offset = cut_locked(conn, remote, end)
    # The change holds from its own log transaction on; an ended
    # subscription holds through it, so its DELETEs are read with the
    # article they leave.  With no rows, from the next commit on.
    at = offset if offset is not None else log_end(conn) + 1
    if subscribe:
        conn.execute("INSERT INTO fieldsync_subscription (remote, publication, value, created_at, since)"
                     " VALUES (?, ?, ?, ?, ?)", (remote, publication, value, created_at, at))
    else:
        conn.execute("UPDATE fieldsync_subscription SET until = ? WHERE rowid = ?",
                     (at + 1 if offset is not None else at, found))
    return SubscriptionChange(remote, publication, value, subscribe, inserts=inserts, deletes=deletes,
                              offset=offset, matching=matching, streamed=True)


def _moving(conn: sqlite3.Connection, shape: Shape, was: View | UnionView | None, will: View | UnionView | None,
            value: Value, *,
            leaving: bool) -> Iterator[tuple]:
    """The rows of ``shape``'s table, as shape-ordered tuples, that leave
    the subset (in ``was``, not in ``will``), or with ``leaving`` False
    those that enter it."""
    if was is None and will is None:
        return
    for row in _candidates(conn, shape, was, will, value):
        inside, outside = was is not None and was.contains(row), will is not None and will.contains(row)
        if (inside and not outside) if leaving else (outside and not inside):
            yield row


def _reshape(conn: sqlite3.Connection, shape: Shape, was: View | UnionView | None,
             will: View | UnionView | None, value: Value) -> int:
    """Capture, for the remote alone, an UPDATE of each row it keeps before
    and after the change whose published columns the change alters (the
    table is in several of its publications: agent.site.union): the
    columns it gains get their values, those it loses become NULL.  The
    old row is the row as it is, the new one the same with NULL in the
    columns lost, and ``fieldsync_returned`` lists the columns (the reader
    sends them as an UPDATE of those columns)."""
    if was is None or will is None:
        return 0
    if not isinstance(was, UnionView) and not isinstance(will, UnionView) and was.positions == will.positions:
        return 0  # every row it keeps is published with the same columns
    width = len(shape.columns)
    # The columns the articles select by: a row whose subset NULL would
    # leave keeps their values (it stays the remote's).
    selecting = {part.filter_position for part in (was.parts if isinstance(was, UnionView) else (was,))}
    written = 0
    for row in _candidates(conn, shape, was, will, value):
        before, after = set(was.published(row)), set(will.published(row))
        if not before or not after or before == after:
            continue
        routes = list(row[width:])
        lost = before - after
        new = [None if index in lost else row[index] for index in range(width)]
        if not (was.contains((*new, *routes)) and will.contains((*new, *routes))):
            lost -= selecting
            new = [None if index in lost else row[index] for index in range(width)]
        positions = list(range(2 * width)) + ([2 * width, 2 * width + 1] if routes else [])
        names = ", ".join(value_column(index) for index in positions)
        cursor = conn.execute(f"INSERT INTO fieldsync_capture (shape, kind, flags, {names}) VALUES "
                              f"({shape.id}, {KIND_UPDATE}, {FLAG_RETURN_TO_ORIGIN}, "
                              f"{', '.join('?' * len(positions))})", list(row[:width]) + new + routes + routes)
        conn.execute("INSERT INTO fieldsync_returned (seq, columns) VALUES (?, ?)",
                     (cursor.lastrowid, json.dumps([shape.columns[i] for i in sorted((after - before) | lost)])))
        written += 1
    return written


def _candidates(conn: sqlite3.Connection, shape: Shape, was: View | UnionView | None,
                will: View | UnionView | None, value: Value) -> Iterator[tuple]:
    """The rows that may enter or leave: where only the value's rows can
    (both views filter by the same column), those SQL finds equal to it (a
    superset of Python's equality: affinity makes ``'7' = 7`` true), else
    every row."""
    columns = ", ".join(quote_ident(column) for column in shape.columns)
    follow = follows(conn).get(shape.table.lower())
    if follow is not None and any(view is not None and _routed(view, len(shape.columns)) for view in (was, will)):
        # The rows follow their parent: their route after them, as the view reads it.
        columns += ", " + follow.route([f"{quote_ident(shape.table)}.{quote_ident(c)}" for c in follow.columns])
    sql = f"SELECT {columns} FROM {quote_ident(shape.table)}"
    params: tuple = ()
    if (was is not None and will is not None and was.filter_position is not None
            and was.filter_position == will.filter_position < len(shape.columns) and value is not None):
        sql += f" WHERE {quote_ident(shape.columns[was.filter_position])} = ?"
        params = (value,)
    cursor = conn.execute(sql, params)
    while rows := cursor.fetchmany(_BATCH):
        yield from rows


def _routed(view: View | UnionView, width: int) -> bool:
    """Whether the view selects by the route after a row's values."""
    parts = view.parts if isinstance(view, UnionView) else (view,)
    return any(part.filter_position == width for part in parts)


def _write(conn: sqlite3.Connection, shape: Shape, kind: int, rows: Iterator[tuple]) -> int:
    """Capture ``rows`` as ``kind`` for the remote alone (flag *return to
    origin*), a batch at a time; their fieldsync_returned rows are written
    once for all."""
    width = len(shape.columns)
    first = next(rows, None)
    if first is None:
        return 0
    rows = chain((first,), rows)
    # A row that follows its parent carries its route after the widest image.
    positions = list(range(width)) + ([2 * width] if len(first) > width else [])
    names = ", ".join(value_column(index) for index in positions)
    placeholders = ", ".join("?" * len(positions))
    sql = (f"INSERT INTO fieldsync_capture (shape, kind, flags, {names})"
           f" VALUES ({shape.id}, {kind}, {FLAG_RETURN_TO_ORIGIN}, {placeholders})")
    written = 0
    while batch := list(islice(rows, _BATCH)):
        conn.executemany(sql, batch)
        written += len(batch)
    return written


def _matching(conn: sqlite3.Connection, publication: str, value: Value) -> int | None:
    """How many rows of the publication's SUBSCRIBE BY articles hold
    ``value`` now (Python equality, as readers select); None when there is
    no such article or no value."""
    if value is None:
        return None
    by = conn.execute("SELECT table_name, subscribe_by FROM fieldsync_article WHERE publication = ?"
                      " AND subscribe_by IS NOT NULL", (publication,)).fetchall()
    if not by:
        return None
    count = 0
    for table, column in by:
        cursor = conn.execute(f"SELECT {quote_ident(column)} FROM {quote_ident(table)}"
                              f" WHERE {quote_ident(column)} = ?", (value,))
        while found := cursor.fetchmany(_BATCH):
            count += sum(1 for (held,) in found if held == value and held is not None)
    return count


def _parents_first(conn: sqlite3.Connection, tables: list[str]) -> list[str]:
    """``tables`` ordered parents first, by their foreign keys (publication_rules.parents_first)."""
    return parents_first(tables, lambda table: [row[2] for row in conn.execute(
        f"PRAGMA foreign_key_list({quote_ident(table)})")], str.lower)
