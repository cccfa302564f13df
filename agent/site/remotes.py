"""The remote-user table (SQL Remote's SYSREMOTEUSER), one row per peer.

Rules of this file:
* At the consolidated there is one row per remote; at a remote exactly one,
  for its consolidated.
* Every change runs in its own short write transaction, except
  ``log_received``, which :mod:`agent.site.apply` moves together with the
  applied data, and a bulk add (:func:`add_remotes_locked`), which adds
  every row and subscription of a fleet in one transaction or none.
* Updates keep the protocol's invariants: ``confirm_sent <= log_sent <= log
  end``, and ``confirm_sent``, ``resend_count``, ``log_received``,
  ``confirm_received`` and ``rereceive_count`` never go backwards.  Breaking
  one raises :class:`InvariantViolation`; it would be a protocol bug.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, fields
from datetime import datetime, time
from typing import Any, Callable, Iterable, Iterator, Sequence

from ._db import format_time, parse_time, utc_now
from .errors import (InvalidSetting, InvariantViolation, RemoteExists, SiteError, UnknownPublication, UnknownRemote,
                     WrongRole)
from .log import HORIZON_SQL, horizon, log_end
from .schema import Role, SiteIdentity, check_name
from .values import same_value, value_problem


@dataclass(frozen=True, slots=True)
class RemoteUser:
    """One row of the remote-user table.  Offsets are in the local log unless
    named ``*_received`` (those are in the peer's log)."""

    name: str
    log_send: int
    log_sent: int
    confirm_sent: int
    resend_count: int
    log_received: int
    confirm_received: int
    rereceive_count: int
    send_count: int
    last_sent_at: datetime | None
    receive_count: int
    last_received_at: datetime | None
    transport: str | None
    address: str | None
    public_key: str | None
    send_every: int | None       # seconds (SEND EVERY)
    send_at: time | None         # time of day (SEND AT)
    peer_incarnation: bytes | None
    last_error: str | None
    last_error_at: datetime | None
    created_at: datetime
    log_read: int                # the log was read for the peer up to here (docs/protocol.md, rule 5)
    heartbeat: int | None        # seconds between control messages at the least; None: the run's --heartbeat
    control_sent_at: float | None  # when the agent last queued a control message to the peer (its clock)
    inbox: str | None = None     # the peer's own inbox, where `address` differs (email); copied at extraction
    heard_at: float | None = None  # when a message of the peer (data or control) last arrived (the agent's clock)
    # docs/protocol.md, rule 3: never silent while something is outstanding.
    confirm_timeout: int | None = None  # seconds before an unconfirmed stream is probed; None: the run's
    data_sent_at: float | None = None  # when a data message last went to the peer (the agent's clock)
    peer_confirmed: int = 0      # the peer is known to hold a confirmation of log_received up to here
    probes: int = 0              # probes sent since the stream to the peer last changed (the backoff)
    confirm_owed: bool = False   # a confirmation is owed to the peer at the next send phase
    # Errors (docs/cli.md, "agent status"): last_error is the transport error
    # in force, ended by a message the transport accepted for the peer or one
    # of the peer's arriving; stream_stopped is the stopped stream in force,
    # ended only by a message of the peer arriving while its stream runs.
    # error_count and error_seen_at are their history, never cleared.
    error_count: int = 0         # transport errors and stream stops recorded, ever
    error_seen_at: datetime | None = None  # when the last of them was recorded
    stream_stopped: str | None = None
    stream_stopped_at: datetime | None = None

    @property
    def sending_due(self) -> bool:
        return self.log_send > self.read_through

    @property
    def read_through(self) -> int:
        """How far the log was read for the peer: ``log_sent``, or beyond it
        over a range that held nothing for the peer."""
        return max(self.log_read, self.log_sent)

    @property
    def horizon(self) -> int:
        """The log this peer may still need starts after here (rule 8): all
        of it read for the peer once the peer confirmed all that was sent."""
        return horizon(self.log_read, self.log_sent, self.confirm_sent)


_COLUMNS = tuple(field.name for field in fields(RemoteUser))
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM fieldsync_remote"
_TIME_FIELDS = {"last_sent_at", "last_received_at", "last_error_at", "created_at", "error_seen_at",
                "stream_stopped_at"}
_OFFSET_FIELDS = ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
                  "rereceive_count", "send_count", "receive_count", "log_read", "peer_confirmed", "probes")
