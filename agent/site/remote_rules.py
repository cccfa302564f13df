"""The remote-user table's rows as values, and the rules every change to
them keeps, whatever database holds them (SQL Remote's SYSREMOTEUSER).

Rules of this file:
* At the consolidated there is one row per remote; at a remote exactly one,
  for its consolidated.
* Changes keep the protocol's invariants: ``confirm_sent <= log_sent <= log
  end``, and ``confirm_sent``, ``resend_count``, ``log_received``,
  ``confirm_received`` and ``rereceive_count`` never go backwards.  Breaking
  one raises :class:`InvariantViolation`; it would be a protocol bug.
* Pure: no database.  agent.site.sqlite.remotes keeps the rows in a SQLite site,
  agent.site.postgres.remotes in a PostgreSQL one; both check with these
  functions, so both refuse the same changes with the same lines.  Values
  here are Python's (an aware datetime, a time of day, a bool); each
  backend stores them its own way.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from datetime import datetime, time, timezone
from operator import attrgetter
from typing import Any, Callable, Mapping, Sequence

from .clock import in_utc
from .errors import InvalidSetting, InvariantViolation, RemoteExists, RemoteRejected, UnknownPublication, WrongRole
from .identity import Role, SiteIdentity, check_name
from .publication_rules import check_subscription_value


#: A remote-user row's horizon (docs/protocol.md, rule 8; RemoteUser.horizon):
#: all the log read for the peer once it confirmed all it was sent, else
#: what it confirmed.  The log after the smallest one is what peers may need.
def horizon(log_read: int, log_sent: int, confirm_sent: int) -> int:
    """Rule 8 (docs/protocol.md): the log a peer may still need starts after
    here: all of it read for the peer (``max(log_read, log_sent)``) once the
    peer confirmed all that was sent, else ``confirm_sent``.  A SQLite
    site's HORIZON_SQL (agent.site.sqlite.log) is the same rule over
    fieldsync_remote's columns (a test holds them equal)."""
    return max(log_read, log_sent) if confirm_sent >= log_sent else confirm_sent


def sending_due(log_send: int, log_read: int, log_sent: int) -> bool:
    """The schedule raised ``log_send`` past how far the log was read for
    the peer (``max(log_read, log_sent)``): the next send phase reads it."""
    return log_send > max(log_read, log_sent)


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
    # The largest schema version the peer (a remote) reported in its control
    # messages (docs/protocol.md, "Schema versions"); None: none reported.
    peer_schema_version: int | None = None

    @property
    def sending_due(self) -> bool:
        return sending_due(self.log_send, self.log_read, self.log_sent)

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


#: The row's columns, in the order of RemoteUser's fields.
COLUMNS = tuple(field.name for field in fields(RemoteUser))
TIME_FIELDS = frozenset({"last_sent_at", "last_received_at", "last_error_at", "created_at", "error_seen_at",
                         "stream_stopped_at"})
OFFSET_FIELDS = ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
                 "rereceive_count", "send_count", "receive_count", "log_read", "peer_confirmed", "probes")
# Offsets a row may also hold none of (NULL: not known).
OPTIONAL_OFFSETS = frozenset({"peer_schema_version"})
MONOTONE = ("confirm_sent", "resend_count", "log_received", "confirm_received", "rereceive_count",
            "send_count", "receive_count", "error_count")
UPDATABLE = frozenset(COLUMNS) - {"name", "created_at"}
# Moments on the agent's clock (seconds), kept as numbers.
CLOCK_FIELDS = frozenset({"control_sent_at", "heard_at", "data_sent_at"})
_TEXT_FIELDS = ("transport", "address", "public_key", "last_error", "inbox", "stream_stopped")


#: Where the times of TIME_FIELDS sit in a row of COLUMNS.
TIME_AT = tuple(index for index, name in enumerate(COLUMNS) if name in TIME_FIELDS)
# Where plain_values finds the other columns it turns into plain values.
_SEND_AT, _INCARNATION_AT, _CONFIRM_OWED_AT = map(COLUMNS.index, ("send_at", "peer_incarnation", "confirm_owed"))
_READ_COLUMNS = attrgetter(*COLUMNS)


