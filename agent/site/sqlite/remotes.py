"""The remote-user table of a SQLite site (SQL Remote's SYSREMOTEUSER),
one row per peer; its values and rules are agent.site.remote_rules'.

Rules of this file:
* Every change runs in its own short write transaction, except
  ``log_received``, which :mod:`agent.site.apply` moves together with the
  applied data, and a bulk add (:func:`add_remotes_locked`), which adds
  every row and subscription of a fleet in one transaction or none.
* Every change is checked by remote_rules before it is written; times are
  stored as ISO 8601 text in UTC, ``send_at`` as ``HH:MM[:SS]`` text,
  ``confirm_owed`` as 0 or 1.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, time
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..clock import utc_now
from ..due import DueQuery, PairsDue, find_pairs_due
from ..errors import InvalidSetting, UnknownRemote
from ..identity import Role, SiteIdentity
from ..publication_rules import distinct_subscriptions
from ..remote_rules import (BULK_CHUNK, COLUMNS, NewRemote, PAIR_CHECKED, RemoteFilter, RemoteUser, TIME_AT,
                            TIME_FIELDS, check_count, check_new_remote, check_new_remotes, check_pair_update,
                            check_start, check_text, check_updatable, checked_update, is_pair_update,
                            one_consolidated, read_moves, remote_exists)
from ._db import format_time, parse_time
from .log import HORIZON_SQL, log_end
from .read_positions import EFFECTIVE, leaving, selected

_SELECT = f"SELECT {', '.join(map(selected, COLUMNS))} FROM fieldsync_remote"
# The row's plain values (remote_rules.plain_values) as SQLite has them:
# times are stored as ISO 8601 text in UTC and send_at as time.isoformat
# writes it, confirm_owed as 0 or 1; an incarnation id (16 bytes, the
# table's CHECK) is written here in UUID form, 8-4-4-4-12 hex digits.
_UUID_SQL = ("lower(substr(hex(peer_incarnation), 1, 8) || '-' || substr(hex(peer_incarnation), 9, 4) || '-' ||"
             " substr(hex(peer_incarnation), 13, 4) || '-' || substr(hex(peer_incarnation), 17, 4) || '-' ||"
             " substr(hex(peer_incarnation), 21))")
_PLAIN_SELECT = "SELECT " + ", ".join(
    f"CASE WHEN peer_incarnation IS NULL THEN NULL ELSE {_UUID_SQL} END" if column == "peer_incarnation"
    else selected(column) for column in COLUMNS) + " FROM fieldsync_remote"


_SEND_AT, _CONFIRM_OWED_AT = COLUMNS.index("send_at"), COLUMNS.index("confirm_owed")


def _row(values: tuple) -> RemoteUser:
    # By position: a fleet's agent reads every row at each run.
    record = list(values)
    for index in TIME_AT:
        if record[index] is not None:
            record[index] = parse_time(record[index])
    if record[_SEND_AT] is not None:
        record[_SEND_AT] = time.fromisoformat(record[_SEND_AT])
    record[_CONFIRM_OWED_AT] = bool(record[_CONFIRM_OWED_AT])
    return RemoteUser(*record)


def _stored(values: dict[str, Any]) -> dict[str, Any]:
    """Checked column values (remote_rules) as this table stores them."""
    for name in TIME_FIELDS & set(values):
        values[name] = format_time(values[name])
    if values.get("send_at") is not None:
        values["send_at"] = values["send_at"].isoformat()
    if "confirm_owed" in values:
        values["confirm_owed"] = int(values["confirm_owed"])
    return values


def get_remote(conn: sqlite3.Connection, name: str) -> RemoteUser:
    row = conn.execute(_SELECT + " WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise UnknownRemote(f"no remote named {name!r}; add it with add_remote")
    return _row(row)


def list_remotes(conn: sqlite3.Connection, names: Iterable[str] | None = None) -> tuple[RemoteUser, ...]:
    if names is None:
        return tuple(map(_row, conn.execute(_SELECT + " ORDER BY name").fetchall()))
    return tuple(map(_row, conn.execute(_SELECT + " WHERE name IN (SELECT value FROM json_each(?)) ORDER BY name",
                                        (json.dumps(list(names)),)).fetchall()))


# agent.site.due.control_might_be_due over the row's columns (a row's own
# heartbeat and confirm timeout win; 0 counts as none, as in agent.controls).
_BEAT = "COALESCE(NULLIF(heartbeat, 0), :heartbeat)"
_CONTROLS_DUE_SQL = (
    "SELECT name FROM fieldsync_remote WHERE confirm_received != log_received OR confirm_owed != 0"
    " OR control_sent_at IS NULL"
    f" OR control_sent_at <= :now - {_BEAT} * :share * :margin"
    " OR (confirm_sent < log_sent AND max(control_sent_at, COALESCE(data_sent_at, control_sent_at)) <= :now"
    f" - min(min(COALESCE(NULLIF(confirm_timeout, 0), :timeout), {_BEAT}) * (1 << min(probes, :doublings)),"
    f" {_BEAT} * :share) * :margin)")
_READS_DUE_SQL = (f"SELECT name, {EFFECTIVE['log_send']}, log_sent, {EFFECTIVE['log_read']}, follows_common"
                  f" FROM fieldsync_remote WHERE max({EFFECTIVE['log_send']}, :end) > max({EFFECTIVE['log_read']},"
                  " log_sent)")


def pairs_due(conn: sqlite3.Connection, query: DueQuery) -> PairsDue:
    """agent.site.due: the pairs that may owe a control message, and those with a read due."""
    return find_pairs_due(conn.execute, _CONTROLS_DUE_SQL, _READS_DUE_SQL, query)


def list_remote_names(conn: sqlite3.Connection) -> tuple[str, ...]:
    return tuple(name for (name,) in conn.execute("SELECT name FROM fieldsync_remote ORDER BY name"))


#: A remote-user row's peer is in error now: a transport error or a stopped
#: stream in force, or apply errors not yet acknowledged (one lookup in the
#: partial index fieldsync_apply_error_open).
IN_ERROR_SQL = ("(last_error IS NOT NULL OR stream_stopped IS NOT NULL OR EXISTS (SELECT 1 FROM fieldsync_apply_error"
                " WHERE peer = fieldsync_remote.name AND acknowledged_at IS NULL))")


def filter_where(which: RemoteFilter, end: int) -> tuple[str, tuple]:
    """The SQL condition of ``which`` and its parameters, for a log end ``end``."""
    conditions: list[str] = []
    parameters: list[object] = []
    if which.lagging:
        # The peer's horizon (RemoteUser.horizon) is behind the log end.
        conditions.append(f"{HORIZON_SQL} < ?")
        parameters.append(end)
    if which.silent_since is not None:
        # Stored times are ISO 8601 in UTC, all written by format_time: as text they sort as times.
        conditions.append("(CASE WHEN heard_at IS NOT NULL THEN heard_at < ?"
                          " ELSE coalesce(last_received_at, created_at) < ? END)")
        parameters += [which.silent_since.timestamp(), format_time(which.silent_since)]
    if which.with_errors:
        conditions.append(IN_ERROR_SQL)
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), tuple(parameters)


def _chunks(conn: sqlite3.Connection, select: str, which: RemoteFilter, chunk: int) -> Iterator[list[tuple]]:
    """The rows ``which`` selects with ``select``, by name, fetched ``chunk``
    at a time (inside the caller's read transaction: one snapshot)."""
    where, parameters = filter_where(which, log_end(conn))
    cursor = conn.execute(select + where + " ORDER BY name", parameters)
    return iter(lambda: cursor.fetchmany(chunk), [])


def iter_remotes_locked(conn: sqlite3.Connection, which: RemoteFilter, *, chunk: int = 1000
                        ) -> Iterator[RemoteUser]:
    """The rows ``which`` selects, by name, fetched ``chunk`` at a time."""
    for rows in _chunks(conn, _SELECT, which, chunk):
        yield from map(_row, rows)


def iter_remote_values_locked(conn: sqlite3.Connection, which: RemoteFilter, *, chunk: int = 1000
                              ) -> Iterator[tuple]:
    """:func:`iter_remotes_locked`'s rows as plain values (remote_rules.plain_values),
    straight from the database: no RemoteUser made, no time parsed."""
    for rows in _chunks(conn, _PLAIN_SELECT, which, chunk):
        yield from rows


def add_remote_locked(conn: sqlite3.Connection, identity: SiteIdentity, name: str, *, address: str | None = None,
                      transport: str | None = None, public_key: str | None = None, send_every: int | None = None,
                      send_at: time | str | None = None, start: int | None = None,
                      peer_incarnation: bytes | None = None, now: datetime | None = None) -> RemoteUser:
    every, at = check_new_remote(identity, name, address=address, transport=transport, public_key=public_key,
                                 send_every=send_every, send_at=send_at, peer_incarnation=peer_incarnation)
    if conn.execute("SELECT 1 FROM fieldsync_remote WHERE name = ?", (name,)).fetchone():
        raise remote_exists(name)
    if identity.role is Role.REMOTE:
        other = conn.execute("SELECT name FROM fieldsync_remote").fetchone()
        if other:
            raise one_consolidated(identity, other[0])
    end = log_end(conn)
    start = check_start(end if start is None else start, end)
    conn.execute(
        "INSERT INTO fieldsync_remote (name, log_send, log_sent, confirm_sent, transport, address, public_key,"
        " send_every, send_at, peer_incarnation, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (name, start, start, start, transport, address, public_key, every, None if at is None else at.isoformat(),
         peer_incarnation, format_time(now or utc_now())))
    return get_remote(conn, name)


