"""Changing an extracted remote's subscriptions through its stream at a
PostgreSQL consolidated (SQL Remote's SYNCHRONIZE SUBSCRIPTION; a SQLite
site's agent/site/sqlite/resubscribe.py): docs/postgres.md, "Changing a
remote's subscriptions".

Rules of this file:
* One change is one REPEATABLE READ transaction (:func:`change_in`) that
  takes, before its snapshot, the cut lock and a SHARE lock on every
  table of the publication (each writer of them has finished, and the
  next waits for the change's commit; a table not free within
  LOCK_TIMEOUT gives the change up, nothing changed), then cuts the log (log.cut_in):
  what it reads of the tables is the log up to the new log end ``E``, and
  no log transaction between ``E`` and the change's own touches them.
* It writes the rows that leave the remote's subset as DELETEs and those
  that enter it as INSERTs, marked *return to origin* with the remote as
  their origin (so that remote alone gets them), DELETEs children first,
  INSERTs parents first, each table's in key order, each row listed in
  ``fieldsync.returned`` as an apply's rows written back are.
  Membership is the reader's own test (View.contains), on the row as the
  log carries it.
* A new subscription holds from ``E + 1``.  An ended one holds through
  the log transaction of its rows, whose offset only the next cut gives:
  ``fieldsync.subscription_change`` keeps it until then, and that cut
  makes the writing transaction a log transaction of its own and sets
  ``until`` one past it (log.cut_in).  One that moves no row ends at
  ``E + 1``.
* A row that follows its parent moves with the route it has in the
  change's snapshot (the route is read as extraction reads it), and is
  written with it, as the capture triggers write it.
* A row the remote keeps through another subscription (its table is in
  several publications: agent.site.union) whose published columns the
  change alters goes to it as an UPDATE of those columns, listed in
  ``fieldsync.returned``, as a SQLite site's change sends it.
"""

from __future__ import annotations

import json
from datetime import datetime
from itertools import islice
from typing import Iterator

import psycopg
from psycopg import errors as pg_errors, sql

from ..capture import FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_UPDATE
from ..errors import SiteBusy
from ..identity import Role, SiteIdentity
from ..publication_rules import SubscriptionChange, Value, find_subscription, not_subscribed, parents_first
from ..selection import plan_from_rows
from ..union import UnionView, make_view
from ..view import View
from .capture import PgShape, list_written_back, load_shapes, set_origin, shown_table
from .foreign_keys import foreign_keys
from .log import cut_in
from .reading import article_rows
from .route import Chain, chains, route_expression
from .subscriptions import candidate_texts, check_subscription, current_subscriptions, insert_subscriptions, matching
from .typemap import KINDS, loader

# Rows read from a table, and written to the capture table, at a time.
_BATCH = 1000
# Seconds the change waits for each table's lock (changes.LOCK_TIMEOUT's reason).
LOCK_TIMEOUT = 10.0


def publication_tables(conn: psycopg.Connection, publication: str) -> list[tuple[str, str]]:
    """``(schema, table)`` of each table of ``publication`` the database
    holds (one an application dropped has no row to move)."""
    return [(schema, table) for schema, table in conn.execute(
        "SELECT table_schema, table_name FROM fieldsync.article WHERE publication = %s"
        " AND to_regclass(format('%%I.%%I', table_schema, table_name)) IS NOT NULL"
        " ORDER BY table_schema, table_name", (publication,))]