def plain_values(remote: RemoteUser) -> tuple[str | int | float | None, ...]:
    """``remote``'s values in the order of :data:`COLUMNS`, as
    Site.iter_remote_values gives its row: times as ISO 8601 text in UTC,
    ``send_at`` as ``time.isoformat`` writes it, the peer's incarnation id
    in UUID form, ``confirm_owed`` as 0 or 1; text and numbers as they are."""
    values = list(_READ_COLUMNS(remote))
    for index in TIME_AT:
        if values[index] is not None:
            values[index] = values[index].astimezone(timezone.utc).isoformat()
    if values[_SEND_AT] is not None:
        values[_SEND_AT] = values[_SEND_AT].isoformat()
    if values[_INCARNATION_AT] is not None:
        values[_INCARNATION_AT] = str(uuid.UUID(bytes=values[_INCARNATION_AT]))
    values[_CONFIRM_OWED_AT] = int(values[_CONFIRM_OWED_AT])
    return tuple(values)


@dataclass(frozen=True, slots=True)
class RemoteFilter:
    """Which rows of the remote-user table to read (``agent status``'s
    filters); every condition given must hold.

    * ``lagging``: the peer has not confirmed everything up to the log end
      (its horizon, :attr:`RemoteUser.horizon`, is below it): something
      logged here is not yet known to be applied there.
    * ``silent_since``: nothing heard from the peer since then: no message
      of it, data or control, arrived (``heard_at`` earlier; a row not yet
      heard from since layout 7 by ``last_received_at``, and a peer never
      heard from by the time its row was made).
    * ``with_errors``: the peer is in error now: a transport error in force
      (``last_error``), a stopped stream (``stream_stopped``), or an apply
      error of a message from it not yet acknowledged.  Errors that are
      over are history (``error_count``, ``error_seen_at``, acknowledged
      apply errors) and do not count.

    Each backend turns it into its own query (agent.site.sqlite.remotes.filter_where,
    agent.site.postgres.remotes).
    """

    lagging: bool = False
    silent_since: datetime | None = None
    with_errors: bool = False

    def __post_init__(self) -> None:
        if self.silent_since is not None and (not isinstance(self.silent_since, datetime)
                                              or self.silent_since.tzinfo is None):
            raise InvalidSetting("silent_since is an aware datetime")


def check_schedule(send_every: object, send_at: object) -> tuple[int | None, time | None]:
    """SEND EVERY seconds or SEND AT a local time of day (``'18:30'`` or a
    time), not both; returns them checked."""
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
    return None, send_at


def check_clock(what: str, value: object) -> None:
    if value is not None and (type(value) not in (int, float) or value != value):
        raise InvalidSetting(f"{what} must be a number of seconds, got {value!r}")


def check_text(what: str, value: object) -> None:
    if value is not None and type(value) is not str:
        raise InvalidSetting(f"{what} must be text, got {type(value).__name__}")


def check_timeouts(name: str, heartbeat: int | None, confirm_timeout: int | None, changes: Mapping) -> None:
    """A remote's confirm timeout is never above its heartbeat (rule 3: the
    probe comes before the heartbeat would)."""
    if ("heartbeat" in changes or "confirm_timeout" in changes) and heartbeat is not None \
            and confirm_timeout is not None and confirm_timeout > heartbeat:
        raise InvalidSetting(f"the confirm timeout of {name!r} ({confirm_timeout} s) would be above its heartbeat "
                             f"({heartbeat} s); lower the confirm timeout or raise the heartbeat")


def check_incarnation(value: object) -> None:
    if value is not None and (type(value) is not bytes or len(value) != 16):
        raise InvalidSetting("a peer incarnation id is 16 bytes")


def check_count(value: object) -> None:
    if type(value) is not int or value < 0:
        raise InvalidSetting(f"message count must be a non-negative integer, got {value!r}")