_MONOTONE = ("confirm_sent", "resend_count", "log_received", "confirm_received", "rereceive_count",
             "send_count", "receive_count", "error_count")
UPDATABLE = frozenset(_COLUMNS) - {"name", "created_at"}


def _row(values: tuple) -> RemoteUser:
    record = dict(zip(_COLUMNS, values))
    for name in _TIME_FIELDS:
        record[name] = parse_time(record[name])
    if record["send_at"] is not None:
        record["send_at"] = time.fromisoformat(record["send_at"])
    record["confirm_owed"] = bool(record["confirm_owed"])
    return RemoteUser(**record)


def _check_schedule(send_every: object, send_at: object) -> tuple[int | None, str | None]:
    if send_every is not None and send_at is not None:
        raise InvalidSetting("a remote is sent to either EVERY interval or AT a time of day, not both")
    if send_every is not None and (type(send_every) is not int or send_every <= 0):
        raise InvalidSetting(f"send_every must be a positive number of seconds, got {send_every!r}")
    if send_at is None:
        return send_every, None  # type: ignore[return-value]
    if isinstance(send_at, str):
        try:
            send_at = time.fromisoformat(send_at)
        except ValueError:
            raise InvalidSetting(f"send_at must be a time of day such as '18:30', got {send_at!r}") from None
    if not isinstance(send_at, time) or send_at.tzinfo is not None:
        raise InvalidSetting(f"send_at must be a local time of day such as '18:30', got {send_at!r}")
    return None, send_at.isoformat()


# Moments on the agent's clock (seconds), kept as numbers.
_CLOCK_FIELDS = frozenset({"control_sent_at", "heard_at", "data_sent_at"})


def _check_clock(what: str, value: object) -> None:
    if value is not None and (type(value) not in (int, float) or value != value):
        raise InvalidSetting(f"{what} must be a number of seconds, got {value!r}")


def _check_text(what: str, value: object) -> None:
    if value is not None and type(value) is not str:
        raise InvalidSetting(f"{what} must be text, got {type(value).__name__}")


def _check_timeouts(name: str, heartbeat: int | None, confirm_timeout: int | None, changes: dict) -> None:
    """A remote's confirm timeout is never above its heartbeat (rule 3: the
    probe comes before the heartbeat would)."""
    if ("heartbeat" in changes or "confirm_timeout" in changes) and heartbeat is not None \
            and confirm_timeout is not None and confirm_timeout > heartbeat:
        raise InvalidSetting(f"the confirm timeout of {name!r} ({confirm_timeout} s) would be above its heartbeat "
                             f"({heartbeat} s); lower the confirm timeout or raise the heartbeat")


def _check_incarnation(value: object) -> None:
    if value is not None and (type(value) is not bytes or len(value) != 16):
        raise InvalidSetting("a peer incarnation id is 16 bytes")


