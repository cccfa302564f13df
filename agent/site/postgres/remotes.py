"""The remote-user table of a PostgreSQL site (``fieldsync.remote``), one
row per remote.

Rules of this file:
* Every change is checked by agent.site.remote_rules before it is written,
  so a PostgreSQL site refuses what a SQLite one refuses, with the same
  line; rows come back as the same :class:`RemoteUser` values (times in
  UTC, ``send_at`` a time of day, ``confirm_owed`` a bool).
* A change reads the row it checks ``FOR UPDATE``: another session's
  change waits, so the invariants hold under concurrency as they do under
  SQLite's write lock.
* A remote's horizon (docs/protocol.md, rule 8) is computed in Python by
  agent.site.remote_rules.horizon, the one rule: for ``RemoteFilter(lagging=True)``
  and for the truncation point.
* Functions here run inside the caller's transaction.
"""

from __future__ import annotations

import math
from datetime import datetime, time
from typing import Any, Callable, Iterable, Iterator, Sequence

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.types.json import Jsonb

from ..clock import in_utc
from ..due import DueQuery, PairsDue, find_pairs_due
from ..errors import InvalidSetting, UnknownRemote
from ..identity import SiteIdentity
from ..publication_rules import distinct_subscriptions
from ..remote_rules import (BULK_CHUNK, COLUMNS, NewRemote, PAIR_CHECKED, RemoteFilter, RemoteUser, TIME_AT,
                            check_count, check_new_remote, check_new_remotes, check_pair_update, check_start,
                            check_text, check_updatable, checked_update, horizon, is_pair_update, read_moves,
                            remote_exists)
from .log import log_end
from .read_positions import effective, leaving, selected
from .settings import forget_scope
from .subscriptions import insert_subscriptions

_SELECT = sql.SQL("SELECT {} FROM fieldsync.remote").format(sql.SQL(", ").join(map(selected, COLUMNS)))
_BY_NAME = sql.SQL(' ORDER BY name COLLATE "C"')
#: The peer is in error now: a transport error or a stopped stream in force,
#: or apply errors not yet acknowledged (the partial index apply_error_open).
IN_ERROR_SQL = ("(last_error IS NOT NULL OR stream_stopped IS NOT NULL OR EXISTS (SELECT 1 FROM fieldsync.apply_error"
                " e WHERE e.peer = fieldsync.remote.name AND e.acknowledged_at IS NULL))")


_INCARNATION_AT = COLUMNS.index("peer_incarnation")


def _row(values: tuple) -> RemoteUser:
    # By position: a fleet's agent reads every row at each run.
    record = list(values)
    for index in TIME_AT:
        if record[index] is not None:
            record[index] = in_utc(record[index])
    if record[_INCARNATION_AT] is not None:
        record[_INCARNATION_AT] = bytes(record[_INCARNATION_AT])
    return RemoteUser(*record)


def _assignments(columns: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(column)) for column in columns)


def get_remote(conn: psycopg.Connection, name: str, *, for_update: bool = False) -> RemoteUser:
    query = _SELECT + sql.SQL(" WHERE name = %s") + sql.SQL(" FOR UPDATE" if for_update else "")
    row = conn.execute(query, (name,)).fetchone()
    if row is None:
        raise UnknownRemote(f"no remote named {name!r}; add it with add_remote")
    return _row(row)


def list_remotes(conn: psycopg.Connection, names: Iterable[str] | None = None) -> tuple[RemoteUser, ...]:
    if names is None:
        return tuple(map(_row, conn.execute(_SELECT + _BY_NAME).fetchall()))
    return tuple(map(_row, conn.execute(_SELECT + sql.SQL(" WHERE name = ANY(%s)") + _BY_NAME,
                                        (list(names),)).fetchall()))


# agent.site.due.control_might_be_due over the row's columns (a row's own
# heartbeat and confirm timeout win; 0 counts as none, as in agent.controls).
_BEAT = "COALESCE(NULLIF(heartbeat, 0), %(heartbeat)s)"
_CONTROLS_DUE_SQL = (
    "SELECT name FROM fieldsync.remote WHERE confirm_received <> log_received OR confirm_owed"
    " OR control_sent_at IS NULL"
    f" OR control_sent_at <= %(now)s - {_BEAT} * %(share)s * %(margin)s"
    " OR (confirm_sent < log_sent AND GREATEST(control_sent_at, data_sent_at) <= %(now)s"
    f" - LEAST(LEAST(COALESCE(NULLIF(confirm_timeout, 0), %(timeout)s), {_BEAT})"
    f" * (1 << LEAST(probes, %(doublings)s)::integer), {_BEAT} * %(share)s) * %(margin)s)")