def check_new_remote(identity: SiteIdentity, name: str, *, address: object, transport: object, public_key: object,
                     send_every: object, send_at: object, peer_incarnation: object) -> tuple[int | None, time | None]:
    """What adding one remote refuses before looking at the table: its name
    (and not the site's own), texts, incarnation and schedule."""
    check_name(name, "remote name")
    if name == identity.name:
        raise InvalidSetting(f"a site cannot be its own remote ({name!r})")
    for what, value in (("address", address), ("transport", transport), ("public key", public_key)):
        check_text(what, value)
    check_incarnation(peer_incarnation)
    return check_schedule(send_every, send_at)


def remote_exists(name: str) -> RemoteExists:
    return RemoteExists(f"remote {name!r} exists already; update it instead")


def one_consolidated(identity: SiteIdentity, other: str) -> WrongRole:
    """A remote site already has its consolidated ``other``."""
    return WrongRole(f"remote site {identity.name!r} already has its consolidated {other!r}; "
                     "a remote exchanges messages with one consolidated only")


def check_start(start: object, end: int) -> int:
    """A new remote's stream starts at a log offset in ``0..end`` (the log end)."""
    if type(start) is not int or not 0 <= start <= end:
        raise InvariantViolation(f"a new remote starts at a log offset in 0..{end}, got {start!r}")
    return start


def check_updatable(changes: Mapping[str, Any]) -> None:
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise InvalidSetting(f"remote-user columns {sorted(unknown)} cannot be updated; "
                             f"updatable: {sorted(UPDATABLE)}")


def checked_update(current: RemoteUser, changes: Mapping[str, Any], log_end: Callable[[], int]) -> dict[str, Any]:
    """The columns to write for ``changes`` to the row ``current`` (after
    :func:`check_updatable`), as Python values: times in UTC, ``send_at`` a
    time of day, ``confirm_owed`` a bool.  ``log_end()`` is asked only when
    an offset that must stay within the log changes."""
    name = current.name
    for field_name in OFFSET_FIELDS:
        if field_name in changes:
            value = changes[field_name]
            if type(value) is not int or value < 0:
                raise InvalidSetting(f"{field_name} must be a non-negative integer, got {value!r}")
            if field_name in MONOTONE and value < getattr(current, field_name):
                raise InvariantViolation(f"{field_name} of {name!r} cannot go back from "
                                         f"{getattr(current, field_name)} to {value}")
    for what in _TEXT_FIELDS:
        if what in changes:
            check_text(what, changes[what])
    if "peer_incarnation" in changes:
        check_incarnation(changes["peer_incarnation"])
    stored = dict(changes)
    if "send_every" in changes or "send_at" in changes:
        stored["send_every"], stored["send_at"] = check_schedule(changes.get("send_every", current.send_every),
                                                                 changes.get("send_at", current.send_at))
    for field_name in TIME_FIELDS & set(changes):
        stored[field_name] = in_utc(changes[field_name])
    log_sent = stored.get("log_sent", current.log_sent)
    confirm_sent = stored.get("confirm_sent", current.confirm_sent)
    if confirm_sent > log_sent:
        raise InvariantViolation(f"confirm_sent ({confirm_sent}) of {name!r} would exceed log_sent ({log_sent})")
    if "log_sent" in stored or "log_send" in stored or "log_read" in stored:
        end = log_end()
        if log_sent > end:
            raise InvariantViolation(f"log_sent ({log_sent}) of {name!r} would lie beyond the log end ({end})")
        if stored.get("log_read", 0) > end:
            raise InvariantViolation(f"log_read ({stored['log_read']}) of {name!r} would lie beyond the log end "
                                     f"({end})")
    for field_name in CLOCK_FIELDS & set(changes):
        check_clock(field_name, changes[field_name])
    if "heartbeat" in changes and changes["heartbeat"] is not None and (
            type(changes["heartbeat"]) is not int or changes["heartbeat"] < 1):
        raise InvalidSetting(f"heartbeat must be a whole number of seconds >= 1, got {changes['heartbeat']!r}")
    if "confirm_timeout" in changes and changes["confirm_timeout"] is not None and (
            type(changes["confirm_timeout"]) is not int or changes["confirm_timeout"] < 1):
        raise InvalidSetting("confirm_timeout must be a whole number of seconds >= 1, "
                             f"got {changes['confirm_timeout']!r}")
    check_timeouts(name, stored.get("heartbeat", current.heartbeat),
                   stored.get("confirm_timeout", current.confirm_timeout), changes)
    if "confirm_owed" in changes and type(changes["confirm_owed"]) is not bool:
        raise InvalidSetting(f"confirm_owed must be a bool, got {changes['confirm_owed']!r}")
    for field_name in OPTIONAL_OFFSETS & set(changes):
        value = changes[field_name]
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidSetting(f"{field_name} must be a non-negative integer or none, got {value!r}")
    return stored