def get_remote(conn: sqlite3.Connection, name: str) -> RemoteUser:
    row = conn.execute(_SELECT + " WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise UnknownRemote(f"no remote named {name!r}; add it with add_remote")
    return _row(row)


def list_remotes(conn: sqlite3.Connection) -> tuple[RemoteUser, ...]:
    return tuple(_row(row) for row in conn.execute(_SELECT + " ORDER BY name"))


#: A remote-user row's peer is in error now: a transport error or a stopped
#: stream in force, or apply errors not yet acknowledged (one lookup in the
#: partial index fieldsync_apply_error_open).
IN_ERROR_SQL = ("(last_error IS NOT NULL OR stream_stopped IS NOT NULL OR EXISTS (SELECT 1 FROM fieldsync_apply_error"
                " WHERE peer = fieldsync_remote.name AND acknowledged_at IS NULL))")


@dataclass(frozen=True, slots=True)
class RemoteFilter:
    """Which rows of the remote-user table to read (``agent status``'s
    filters); every condition given must hold.

    * ``lagging``: the peer has not confirmed everything up to the log end
      (``confirm_sent`` below it): something logged here is not yet known
      to be applied there.
    * ``silent_since``: nothing heard from the peer since then: no message
      of it, data or control, arrived (``heard_at`` earlier; a row not yet
      heard from since layout 7 by ``last_received_at``, and a peer never
      heard from by the time its row was made).
    * ``with_errors``: the peer is in error now (:data:`IN_ERROR_SQL`): a
      transport error in force (``last_error``), a stopped stream
      (``stream_stopped``), or an apply error of a message from it not yet
      acknowledged.  Errors that are over are history (``error_count``,
      ``error_seen_at``, acknowledged apply errors) and do not count.
    """

    lagging: bool = False
    silent_since: datetime | None = None
    with_errors: bool = False

    def __post_init__(self) -> None:
        if self.silent_since is not None and (not isinstance(self.silent_since, datetime)
                                              or self.silent_since.tzinfo is None):
            raise InvalidSetting("silent_since is an aware datetime")

    def where(self, end: int) -> tuple[str, tuple]:
        """The SQL condition and its parameters, for a log end ``end``."""
        conditions: list[str] = []
        parameters: list[object] = []
        if self.lagging:
            # The peer's horizon (RemoteUser.horizon) is behind the log end.
            conditions.append(f"{HORIZON_SQL} < ?")
            parameters.append(end)
        if self.silent_since is not None:
            # Stored times are ISO 8601 in UTC, all written by format_time: as text they sort as times.
            conditions.append("(CASE WHEN heard_at IS NOT NULL THEN heard_at < ?"
                              " ELSE coalesce(last_received_at, created_at) < ? END)")
            parameters += [self.silent_since.timestamp(), format_time(self.silent_since)]
        if self.with_errors:
            conditions.append(IN_ERROR_SQL)
        return (" WHERE " + " AND ".join(conditions) if conditions else ""), tuple(parameters)


def iter_remotes_locked(conn: sqlite3.Connection, which: RemoteFilter, *, chunk: int = 1000
                        ) -> Iterator[RemoteUser]:
    """The rows ``which`` selects, by name, fetched ``chunk`` at a time
    (inside the caller's read transaction: one snapshot)."""
    where, parameters = which.where(log_end(conn))
    cursor = conn.execute(_SELECT + where + " ORDER BY name", parameters)
    while True:
        rows = cursor.fetchmany(chunk)
        if not rows:
            return
        for row in rows:
            yield _row(row)


def add_remote_locked(conn: sqlite3.Connection, identity: SiteIdentity, name: str, *, address: str | None = None,
                      transport: str | None = None, public_key: str | None = None, send_every: int | None = None,
                      send_at: time | str | None = None, start: int | None = None,
                      peer_incarnation: bytes | None = None, now: datetime | None = None) -> RemoteUser:
    check_name(name, "remote name")
    if name == identity.name:
        raise InvalidSetting(f"a site cannot be its own remote ({name!r})")
    for what, value in (("address", address), ("transport", transport), ("public key", public_key)):
        _check_text(what, value)
    _check_incarnation(peer_incarnation)
    every, at = _check_schedule(send_every, send_at)
    if conn.execute("SELECT 1 FROM fieldsync_remote WHERE name = ?", (name,)).fetchone():
        raise RemoteExists(f"remote {name!r} exists already; update it instead")
    if identity.role is Role.REMOTE:
        other = conn.execute("SELECT name FROM fieldsync_remote").fetchone()
        if other:
            raise WrongRole(f"remote site {identity.name!r} already has its consolidated {other[0]!r}; "
                            "a remote exchanges messages with one consolidated only")
    end = log_end(conn)
    if start is None:
        start = end
    if type(start) is not int or not 0 <= start <= end:
        raise InvariantViolation(f"a new remote starts at a log offset in 0..{end}, got {start!r}")
    conn.execute(
        "INSERT INTO fieldsync_remote (name, log_send, log_sent, confirm_sent, transport, address, public_key,"
        " send_every, send_at, peer_incarnation, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (name, start, start, start, transport, address, public_key, every, at, peer_incarnation,
         format_time(now or utc_now())))
    return get_remote(conn, name)


