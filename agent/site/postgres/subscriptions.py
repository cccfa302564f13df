"""Subscriptions of a PostgreSQL site: which remote receives which rows.

Rules of this file:
* The rules are a SQLite site's (agent.site.publication_rules): a remote
  subscribes to a publication with a value (several values make several
  subscriptions), a value is a SQLite value and never NaN, subscribing
  twice with the same value is one subscription, ending one that is not
  held is refused naming those that are.
* A value keeps its type: ``fieldsync.subscription`` has one column per
  kind of value (``value_integer``, ``value_real``, ``value_text``,
  ``value_blob``), at most one of them set; all NULL is the value NULL.
  So ``7``, ``7.0`` and ``'7'`` stay three values, as on SQLite.
* ``since`` and ``until`` are the commit offsets between which a
  subscription holds (layout 9 of a SQLite site).  A remote that was
  extracted (it has a peer incarnation) changes them through its stream
  (resubscribe.py); before extraction a subscription holds from the start
  (``since`` 0) and ending it deletes it, as on SQLite.
* ``matching`` counts the rows that hold the value as readers select: the
  SUBSCRIBE BY column as it travels (typemap.py) equal to the value in
  Python's terms.
* Functions here run inside the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Iterable

import psycopg
from psycopg import sql

from ..clock import in_utc
from ..errors import UnknownPublication, UnknownRemote
from ..identity import SiteIdentity
from ..publication_rules import (Subscription, SubscriptionChange, Value, check_subscription_value,
                                 find_subscription, not_subscribed)
from .typemap import KINDS, Kind

VALUE_COLUMNS = "value_integer, value_real, value_text, value_blob"
_READ_CHUNK = 10_000


def value_columns(value: Value) -> tuple[int | None, float | None, str | None, bytes | None]:
    """``value`` spread over the typed columns (checked values only)."""
    kinds = (int, float, str, bytes)
    return tuple(value if type(value) is kind else None for kind in kinds)  # type: ignore[return-value]


def stored_value(integer: int | None, real: float | None, text: str | None, blob: bytes | None) -> Value:
    """The value the typed columns hold."""
    for held in (integer, real, text):
        if held is not None:
            return held
    return None if blob is None else bytes(blob)


def check_subscription(conn: psycopg.Connection, remote: str, publication: str, value: Value) -> None:
    """Raise unless ``remote`` and ``publication`` exist and ``value`` can be a subscription value."""
    if conn.execute("SELECT 1 FROM fieldsync.remote WHERE name = %s", (remote,)).fetchone() is None:
        raise UnknownRemote(f"no remote named {remote!r}; add it before subscribing it")
    if conn.execute("SELECT 1 FROM fieldsync.publication WHERE name = %s", (publication,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {publication!r}")
    check_subscription_value(value)


def insert_subscriptions(conn: psycopg.Connection, rows: Iterable[tuple[str, str, Value, datetime]], *,
                         since: int = 0) -> int:
    """Store ``(remote, publication, value, created_at)`` rows, holding from
    ``since``; return how many."""
    params = [(remote, publication, *value_columns(value), in_utc(created), since)
              for remote, publication, value, created in rows]
    if params:
        with conn.cursor() as cursor:
            cursor.executemany(f"INSERT INTO fieldsync.subscription (remote, publication, {VALUE_COLUMNS},"
                               " created_at, since) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", params)
    return len(params)


def current_subscriptions(conn: psycopg.Connection, remote: str) -> list[tuple[int, str, Value]]:
    """``(id, publication, value)`` of each subscription of ``remote`` that
    holds, one whose end waits for its cut (resubscribe.py) left out."""
    return [(key, pub, stored_value(*values)) for key, pub, *values in conn.execute(
        f"SELECT id, publication, {VALUE_COLUMNS} FROM fieldsync.subscription WHERE remote = %s AND until IS NULL"
        " AND id NOT IN (SELECT ends FROM fieldsync.subscription_change) ORDER BY id", (remote,))]


def change_subscription(conn: psycopg.Connection, identity: SiteIdentity, remote: str, publication: str,
                        value: Value, *, subscribe: bool, now: datetime) -> SubscriptionChange | None:
    """Subscribe ``remote`` to (or unsubscribe it from) ``publication`` with
    ``value``; None, with nothing done, when the remote was extracted: the
    change then goes through its stream (resubscribe.py)."""
    check_subscription(conn, remote, publication, value)
    # The remote's row, locked: its subscription changes are one at a time.
    [streamed] = conn.execute("SELECT peer_incarnation IS NOT NULL FROM fieldsync.remote WHERE name = %s"
                              " FOR UPDATE", (remote,)).fetchone()
    if streamed:
        return None
    current = current_subscriptions(conn, remote)
    found = find_subscription(current, publication, value)
    if subscribe and found is not None:
        return SubscriptionChange(remote, publication, value, subscribe, changed=False)
    if not subscribe and found is None:
        raise not_subscribed(remote, publication, value, current)
    if subscribe:
        insert_subscriptions(conn, [(remote, publication, value, now)])
    else:
        conn.execute("DELETE FROM fieldsync.subscription WHERE id = %s", (found,))
    return SubscriptionChange(remote, publication, value, subscribe, matching=matching(conn, publication, value))


def list_subscriptions(conn: psycopg.Connection, remote: str | None = None) -> tuple[Subscription, ...]:
    """The subscriptions that hold (ended ones are history, kept for the log's
    readers; so are those of a dropped publication, which the next cut ends)."""
    query = (f"SELECT remote, publication, {VALUE_COLUMNS}, created_at FROM fieldsync.subscription s"
             " WHERE until IS NULL AND EXISTS (SELECT 1 FROM fieldsync.publication p WHERE p.name = s.publication)")
    params: tuple = ()
    if remote is not None:
        query += " AND remote = %s"
        params = (remote,)
    rows = conn.execute(query + ' ORDER BY remote COLLATE "C", publication COLLATE "C", id', params).fetchall()
    return tuple(Subscription(name, publication, stored_value(*values), in_utc(created))  # type: ignore[arg-type]
                 for name, publication, *values, created in rows)


# Kinds that travel as their own capture text (their load is ``str`` or
# ``int``): a row's value can be narrowed to by its text in SQL.
_OWN_TEXT = {kind.name for kind in KINDS.values() if kind.load in (str, int)}


def candidate_texts(kind: Kind, values: Iterable[Value]) -> list[str] | None:
    """The capture texts of a column of ``kind`` whose travelling value
    equals one of ``values`` in Python's terms (as readers select): a WHERE
    on them selects every such row and maybe more (None: no narrowing for
    this kind; an empty list: no row can hold one)."""
    if kind.name not in _OWN_TEXT:
        return None
    texts = []
    for value in values:
        if kind.load is str and type(value) is str:
            texts.append(value)
        elif kind.load is int and type(value) is int:
            texts.append(str(value))
        elif kind.load is int and type(value) is float and value.is_integer():  # 7.0 == 7
            texts.append(str(int(value)))
    return texts


def matching(conn: psycopg.Connection, publication: str, value: Value) -> int | None:
    """How many rows of the publication's SUBSCRIBE BY articles hold
    ``value`` now, as readers select them; None when there is no such
    article or no value."""
    if value is None:
        return None
    articles = conn.execute(
        "SELECT a.table_schema, a.table_name, a.subscribe_by, s.columns, s.kinds FROM fieldsync.article a"
        " JOIN fieldsync.shape s ON s.id = a.shape WHERE a.publication = %s AND a.subscribe_by IS NOT NULL",
        (publication,)).fetchall()
    if not articles:
        return None
    count = 0
    for schema, table, column, columns, kinds in articles:
        if not conn.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
                            (schema, table)).fetchone()[0]:
            continue  # a missing table (missing_tables) holds nothing
        kind = KINDS[kinds[columns.index(column)]]
        held = sql.SQL(kind.capture).format(sql.Identifier(column))
        query = sql.SQL("SELECT {} FROM {} WHERE {} IS NOT NULL").format(held, sql.Identifier(schema, table),
                                                                         sql.Identifier(column))
        params: tuple = ()
        texts = candidate_texts(kind, [value])
        if texts is not None:
            query += sql.SQL(" AND {} = ANY(%s)").format(held)
            params = (texts,)
        with conn.cursor(name="fieldsync_matching") as cursor:
            cursor.itersize = _READ_CHUNK
            cursor.execute(query, params)
            count += sum(1 for (text,) in cursor if kind.load(text) == value)
    return count


def forget_before(conn: psycopg.Connection, bound: int) -> None:
    """After truncation through ``bound``: subscriptions that ended at or
    below it no longer concern any read (every read starts above it), nor
    does a start at or below it, nor an article removed at or below it
    (as on SQLite, agent.site.sqlite.log)."""
    conn.execute("DELETE FROM fieldsync.subscription WHERE until <= %s", (bound,))
    conn.execute("UPDATE fieldsync.subscription SET since = 0 WHERE since > 0 AND since <= %s", (bound,))
    conn.execute("DELETE FROM fieldsync.removed_article r USING fieldsync.schema_change c"
                 " WHERE c.txid = r.txid AND c.commit_offset <= %s", (bound,))  # likewise