# The columns the agent saves for every pair a phase changed (agent.pairs):
# updated in bulk, checked in one pass (check_pair_update).
PAIR_COLUMNS = frozenset({"log_send", "log_read", "control_sent_at", "heard_at", "confirm_sent", "resend_count",
                          "confirm_received", "rereceive_count", "peer_incarnation", "log_sent", "data_sent_at",
                          "peer_confirmed", "probes", "confirm_owed", "peer_schema_version"})
#: The columns of a row check_pair_update reads.
PAIR_CHECKED = ("log_sent", "confirm_sent", *MONOTONE)


def is_pair_update(columns: Mapping[str, Any]) -> bool:
    """Whether ``columns`` change only what check_pair_update checks (a
    peer's incarnation goes through checked_update)."""
    return set(columns) <= PAIR_COLUMNS and "peer_incarnation" not in columns


def check_pair_update(name: str, row: Mapping[str, int], columns: Mapping[str, Any], end: int) -> None:
    """The rules of :func:`checked_update` for a pair's columns, given the
    row's :data:`PAIR_CHECKED` columns and the log end: at ten thousand
    rows, making each a RemoteUser cost more than the updates."""
    for column, value in columns.items():
        if column in CLOCK_FIELDS:
            check_clock(column, value)
            continue
        if column == "confirm_owed":
            if type(value) is not bool:
                raise InvalidSetting(f"confirm_owed must be a bool, got {value!r}")
            continue
        if column in OPTIONAL_OFFSETS and value is None:
            continue
        if type(value) is not int or value < 0:
            raise InvalidSetting(f"{column} must be a non-negative integer, got {value!r}")
        if column in MONOTONE and value < row[column]:
            raise InvariantViolation(f"{column} of {name!r} cannot go back from {row[column]} to {value}")
    log_sent = columns.get("log_sent", row["log_sent"])
    if columns.get("confirm_sent", row["confirm_sent"]) > log_sent:
        raise InvariantViolation(f"confirm_sent of {name!r} would exceed log_sent ({log_sent})")
    if log_sent > end or columns.get("log_read", 0) > end:
        raise InvariantViolation(f"log_sent or log_read of {name!r} would lie beyond the log end ({end})")


# The columns a send phase moves for every peer when the log end moves:
# what is due (log_send) and how far the log was read (log_read).
READ_COLUMNS = ("log_send", "log_read")
# The columns whose write makes a row leave the common read position
# (agent/site/*/read_positions.py; docs/protocol.md, "The common read position").
POSITION_COLUMNS = frozenset({*READ_COLUMNS, "log_sent"})


_UNSEEN = object()


def _read_move(name: str, columns: Mapping[str, Any], end: int) -> tuple[tuple[str, int], ...] | None:
    """The group of a change that moves only :data:`READ_COLUMNS` (checked),
    or None for any other change."""
    if not columns or not all(column in READ_COLUMNS for column in columns):
        return None
    for column, value in columns.items():
        if type(value) is not int or value < 0:
            raise InvalidSetting(f"{column} must be a non-negative integer, got {value!r}")
    if columns.get("log_read", 0) > end:
        raise InvariantViolation(f"log_sent or log_read of {name!r} would lie beyond the log end ({end})")
    return tuple(sorted(columns.items()))