_READS_DUE_SQL = (f"SELECT name, {effective('log_send')}, log_sent, {effective('log_read')}, follows_common"
                  f" FROM fieldsync.remote WHERE GREATEST({effective('log_send')}, %(end)s) >"
                  f" GREATEST({effective('log_read')}, log_sent)")


def pairs_due(conn: psycopg.Connection, query: DueQuery) -> PairsDue:
    """agent.site.due: the pairs that may owe a control message, and those with a read due."""
    return find_pairs_due(conn.execute, _CONTROLS_DUE_SQL, _READS_DUE_SQL, query)


def list_remote_names(conn: psycopg.Connection) -> tuple[str, ...]:
    return tuple(name for (name,) in conn.execute(sql.SQL("SELECT name FROM fieldsync.remote") + _BY_NAME))


def list_transports(conn: psycopg.Connection) -> tuple[str | None, ...]:
    """The distinct transports named (None: a remote that names none), in a SQLite site's order."""
    return tuple(name for (name,) in conn.execute(
        'SELECT DISTINCT transport COLLATE "C" FROM fieldsync.remote ORDER BY 1 NULLS FIRST'))


def filter_where(which: RemoteFilter) -> tuple[sql.Composable, tuple]:
    """The SQL condition of ``which`` but its ``lagging`` (the horizon rule
    is applied in Python: :func:`iter_remotes`), and its parameters."""
    conditions: list[str] = []
    parameters: list[object] = []
    if which.silent_since is not None:
        conditions.append("(CASE WHEN heard_at IS NOT NULL THEN heard_at < %s"
                          " ELSE coalesce(last_received_at, created_at) < %s END)")
        parameters += [which.silent_since.timestamp(), which.silent_since]
    if which.with_errors:
        conditions.append(IN_ERROR_SQL)
    return sql.SQL(" WHERE " + " AND ".join(conditions) if conditions else ""), tuple(parameters)


def iter_remotes(conn: psycopg.Connection, which: RemoteFilter, *, chunk: int) -> Iterator[RemoteUser]:
    """The rows ``which`` selects, by name, fetched ``chunk`` at a time
    through a server-side cursor (inside the caller's transaction, which
    should be REPEATABLE READ: the log end and the rows of one snapshot)."""
    end = log_end(conn)
    where, parameters = filter_where(which)
    with conn.cursor(name="fieldsync_remotes") as cursor:
        cursor.itersize = chunk
        cursor.execute(_SELECT + where + _BY_NAME, parameters)
        for values in cursor:
            row = _row(values)
            if not which.lagging or row.horizon < end:
                yield row


def add_remote(conn: psycopg.Connection, identity: SiteIdentity, name: str, *, address: str | None,
               transport: str | None, public_key: str | None, send_every: int | None, send_at: time | str | None,
               start: int | None, peer_incarnation: bytes | None, now: datetime) -> RemoteUser:
    every, at = check_new_remote(identity, name, address=address, transport=transport, public_key=public_key,
                                 send_every=send_every, send_at=send_at, peer_incarnation=peer_incarnation)
    if conn.execute("SELECT 1 FROM fieldsync.remote WHERE name = %s", (name,)).fetchone():
        raise remote_exists(name)
    # A PostgreSQL site is a consolidated (identity.py): it has no rule of one peer.
    end = log_end(conn)
    start = check_start(end if start is None else start, end)
    try:
        with conn.transaction():  # a savepoint: a concurrent add of the same name is RemoteExists
            conn.execute("INSERT INTO fieldsync.remote (name, log_send, log_sent, confirm_sent, transport, address,"
                         " public_key, send_every, send_at, peer_incarnation, created_at)"
                         " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                         (name, start, start, start, transport, address, public_key, every, at, peer_incarnation,
                          in_utc(now)))
    except pg_errors.UniqueViolation:
        raise remote_exists(name) from None
    return get_remote(conn, name)