def replaced_incarnations(conn: sqlite3.Connection, name: str) -> frozenset[bytes]:
    """The incarnations of ``name``'s copies that extraction replaced."""
    return frozenset(row[0] for row in conn.execute(
        "SELECT incarnation FROM fieldsync_replaced_copy WHERE remote = ?", (name,)))


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
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise InvalidSetting(f"remote-user columns {sorted(unknown)} cannot be updated; "
                             f"updatable: {sorted(UPDATABLE)}")
    current = get_remote(conn, name)
    for field_name in _OFFSET_FIELDS:
        if field_name in changes:
            value = changes[field_name]
            if type(value) is not int or value < 0:
                raise InvalidSetting(f"{field_name} must be a non-negative integer, got {value!r}")
            if field_name in _MONOTONE and value < getattr(current, field_name):
                raise InvariantViolation(f"{field_name} of {name!r} cannot go back from "
                                         f"{getattr(current, field_name)} to {value}")
    for what in ("transport", "address", "public_key", "last_error", "inbox", "stream_stopped"):
        if what in changes:
            _check_text(what, changes[what])
    if "peer_incarnation" in changes:
        _check_incarnation(changes["peer_incarnation"])
    stored = dict(changes)
    if "send_every" in changes or "send_at" in changes:
        every, at = _check_schedule(changes.get("send_every", current.send_every),
                                    changes.get("send_at", current.send_at))
        stored["send_every"], stored["send_at"] = every, at
    for field_name in _TIME_FIELDS & set(changes):
        stored[field_name] = format_time(changes[field_name])
    log_sent = stored.get("log_sent", current.log_sent)
    confirm_sent = stored.get("confirm_sent", current.confirm_sent)
    if confirm_sent > log_sent:
        raise InvariantViolation(f"confirm_sent ({confirm_sent}) of {name!r} would exceed log_sent ({log_sent})")
    if "log_sent" in stored or "log_send" in stored or "log_read" in stored:
        end = log_end(conn)
        if log_sent > end:
            raise InvariantViolation(f"log_sent ({log_sent}) of {name!r} would lie beyond the log end ({end})")
        if stored.get("log_read", 0) > end:
            raise InvariantViolation(f"log_read ({stored['log_read']}) of {name!r} would lie beyond the log end "
                                     f"({end})")
    for field_name in _CLOCK_FIELDS & set(changes):
        _check_clock(field_name, changes[field_name])
    if "heartbeat" in changes and changes["heartbeat"] is not None and (
            type(changes["heartbeat"]) is not int or changes["heartbeat"] < 1):
        raise InvalidSetting(f"heartbeat must be a whole number of seconds >= 1, got {changes['heartbeat']!r}")
    if "confirm_timeout" in changes and changes["confirm_timeout"] is not None and (
            type(changes["confirm_timeout"]) is not int or changes["confirm_timeout"] < 1):
        raise InvalidSetting("confirm_timeout must be a whole number of seconds >= 1, "
                             f"got {changes['confirm_timeout']!r}")
    _check_timeouts(name, stored.get("heartbeat", current.heartbeat),
                    stored.get("confirm_timeout", current.confirm_timeout), changes)
    if "confirm_owed" in changes:
        if type(changes["confirm_owed"]) is not bool:
            raise InvalidSetting(f"confirm_owed must be a bool, got {changes['confirm_owed']!r}")
        stored["confirm_owed"] = int(changes["confirm_owed"])
    if not stored:
        return current
    assignments = ", ".join(f"{column} = ?" for column in stored)
    conn.execute(f"UPDATE fieldsync_remote SET {assignments} WHERE name = ?", (*stored.values(), name))
    return get_remote(conn, name)


# The columns the agent saves for every pair a phase changed (agent.pairs):
# updated in bulk, checked in one pass (update_remotes_locked).
_PAIR_COLUMNS = frozenset({"log_send", "log_read", "control_sent_at", "heard_at", "confirm_sent", "resend_count",
                           "confirm_received", "rereceive_count", "peer_incarnation", "log_sent", "data_sent_at",
                           "peer_confirmed", "probes", "confirm_owed"})