def read_moves(changes: Mapping[str, Mapping[str, Any]], end: int,
               write: Callable[[tuple[tuple[str, int], ...], list[str]], int]) -> dict[str, Mapping[str, Any]]:
    """Save the rows of a save of many pairs whose only changes are
    :data:`READ_COLUMNS` (a send phase at a fleet moves them for every peer
    the new range held nothing for), each checked here (non-negative ints,
    ``log_read`` not beyond the log end), with one ``write(columns and
    values, names)`` per group of values, without reading their rows; the
    backend's statement returns how many rows it wrote.  Returns the other
    changes, with a group's rows again when a name in it is no remote (the
    backend's row-by-row path refuses it)."""
    moves: dict[tuple[tuple[str, int], ...], list[str]] = {}
    rest: dict[str, Mapping[str, Any]] = {}
    # A change checked once for all the pairs given the same one (its items
    # and their types): its group, or None when it is not a move of reads.
    checked: dict[tuple, tuple[tuple[str, int], ...] | None] = {}
    # Pairs given one change object (a send phase's group) are checked once.
    by_object: dict[int, tuple[tuple[str, int], ...] | None] = {}
    for name, columns in changes.items():
        group = by_object.get(id(columns), _UNSEEN)
        if group is _UNSEEN:
            probe = (tuple(columns.items()), tuple(map(type, columns.values())))
            group = checked.get(probe, _UNSEEN)
            if group is _UNSEEN:
                group = checked[probe] = _read_move(name, columns, end)
            by_object[id(columns)] = group
        if group is None:
            rest[name] = columns
        else:
            moves.setdefault(group, []).append(name)
    for move, names in moves.items():
        if write(move, names) != len(names):
            rest.update((name, dict(move)) for name in names)
    return rest


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
            check_text(what, value)
        _every, at = check_schedule(self.send_every, self.send_at)
        object.__setattr__(self, "send_at", at)
        subscriptions = tuple(self.subscriptions)
        for item in subscriptions:
            if type(item) is not tuple or len(item) != 2 or type(item[0]) is not str:
                raise InvalidSetting(f"a subscription is (publication, value), got {item!r}")
            check_subscription_value(item[1])
        object.__setattr__(self, "subscriptions", subscriptions)


def check_new_remotes(identity: SiteIdentity, remotes: Sequence[NewRemote], *, taken: set[str],
                      publications: set[str], consolidated: str | None) -> None:
    """What a bulk add refuses before writing a row, as
    :class:`RemoteRejected` naming the remote's index: names taken
    (``taken``) or repeated, the site's own name, publications not among
    ``publications``; at a remote site, a second peer (``consolidated``:
    the one it has, if any)."""
    if identity.role is Role.REMOTE and remotes and (consolidated or len(remotes) > 1):
        raise RemoteRejected(0 if consolidated else 1, one_consolidated(identity, consolidated or remotes[0].name))
    seen: dict[str, int] = {}
    for index, remote in enumerate(remotes):
        if type(remote) is not NewRemote:
            raise InvalidSetting(f"a bulk add takes NewRemote values, got {type(remote).__name__}")
        if remote.name == identity.name:
            raise RemoteRejected(index, InvalidSetting(f"a site cannot be its own remote ({remote.name!r})"))
        if remote.name in taken:
            raise RemoteRejected(index, remote_exists(remote.name))
        if remote.name in seen:
            raise RemoteRejected(index, InvalidSetting(
                f"remote {remote.name!r} is given twice (first as number {seen[remote.name] + 1})"))
        seen[remote.name] = index
        for publication, _value in remote.subscriptions:
            if publication not in publications:
                raise RemoteRejected(index, UnknownPublication(f"no publication named {publication!r}"))


def schema_current(version: int | None, peer_horizon: int, peer_version: int | None) -> bool | None:
    """Whether a remote runs the consolidated's schema of now (docs/protocol.md,
    "Schema versions"): it reported the consolidated's ``version``, or its
    :func:`horizon` is at or past it (it confirmed all it was sent of the
    log through it), so it applied every change up to it that reaches it
    (a change that does not reach it, an index of a table it does not
    hold, leaves its own version behind, and it is current all the same).
    None: the consolidated has made no change."""
    if version is None:
        return None
    return peer_horizon >= version or (peer_version is not None and peer_version >= version)