def add_remotes(conn: psycopg.Connection, identity: SiteIdentity, remotes: Sequence[NewRemote], *, now: datetime,
                progress: Callable[[int], None] | None) -> int:
    """Add every remote of ``remotes`` with its subscriptions, each starting
    at the log end; return how many subscriptions were stored.  The whole
    list is checked first (remote_rules.check_new_remotes); the caller's
    transaction makes it all or nothing."""
    taken = {name for (name,) in conn.execute("SELECT name FROM fieldsync.remote")}
    publications = {name for (name,) in conn.execute("SELECT name FROM fieldsync.publication")}
    check_new_remotes(identity, remotes, taken=taken, publications=publications, consolidated=None)
    start = log_end(conn)
    stamp = in_utc(now)
    subscribed = 0
    with conn.cursor() as cursor:
        for first in range(0, len(remotes), BULK_CHUNK):
            chunk = remotes[first:first + BULK_CHUNK]
            cursor.executemany(
                "INSERT INTO fieldsync.remote (name, log_send, log_sent, confirm_sent, transport, address, public_key,"
                " send_every, send_at, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(remote.name, start, start, start, remote.transport, remote.address, remote.public_key,
                  remote.send_every, remote.send_at, stamp) for remote in chunk])
            subscribed += insert_subscriptions(conn, [
                (remote.name, publication, value, stamp)
                for remote in chunk for publication, value in distinct_subscriptions(remote.subscriptions)])
            if progress is not None:
                progress(len(chunk))
    return subscribed


def remove_remote(conn: psycopg.Connection, name: str) -> None:
    if conn.execute("DELETE FROM fieldsync.remote WHERE name = %s", (name,)).rowcount == 0:
        raise UnknownRemote(f"no remote named {name!r}")
    conn.execute("DELETE FROM fieldsync.subscription WHERE remote = %s", (name,))
    forget_scope(conn, name)


def update_remote(conn: psycopg.Connection, name: str, changes: dict[str, Any]) -> RemoteUser:
    check_updatable(changes)
    current = get_remote(conn, name, for_update=True)
    stored = checked_update(current, changes, lambda: log_end(conn))
    if not stored:
        return current
    conn.execute(sql.SQL("UPDATE fieldsync.remote SET {}{} WHERE name = %s").format(_assignments(stored),
                                                                                     leaving(stored)),
                 (*stored.values(), name))
    return get_remote(conn, name)


def update_remotes(conn: psycopg.Connection, changes: dict[str, dict[str, Any]]) -> None:
    """:func:`update_remote` for many rows: rows changing only where the
    log was read (remote_rules.read_moves) are written with one statement
    per new value, unread; the others are read (and locked)
    in one query and the log end once; rows changing only a pair's columns
    are checked by remote_rules.check_pair_update and written with one
    statement per set of columns (the rows as a JSON array read into the
    table's own row type: an agent saves every pair of a fleet at each
    run, and a statement per row cost more than the run's other writes);
    any other change goes through update_remote."""
    end = log_end(conn)

    def write(move: tuple[tuple[str, int], ...], names: list[str]) -> int:
        assignments = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(column)) for column, _ in move)
        return conn.execute(sql.SQL("UPDATE fieldsync.remote SET {}{} WHERE name = ANY(%s)").format(
            assignments, leaving([column for column, _ in move])), (*(value for _, value in move), names)).rowcount

    changes = read_moves(changes, end, write)
    if not changes:
        return
    current = {name: dict(zip(PAIR_CHECKED, values)) for name, *values in conn.execute(
        sql.SQL("SELECT name, {} FROM fieldsync.remote WHERE name = ANY(%s) FOR UPDATE").format(
            sql.SQL(", ").join(map(selected, PAIR_CHECKED))), (list(changes),))}
    plain: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for name, columns in changes.items():
        row = current.get(name)
        if row is None or not is_pair_update(columns):
            update_remote(conn, name, columns)
            continue
        check_pair_update(name, row, columns, end)
        key = tuple(sorted(columns))
        plain.setdefault(key, []).append({"name": name, **{column: _json_value(columns[column]) for column in key}})
    for key, rows in plain.items():
        conn.execute(sql.SQL("UPDATE fieldsync.remote AS r SET {}{} FROM pg_catalog.jsonb_populate_recordset("
                             "NULL::fieldsync.remote, %s) AS v WHERE r.name = v.name").format(
            sql.SQL(", ").join(sql.SQL("{0} = v.{0}").format(sql.Identifier(column)) for column in key),
            leaving(key, "r")), (Jsonb(rows),))