def replaced_incarnations(conn: sqlite3.Connection, name: str) -> frozenset[bytes]:
    """The incarnations of ``name``'s copies that extraction replaced."""
    return frozenset(row[0] for row in conn.execute(
        "SELECT incarnation FROM fieldsync_replaced_copy WHERE remote = ?", (name,)))


def all_replaced_incarnations(conn: sqlite3.Connection) -> dict[str, frozenset[bytes]]:
    """:func:`replaced_incarnations` of every remote that has any, in one query."""
    found: dict[str, set[bytes]] = {}
    for remote, incarnation in conn.execute("SELECT remote, incarnation FROM fieldsync_replaced_copy"):
        found.setdefault(remote, set()).add(incarnation)
    return {remote: frozenset(values) for remote, values in found.items()}


def count_rows(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows of the remote-user, conflict and apply-error tables, counted."""
    return {table: conn.execute(f"SELECT count(*) FROM fieldsync_{name}").fetchone()[0]
            for table, name in (("remotes", "remote"), ("conflicts", "conflict"), ("apply_errors", "apply_error"))}


def record_replaced_locked(conn: sqlite3.Connection, name: str, incarnation: bytes | None,
                           now: datetime | None = None) -> None:
    """Remember that the copy of ``name`` with ``incarnation`` was replaced."""
    if incarnation is not None:
        conn.execute("INSERT OR IGNORE INTO fieldsync_replaced_copy (remote, incarnation, replaced_at)"
                     " VALUES (?, ?, ?)", (name, incarnation, format_time(now or utc_now())))


def remove_remote_locked(conn: sqlite3.Connection, name: str) -> None:
    if conn.execute("DELETE FROM fieldsync_remote WHERE name = ?", (name,)).rowcount == 0:
        raise UnknownRemote(f"no remote named {name!r}")
    conn.execute("DELETE FROM fieldsync_subscription WHERE remote = ?", (name,))
    conn.execute("DELETE FROM fieldsync_transport_option WHERE scope = ?", (name,))


def update_remote_locked(conn: sqlite3.Connection, name: str, changes: dict[str, Any]) -> RemoteUser:
    check_updatable(changes)
    current = get_remote(conn, name)
    stored = _stored(checked_update(current, changes, lambda: log_end(conn)))
    if not stored:
        return current
    assignments = ", ".join(f"{column} = ?" for column in stored) + leaving(stored)
    conn.execute(f"UPDATE fieldsync_remote SET {assignments} WHERE name = ?", (*stored.values(), name))
    return get_remote(conn, name)


def update_remotes_locked(conn: sqlite3.Connection, changes: dict[str, dict[str, Any]]) -> None:
    """:func:`update_remote_locked` for many rows: rows changing only where
    the log was read (remote_rules.read_moves) are written with one
    statement per new value, unread; the others are read in one
    query (those rows alone) and the log end once; rows changing only the pair columns are
    checked by remote_rules.check_pair_update and written with one
    statement per set of columns; any other change goes through
    update_remote_locked."""
    end = log_end(conn)

    def write(move: tuple[tuple[str, int], ...], names: list[str]) -> int:
        assignments = ", ".join(f"{column} = ?" for column, _ in move) + leaving([column for column, _ in move])
        return conn.execute(f"UPDATE fieldsync_remote SET {assignments} WHERE name IN (SELECT value FROM json_each(?))",
                            (*(value for _, value in move), json.dumps(names))).rowcount

    changes = read_moves(changes, end, write)
    if not changes:
        return
    current = {name: dict(zip(PAIR_CHECKED, values)) for name, *values in conn.execute(
        f"SELECT name, {', '.join(map(selected, PAIR_CHECKED))} FROM fieldsync_remote"
        " WHERE name IN (SELECT value FROM json_each(?))",
        (json.dumps(list(changes)),))}
    plain: dict[tuple[str, ...], list[tuple]] = {}
    for name, columns in changes.items():
        row = current.get(name)
        if row is None or not is_pair_update(columns):
            update_remote_locked(conn, name, columns)
            continue
        check_pair_update(name, row, columns, end)
        key = tuple(sorted(columns))
        plain.setdefault(key, []).append((*(columns[column] for column in key), name))
    for key, rows in plain.items():
        assignments = ", ".join(f"{column} = ?" for column in key) + leaving(key)
        conn.executemany(f"UPDATE fieldsync_remote SET {assignments} WHERE name = ?", rows)


def record_send_locked(conn: sqlite3.Connection, name: str, log_sent: int, messages: int,
                       now: datetime | None) -> RemoteUser:
    current = get_remote(conn, name)
    check_count(messages)
    return update_remote_locked(conn, name, {"log_sent": log_sent, "send_count": current.send_count + messages,
                                             "last_sent_at": now or utc_now()})


def record_delivered_locked(conn: sqlite3.Connection, name: str, messages: int, now: datetime | None) -> None:
    """Count ``messages`` the transport accepted for ``name`` (SMTP 250, a
    rename done): the transport error in force, if any, is over (the row is
    written anyway, so clearing it costs nothing)."""
    check_count(messages)
    conn.execute("UPDATE fieldsync_remote SET send_count = send_count + ?, last_sent_at = ?, last_error = NULL,"
                 " last_error_at = NULL WHERE name = ?", (messages, format_time(now or utc_now()), name))


def record_error_locked(conn: sqlite3.Connection, name: str, message: str | None,
                        now: datetime | None) -> RemoteUser:
    """A transport error with ``name``: in force until a send to or a
    receive from the peer succeeds, and counted in the history (None: clear
    the one in force, the history stays)."""
    check_text("last_error", message)
    get_remote(conn, name)  # an unknown name is refused
    if message is None:
        conn.execute("UPDATE fieldsync_remote SET last_error = NULL, last_error_at = NULL WHERE name = ?", (name,))
    else:
        stamp = format_time(now or utc_now())
        conn.execute("UPDATE fieldsync_remote SET last_error = ?, last_error_at = ?, error_count = error_count + 1,"
                     " error_seen_at = ? WHERE name = ?", (message, stamp, stamp, name))
    return get_remote(conn, name)


def record_stream_stopped_locked(conn: sqlite3.Connection, name: str, message: str,
                                 now: datetime | None) -> RemoteUser:
    """The stream with ``name`` stopped (the peer's incarnation changed):
    in force until a message of the peer arrives while its stream runs
    again (:func:`record_heard_locked`); a send does not end it."""
    if type(message) is not str or not message:
        raise InvalidSetting(f"a stopped stream is recorded with its message, got {message!r}")
    get_remote(conn, name)
    stamp = format_time(now or utc_now())
    conn.execute("UPDATE fieldsync_remote SET stream_stopped = ?, stream_stopped_at = ?,"
                 " error_count = error_count + 1, error_seen_at = ? WHERE name = ?", (message, stamp, stamp, name))
    return get_remote(conn, name)


def record_heard_locked(conn: sqlite3.Connection, names: Iterable[str]) -> None:
    """A message of each peer of ``names`` arrived while its stream runs:
    the transport error and the stopped stream in force are over.  Only a
    row holding one is written (an idle peer's costs an index lookup)."""
    conn.executemany("UPDATE fieldsync_remote SET last_error = NULL, last_error_at = NULL, stream_stopped = NULL,"
                     " stream_stopped_at = NULL WHERE name = ? AND (last_error IS NOT NULL OR stream_stopped IS NOT"
                     " NULL)", ((name,) for name in names))


def acknowledge_apply_errors_locked(conn: sqlite3.Connection, peer: str, now: datetime | None,
                                    through: int | None = None) -> int:
    """Stamp the apply errors of ``peer``'s messages not yet acknowledged
    (those with an id up to ``through``, when given) as acknowledged; they
    stay in fieldsync_apply_error as history.  Returns how many."""
    if through is not None and (type(through) is not int or through < 0):
        raise InvalidSetting(f"through is an apply error id, got {through!r}")
    return conn.execute("UPDATE fieldsync_apply_error SET acknowledged_at = ? WHERE peer = ? AND acknowledged_at"
                        " IS NULL AND id <= ?", (format_time(now or utc_now()), peer,
                                                 (1 << 63) - 1 if through is None else through)).rowcount


def open_apply_errors(conn: sqlite3.Connection) -> dict[str, int]:
    """The apply errors not yet acknowledged, counted by peer."""
    return dict(conn.execute("SELECT peer, count(*) FROM fieldsync_apply_error WHERE acknowledged_at IS NULL"
                             " GROUP BY peer").fetchall())


# --- adding a fleet at once -----------------------------------------------------------

def add_remotes_locked(conn: sqlite3.Connection, identity: SiteIdentity, remotes: Sequence[NewRemote], *,
                       now: datetime | None = None, progress: Callable[[int], None] | None = None) -> int:
    """Add every remote of ``remotes`` with its subscriptions, each starting
    at the log end, inside the caller's write transaction; return how many
    subscriptions were stored.  The whole list is checked against the
    database first (remote_rules.check_new_remotes: names taken or
    repeated, unknown publications, the role), so a refusal
    (:class:`RemoteRejected`, naming the remote's index) comes before any
    row is written; the caller's rollback undoes the rest.  ``progress(n)``
    is called after each chunk of ``n`` rows."""
    consolidated = None
    if identity.role is Role.REMOTE and remotes:
        other = conn.execute("SELECT name FROM fieldsync_remote").fetchone()
        consolidated = other[0] if other else None
    taken = {name for (name,) in conn.execute("SELECT name FROM fieldsync_remote")}
    publications = {name for (name,) in conn.execute("SELECT name FROM fieldsync_publication")}
    check_new_remotes(identity, remotes, taken=taken, publications=publications, consolidated=consolidated)
    start = log_end(conn)
    stamp = format_time(now or utc_now())
    subscribed = 0
    for first in range(0, len(remotes), BULK_CHUNK):
        chunk = remotes[first:first + BULK_CHUNK]
        conn.executemany(
            "INSERT INTO fieldsync_remote (name, log_send, log_sent, confirm_sent, transport, address, public_key,"
            " send_every, send_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(remote.name, start, start, start, remote.transport, remote.address, remote.public_key,
              remote.send_every, None if remote.send_at is None else remote.send_at.isoformat(), stamp)
             for remote in chunk])
        rows = [(remote.name, publication, value, stamp)
                for remote in chunk for publication, value in distinct_subscriptions(remote.subscriptions)]
        conn.executemany("INSERT INTO fieldsync_subscription (remote, publication, value, created_at)"
                         " VALUES (?, ?, ?, ?)", rows)
        subscribed += len(rows)
        if progress is not None:
            progress(len(chunk))
    return subscribed