def update_remotes_locked(conn: sqlite3.Connection, changes: dict[str, dict[str, Any]]) -> None:
    """:func:`update_remote_locked` for many rows: the rows are read in one
    query and the log end once; rows changing only the pair columns are
    checked here (the same invariants) and written with one statement per
    set of columns; any other change goes through update_remote_locked."""
    # Only the columns the checks read, as plain tuples (at ten thousand
    # rows, making each a RemoteUser cost more than the updates).
    checked = ("log_sent", "confirm_sent", *_MONOTONE)
    current = {name: dict(zip(checked, values)) for name, *values in conn.execute(
        f"SELECT name, {', '.join(checked)} FROM fieldsync_remote")}
    end = log_end(conn)
    plain: dict[tuple[str, ...], list[tuple]] = {}
    for name, columns in changes.items():
        row = current.get(name)
        if row is None or not set(columns) <= _PAIR_COLUMNS or "peer_incarnation" in columns:
            update_remote_locked(conn, name, columns)
            continue
        for column, value in columns.items():
            if column in _CLOCK_FIELDS:
                _check_clock(column, value)
                continue
            if column == "confirm_owed":
                if type(value) is not bool:
                    raise InvalidSetting(f"confirm_owed must be a bool, got {value!r}")
                continue
            if type(value) is not int or value < 0:
                raise InvalidSetting(f"{column} must be a non-negative integer, got {value!r}")
            if column in _MONOTONE and value < row[column]:
                raise InvariantViolation(f"{column} of {name!r} cannot go back from {row[column]} to {value}")
        log_sent = columns.get("log_sent", row["log_sent"])
        if columns.get("confirm_sent", row["confirm_sent"]) > log_sent:
            raise InvariantViolation(f"confirm_sent of {name!r} would exceed log_sent ({log_sent})")
        if log_sent > end or columns.get("log_read", 0) > end:
            raise InvariantViolation(f"log_sent or log_read of {name!r} would lie beyond the log end ({end})")
        key = tuple(sorted(columns))
        plain.setdefault(key, []).append((*(columns[column] for column in key), name))
    for key, rows in plain.items():
        assignments = ", ".join(f"{column} = ?" for column in key)
        conn.executemany(f"UPDATE fieldsync_remote SET {assignments} WHERE name = ?", rows)


def record_send_locked(conn: sqlite3.Connection, name: str, log_sent: int, messages: int,
                       now: datetime | None) -> RemoteUser:
    current = get_remote(conn, name)
    if type(messages) is not int or messages < 0:
        raise InvalidSetting(f"message count must be a non-negative integer, got {messages!r}")
    return update_remote_locked(conn, name, {"log_sent": log_sent, "send_count": current.send_count + messages,
                                             "last_sent_at": now or utc_now()})


def record_delivered_locked(conn: sqlite3.Connection, name: str, messages: int, now: datetime | None) -> None:
    """Count ``messages`` the transport accepted for ``name`` (SMTP 250, a
    rename done): the transport error in force, if any, is over (the row is
    written anyway, so clearing it costs nothing)."""
    if type(messages) is not int or messages < 0:
        raise InvalidSetting(f"message count must be a non-negative integer, got {messages!r}")
    conn.execute("UPDATE fieldsync_remote SET send_count = send_count + ?, last_sent_at = ?, last_error = NULL,"
                 " last_error_at = NULL WHERE name = ?", (messages, format_time(now or utc_now()), name))


def record_error_locked(conn: sqlite3.Connection, name: str, message: str | None,
                        now: datetime | None) -> RemoteUser:
    """A transport error with ``name``: in force until a send to or a
    receive from the peer succeeds, and counted in the history (None: clear
    the one in force, the history stays)."""
    _check_text("last_error", message)
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