def _json_value(value: Any) -> Any:
    """A pair column's value in JSON: an infinite clock reading (which
    JSON has no number for) as the text its column reads it from."""
    if type(value) is float and not math.isfinite(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def record_send(conn: psycopg.Connection, name: str, log_sent: int, messages: int, now: datetime) -> RemoteUser:
    current = get_remote(conn, name, for_update=True)
    check_count(messages)
    return update_remote(conn, name, {"log_sent": log_sent, "send_count": current.send_count + messages,
                                      "last_sent_at": now})


def record_delivered(conn: psycopg.Connection, name: str, messages: int, now: datetime) -> None:
    """Count ``messages`` the transport accepted for ``name``: the transport
    error in force, if any, is over."""
    check_count(messages)
    conn.execute("UPDATE fieldsync.remote SET send_count = send_count + %s, last_sent_at = %s, last_error = NULL,"
                 " last_error_at = NULL WHERE name = %s", (messages, in_utc(now), name))


def record_error(conn: psycopg.Connection, name: str, message: str | None, now: datetime) -> RemoteUser:
    """A transport error with ``name``, in force until a send to or a
    receive from the peer succeeds, and counted (None: clear the one in
    force, the count stays)."""
    check_text("last_error", message)
    get_remote(conn, name, for_update=True)
    if message is None:
        conn.execute("UPDATE fieldsync.remote SET last_error = NULL, last_error_at = NULL WHERE name = %s", (name,))
    else:
        stamp = in_utc(now)
        conn.execute("UPDATE fieldsync.remote SET last_error = %s, last_error_at = %s, error_count = error_count + 1,"
                     " error_seen_at = %s WHERE name = %s", (message, stamp, stamp, name))
    return get_remote(conn, name)


def record_stream_stopped(conn: psycopg.Connection, name: str, message: str, now: datetime) -> RemoteUser:
    """The stream with ``name`` stopped: in force until a message of the
    peer arrives while its stream runs again (:func:`record_heard`)."""
    if type(message) is not str or not message:
        raise InvalidSetting(f"a stopped stream is recorded with its message, got {message!r}")
    get_remote(conn, name, for_update=True)
    stamp = in_utc(now)
    conn.execute("UPDATE fieldsync.remote SET stream_stopped = %s, stream_stopped_at = %s,"
                 " error_count = error_count + 1, error_seen_at = %s WHERE name = %s", (message, stamp, stamp, name))
    return get_remote(conn, name)


def record_heard(conn: psycopg.Connection, names: Iterable[str]) -> None:
    """A message of each peer of ``names`` arrived while its stream runs:
    its transport error and stopped stream in force are over.  Only a row
    holding one is written."""
    with conn.cursor() as cursor:
        cursor.executemany("UPDATE fieldsync.remote SET last_error = NULL, last_error_at = NULL,"
                           " stream_stopped = NULL, stream_stopped_at = NULL WHERE name = %s"
                           " AND (last_error IS NOT NULL OR stream_stopped IS NOT NULL)", [(name,) for name in names])


def replaced_incarnations(conn: psycopg.Connection, name: str) -> frozenset[bytes]:
    """The incarnations of ``name``'s copies that extraction replaced."""
    return frozenset(bytes(incarnation) for (incarnation,) in conn.execute(
        "SELECT incarnation FROM fieldsync.replaced_copy WHERE remote = %s", (name,)))


def all_replaced_incarnations(conn: psycopg.Connection) -> dict[str, frozenset[bytes]]:
    found: dict[str, set[bytes]] = {}
    for remote, incarnation in conn.execute("SELECT remote, incarnation FROM fieldsync.replaced_copy"):
        found.setdefault(remote, set()).add(bytes(incarnation))
    return {remote: frozenset(values) for remote, values in found.items()}


def lowest_horizon(conn: psycopg.Connection) -> int | None:
    """The smallest horizon of every remote (None: there is none): the log
    after it is what some peer may still need."""
    horizons = [horizon(*row) for row in conn.execute(
        f"SELECT {effective('log_read')}, log_sent, confirm_sent FROM fieldsync.remote")]
    return min(horizons, default=None)


def counts(conn: psycopg.Connection) -> dict[str, int]:
    """Rows of the remote-user, conflict and apply-error tables, counted in
    one statement (one snapshot)."""
    remotes, conflicts, errors = conn.execute(
        "SELECT (SELECT count(*) FROM fieldsync.remote), (SELECT count(*) FROM fieldsync.conflict),"
        " (SELECT count(*) FROM fieldsync.apply_error)").fetchone()
    return {"remotes": remotes, "conflicts": conflicts, "apply_errors": errors}