def change_in(conn: psycopg.Connection, identity: SiteIdentity, remote: str, publication: str, value: Value, *,
              subscribe: bool, now: datetime, tables: list[tuple[str, str]]) -> tuple[SubscriptionChange, str | None]:
    """The change, in the caller's new transaction (nothing run in it yet),
    and its writing transaction (txid text) when it wrote rows, for the
    caller to cut the log and find their offset (:func:`offset_of`).
    ``tables``: the publication's (:func:`publication_tables`), read before
    the transaction to be locked before its snapshot; SiteBusy when they
    changed since."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    # The cut lock first: waiting for it (behind a cut or an extraction)
    # holds up no application.  Then the tables, each for LOCK_TIMEOUT at
    # most: a lock request waiting behind an open transaction queues every
    # later writer of the table behind it.  Neither statement takes the
    # snapshot, which the cut's first query does.
    conn.execute("LOCK TABLE fieldsync.cut IN EXCLUSIVE MODE")
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{round(LOCK_TIMEOUT * 1000)}ms")))
    for schema, table in tables:
        try:
            conn.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.Identifier(schema, table)))
        except pg_errors.LockNotAvailable:
            raise SiteBusy(f"changing {remote!r}'s subscriptions to {publication!r}: table "
                           f"{shown_table(schema, table)!r} was not free of writers within {LOCK_TIMEOUT:g} s (an "
                           "open transaction wrote it; while the change waited, its other writers queued behind "
                           "it); nothing changed: run it again when the table is less busy") from None
    conn.execute("SET LOCAL lock_timeout = 0")
    end = cut_in(conn, identity.name).log_end
    if publication_tables(conn, publication) != tables:
        raise SiteBusy(f"the tables of publication {publication!r} changed while {remote!r}'s subscriptions "
                       "were being changed; run the command again")
    check_subscription(conn, remote, publication, value)
    current = current_subscriptions(conn, remote)
    found = find_subscription(current, publication, value)
    if subscribe and found is not None:
        return SubscriptionChange(remote, publication, value, subscribe, changed=False), None
    if not subscribe and found is None:
        raise not_subscribed(remote, publication, value, current)
    shown = [shown_table(schema, table) for schema, table in tables]
    articles = [row for row in article_rows(conn) if row[0] in shown]
    before = [(pub, held) for _, pub, held in current]
    after = before + [(publication, value)] if subscribe else [(pub, held) for key, pub, held in current
                                                               if key != found]
    old = plan_from_rows(remote, Role.CONSOLIDATED, articles, before).articles
    new = plan_from_rows(remote, Role.CONSOLIDATED, articles, after).articles
    shapes = load_shapes(conn)
    shape_of = {(schema, table): shape for schema, table, shape in conn.execute(
        "SELECT table_schema, table_name, shape FROM fieldsync.article WHERE publication = %s", (publication,))}
    moving = []
    for (schema, table), name in zip(tables, shown):
        shape = shapes[shape_of[schema, table]]
        was, will = old.get(name.lower()), new.get(name.lower())
        moving.append((shape, None if was is None else make_view(shape.shape, was),
                       None if will is None else make_view(shape.shape, will)))
    moving = _parents_first(conn, moving)
    routes = chains(conn)
    set_origin(conn, remote)
    deletes = sum(_write(conn, shape, KIND_DELETE, _moving(conn, shape, was, will, value, routes, leaving=True))
                  for shape, was, will in reversed(moving))
    inserts = sum(_write(conn, shape, KIND_INSERT, _moving(conn, shape, was, will, value, routes, leaving=False))
                  for shape, was, will in moving)
    if deletes or inserts:
        list_written_back(conn, remote)
    # Rows the remote keeps, through another subscription, whose columns
    # the change alters: an UPDATE of those columns.
    reshaped = sum(_reshape(conn, remote, shape, was, will, value, routes) for shape, was, will in moving)
    txid = None
    if deletes or inserts or reshaped:
        txid = conn.execute("SELECT pg_catalog.pg_current_xact_id()::text").fetchone()[0]
    if subscribe:
        insert_subscriptions(conn, [(remote, publication, value, now)], since=end + 1)
    elif txid is not None:
        conn.execute("INSERT INTO fieldsync.subscription_change (ends) VALUES (%s)", (found,))
    else:
        conn.execute("UPDATE fieldsync.subscription SET until = %s WHERE id = %s", (end + 1, found))
    return SubscriptionChange(remote, publication, value, subscribe, inserts=inserts, deletes=deletes,
                              matching=matching(conn, publication, value), streamed=True), txid


def offset_of(conn: psycopg.Connection, txid: str) -> int | None:
    """The offset of the log transaction of the writing transaction ``txid``
    (None: no cut took it yet)."""
    found = conn.execute("SELECT commit_offset FROM fieldsync.log_txn WHERE txid = %s::xid8", (txid,)).fetchone()
    return found[0] if found else None


def _parents_first(conn: psycopg.Connection, moving: list[tuple]) -> list[tuple]:
    """``moving`` (shape first) ordered parents first, by their foreign keys
    among them (publication_rules.parents_first)."""
    by_name = {entry[0].layout.shown: entry for entry in moving}
    keys = foreign_keys(conn)
    ordered = parents_first(list(by_name), lambda name: [key.parent for key in keys.get(name, ())], str)
    return [by_name[name] for name in ordered]


def _candidates(conn: psycopg.Connection, shape: PgShape, was: View | UnionView | None,
                will: View | UnionView | None, value: Value, routes: dict[tuple[str, str], Chain]
                ) -> Iterator[tuple[list[str | None], tuple]]:
    """The rows of ``shape``'s table that may enter or leave, in key order,
    each as its capture texts and the values a view tests (its image, and
    for a row that follows its parent its route after it, read in the
    change's snapshot as extraction reads it): where only the value's rows
    can (both views filter by the same column), those that may hold it,
    else every row."""
    layout = shape.layout
    texts = [sql.SQL(KINDS[kind].capture).format(sql.Identifier(column))
             for column, kind in zip(layout.columns, layout.kinds)]
    read = tuple(KINDS[kind] for kind in layout.kinds)
    chain = routes.get((layout.schema, layout.table))
    if chain is not None and layout.route_kind is not None:
        texts.append(route_expression(chain, [sql.Identifier(layout.schema, layout.table, column)
                                              for column in chain.columns]))
        read += (KINDS[layout.route_kind],)
    query = sql.SQL("SELECT ARRAY[{}] FROM {}").format(sql.SQL(", ").join(texts),
                                                       sql.Identifier(layout.schema, layout.table))
    parameters: tuple = ()
    at = None if was is None or will is None else was.filter_position
    if at is not None and at == will.filter_position and at < len(layout.columns) and value is not None:
        wanted = candidate_texts(KINDS[layout.kinds[at]], [value])
        if wanted is not None:  # only the value's rows can move: those that may hold it
            query += sql.SQL(" WHERE {} = ANY(%s)").format(texts[at])
            parameters = (wanted,)
    query += sql.SQL(" ORDER BY {}").format(sql.SQL(", ").join(map(sql.Identifier, layout.key_columns)))
    load = loader(read)
    with conn.cursor(name="fieldsync_resubscribe") as cursor:
        cursor.itersize = _BATCH
        cursor.execute(query, parameters)
        while found := cursor.fetchmany(_BATCH):
            for (captured,) in found:
                yield captured, load(captured)


def _moving(conn: psycopg.Connection, shape: PgShape, was: View | UnionView | None, will: View | UnionView | None,
            value: Value, routes: dict[tuple[str, str], Chain], *, leaving: bool) -> Iterator[list[str | None]]:
    """The rows that leave the subset (in ``was``, not in ``will``), or
    with ``leaving`` False those that enter it, as capture rows' texts: a
    row that follows its parent with its route after the widest image, as
    the capture triggers write it (route.py)."""
    if was is None and will is None:
        return
    width = len(shape.layout.columns)
    for captured, row in _candidates(conn, shape, was, will, value, routes):
        inside, outside = was is not None and was.contains(row), will is not None and will.contains(row)
        if (inside and not outside) if leaving else (outside and not inside):
            yield captured if len(captured) == width else [*captured[:width], *[None] * width, captured[width]]


def _reshape(conn: psycopg.Connection, remote: str, shape: PgShape, was: View | UnionView | None,
             will: View | UnionView | None, value: Value, routes: dict[tuple[str, str], Chain]) -> int:
    """Capture, for the remote alone, an UPDATE of each row it keeps before
    and after the change whose published columns the change alters (the
    table is in several of its publications: agent.site.union), as a
    SQLite site's change does: the columns it gains get their values,
    those it loses become NULL (but the columns its articles select by, where
    NULL would take the row out of the subset), and ``fieldsync.returned``
    lists the columns, which the reader sends as an UPDATE of those."""
    if was is None or will is None:
        return 0
    if not isinstance(was, UnionView) and not isinstance(will, UnionView) and was.positions == will.positions:
        return 0  # every row it keeps is published with the same columns
    layout = shape.layout
    width = len(layout.columns)
    selecting = {part.filter_position for part in (was.parts if isinstance(was, UnionView) else (was,))}
    written = 0
    batch: list[tuple[list[str | None], str]] = []

    def flush() -> None:
        last = conn.execute("SELECT coalesce(max(seq), 0) FROM fieldsync.capture"
                            " WHERE txid = pg_catalog.pg_current_xact_id()").fetchone()[0]
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO fieldsync.capture (shape, kind, flags, v) VALUES (%s, %s, %s, %s)",
                               [(shape.id, KIND_UPDATE, FLAG_RETURN_TO_ORIGIN, texts) for texts, _ in batch])
        seqs = [seq for (seq,) in conn.execute("SELECT seq FROM fieldsync.capture WHERE txid ="
                                               " pg_catalog.pg_current_xact_id() AND seq > %s ORDER BY seq", (last,))]
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO fieldsync.returned (seq, txid, peer, columns)"
                               " VALUES (%s, pg_catalog.pg_current_xact_id(), %s, %s)",
                               [(seq, remote, columns) for seq, (_, columns) in zip(seqs, batch)])
        batch.clear()

    for captured, row in _candidates(conn, shape, was, will, value, routes):
        before, after = set(was.published(row)), set(will.published(row))
        if not before or not after or before == after:
            continue
        route = list(captured[width:])
        lost = before - after
        new = (*(None if index in lost else row[index] for index in range(width)), *row[width:])
        if not (was.contains(new) and will.contains(new)):
            lost -= selecting
        texts = [*captured[:width], *(None if index in lost else captured[index] for index in range(width)),
                 *route, *route]
        batch.append((texts, json.dumps([layout.columns[index] for index in sorted((after - before) | lost)])))
        written += 1
        if len(batch) >= _BATCH:
            flush()
    if batch:
        flush()
    return written


def _write(conn: psycopg.Connection, shape: PgShape, kind: int, rows: Iterator[list[str | None]]) -> int:
    """Capture ``rows`` as ``kind`` for the remote alone (flag *return to
    origin*), a batch at a time; return how many."""
    written = 0
    with conn.cursor() as cursor:
        while batch := list(islice(rows, _BATCH)):
            cursor.executemany("INSERT INTO fieldsync.capture (shape, kind, flags, v) VALUES (%s, %s, %s, %s)",
                               [(shape.id, kind, FLAG_RETURN_TO_ORIGIN, captured) for captured in batch])
            written += len(batch)
    return written