#: Rows inserted per statement batch of a bulk add (and per progress report).
BULK_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class NewRemote:
    """One remote of a bulk add: its row and its subscriptions
    ``(publication, value)``, checked when made (what can be checked
    without the database: the name, texts, schedule, values)."""

    name: str
    address: str | None = None
    transport: str | None = None
    public_key: str | None = None
    send_every: int | None = None
    send_at: time | str | None = None
    subscriptions: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        check_name(self.name, "remote name")
        for what, value in (("address", self.address), ("transport", self.transport),
                            ("public key", self.public_key)):
            _check_text(what, value)
        every, at = _check_schedule(self.send_every, self.send_at)
        object.__setattr__(self, "send_at", None if at is None else time.fromisoformat(at))
        subscriptions = tuple(self.subscriptions)
        for item in subscriptions:
            if type(item) is not tuple or len(item) != 2 or type(item[0]) is not str:
                raise InvalidSetting(f"a subscription is (publication, value), got {item!r}")
            problem = value_problem(item[1])
            if problem is not None:
                raise InvalidSetting(f"subscription value: {problem}")
            if isinstance(item[1], float) and math.isnan(item[1]):
                raise InvalidSetting("subscription value cannot be NaN (SQLite stores NaN as NULL, which matches "
                                     "nothing)")
        object.__setattr__(self, "subscriptions", subscriptions)


class RemoteRejected(SiteError):
    """A bulk add refused the remote at ``index`` of its list (``reason``,
    the error adding it alone would raise); nothing was added."""

    def __init__(self, index: int, reason: SiteError) -> None:
        super().__init__(str(reason))
        self.index = index
        self.reason = reason


def add_remotes_locked(conn: sqlite3.Connection, identity: SiteIdentity, remotes: Sequence[NewRemote], *,
                       now: datetime | None = None, progress: Callable[[int], None] | None = None) -> int:
    """Add every remote of ``remotes`` with its subscriptions, each starting
    at the log end, inside the caller's write transaction; return how many
    subscriptions were stored.  The whole list is checked against the
    database first (names taken or repeated, unknown publications, the
    role), so a refusal (:class:`RemoteRejected`, naming the remote's
    index) comes before any row is written; the caller's rollback undoes
    the rest.  ``progress(n)`` is called after each chunk of ``n`` rows."""
    if identity.role is Role.REMOTE and remotes:
        other = conn.execute("SELECT name FROM fieldsync_remote").fetchone()
        if other or len(remotes) > 1:
            index = 0 if other else 1
            raise RemoteRejected(index, WrongRole(
                f"remote site {identity.name!r} already has its consolidated {(other or [remotes[0].name])[0]!r}; "
                "a remote exchanges messages with one consolidated only"))
    taken = {name for (name,) in conn.execute("SELECT name FROM fieldsync_remote")}
    publications = {name for (name,) in conn.execute("SELECT name FROM fieldsync_publication")}
    seen: dict[str, int] = {}
    for index, remote in enumerate(remotes):
        if type(remote) is not NewRemote:
            raise InvalidSetting(f"a bulk add takes NewRemote values, got {type(remote).__name__}")
        if remote.name == identity.name:
            raise RemoteRejected(index, InvalidSetting(f"a site cannot be its own remote ({remote.name!r})"))
        if remote.name in taken:
            raise RemoteRejected(index, RemoteExists(f"remote {remote.name!r} exists already; update it instead"))
        if remote.name in seen:
            raise RemoteRejected(index, InvalidSetting(
                f"remote {remote.name!r} is given twice (first as number {seen[remote.name] + 1})"))
        seen[remote.name] = index
        for publication, _value in remote.subscriptions:
            if publication not in publications:
                raise RemoteRejected(index, UnknownPublication(f"no publication named {publication!r}"))
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
                for remote in chunk for publication, value in _distinct(remote.subscriptions)]
        conn.executemany("INSERT INTO fieldsync_subscription (remote, publication, value, created_at)"
                         " VALUES (?, ?, ?, ?)", rows)
        subscribed += len(rows)
        if progress is not None:
            progress(len(chunk))
    return subscribed


def _distinct(subscriptions: tuple[tuple[str, object], ...]) -> list[tuple[str, object]]:
    """Subscriptions without repeats (subscribing twice is harmless, as in
    agent.site.values.same_value: the same publication and a value of the same type)."""
    kept: list[tuple[str, object]] = []
    for publication, value in subscriptions:
        if not any(other == publication and same_value(held, value) for other, held in kept):
            kept.append((publication, value))
    return kept
