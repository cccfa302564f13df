"""The values the protocol core (agent/protocol.py) takes and gives: a pair's
state, the actions it hands out, its counters and settings.

Rules of this file:
* Values only: frozen dataclasses (Settings excepted: tests switch a
  safety rule off on a running core), checked where they are made.
* Misuse by local code raises :class:`LocalProtocolError` (a bug).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Union

from codec.message import ControlState

from .errors import AgentError
from .site.remote_rules import horizon


class LocalProtocolError(AgentError):
    """Local code drove the protocol in a way it does not allow (a bug)."""


_COUNTERS = ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
             "rereceive_count", "peer_log_sent", "gap_polls", "request_patience", "log_read", "peer_confirmed",
             "probes")


@dataclass(frozen=True, slots=True)
class PairState:
    """The remote-user row's protocol columns for one peer."""

    log_send: int = 0
    log_sent: int = 0
    confirm_sent: int = 0
    resend_count: int = 0
    log_received: int = 0
    confirm_received: int = 0
    rereceive_count: int = 0
    peer_incarnation: bytes | None = None
    # Publishing side, rule 5: the log was read for the peer up to here;
    # (log_sent, log_read] held nothing for it.  Below log_sent it means log_sent.
    log_read: int = 0
    # When a control message was last queued to the peer (the caller's clock),
    # for the heartbeat (rule 3); None: never.
    control_sent_at: float | None = None
    # When a message of the peer's current copy (data or control) last
    # arrived (the caller's clock): what "heard from" means; None: never.
    heard_at: float | None = None
    # Kept across runs so that batch runs (`run --once`) detect gaps too:
    peer_log_sent: int = 0  # the most the peer said it sent (tail-loss detection)
    gap_polls: int = 0  # consecutive polls that saw a gap
    request_patience: int = 0  # polls the current gap must last; 0 = Settings.patience
    # Rule 3, never silent while something is outstanding.  Receiving side:
    # the peer is known to hold a confirmation of log_received up to here (a
    # control of the peer that did not ask for one carried this log_sent);
    # and a confirmation is owed (a probe or a duplicate arrived, or data
    # went to a peer not known to hold it).  Publishing side: when a data
    # message last went to the peer (the caller's clock; None: never), and
    # the probes sent since the stream last changed (the backoff).
    peer_confirmed: int = 0
    confirm_owed: bool = False
    data_sent_at: float | None = None
    probes: int = 0
    # The largest schema version the peer reported in its control messages
    # (docs/protocol.md, "Schema versions"); None: none.  Information for
    # the operator: no rule reads it.
    peer_schema_version: int | None = None

    def __post_init__(self) -> None:
        if not self.confirm_sent <= self.log_sent:
            raise LocalProtocolError(f"confirm_sent {self.confirm_sent} is after log_sent {self.log_sent}")
        # One comparison for all (the core makes a state at every step of
        # every pair); the names are looked at only to say which one.
        if min(self.log_send, self.log_sent, self.confirm_sent, self.resend_count, self.log_received,
               self.confirm_received, self.rereceive_count, self.peer_log_sent, self.gap_polls,
               self.request_patience, self.log_read, self.peer_confirmed, self.probes) < 0:
            for name in _COUNTERS:
                if getattr(self, name) < 0:
                    raise LocalProtocolError(f"{name} must be >= 0")
        if self.peer_schema_version is not None and self.peer_schema_version < 0:
            raise LocalProtocolError("peer_schema_version must be >= 0")

    def evolve(self, **changes: object) -> "PairState":
        """``dataclasses.replace(self, **changes)``, checked alike, at half
        its cost: the core makes a new state at each step of every pair, and
        a send phase steps every pair of a fleet."""
        values = list(_ALL_FIELDS(self))
        for name, value in changes.items():
            values[_FIELD_AT[name]] = value
        return PairState(*values)

    @property
    def read_through(self) -> int:
        """How far the log was read for the peer (rule 5)."""
        return max(self.log_read, self.log_sent)

    @property
    def horizon(self) -> int:
        """Rule 8: the log this peer may still need starts after here."""
        return horizon(self.log_read, self.log_sent, self.confirm_sent)

    @property
    def awaits_poll(self) -> bool:
        """A receive poll may do something for the pair though nothing of the
        peer is queued (rule 4): the peer said it sent beyond what arrived,
        or a gap's patience is being counted out."""
        return self.peer_log_sent > self.log_received or self.gap_polls > 0

    @property
    def unconfirmed(self) -> bool:
        """The peer has not confirmed all that was sent to it (rule 3: its
        control messages ask for a confirmation, and probes go)."""
        return self.confirm_sent < self.log_sent


_ALL_FIELDS = attrgetter(*(field.name for field in fields(PairState)))
_FIELD_AT = {field.name: index for index, field in enumerate(fields(PairState))}


# --- actions --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Apply:
    """Apply these inbound messages (one whole message, or a complete group of
    parts in seq order) in ONE database transaction that also sets
    ``log_received``; skip their transactions with commit <= ``skip_through``.
    Then call :meth:`PairProtocol.apply_done` (or ``apply_aborted``)."""

    message_ids: tuple[str, ...]
    skip_through: int
    log_received: int


@dataclass(frozen=True, slots=True)
class DeleteInbound:
    """Remove these inbound messages from the queue; ``reason`` says why
    (``applied``, ``stale``, ``duplicate``)."""

    message_ids: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Move this inbound message aside, never apply it; ``reason`` says why."""

    message_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SendData:
    """Pack this site's log in ``(start, end]`` for the peer into messages of
    epoch ``resend_count`` (the first one's ``prev`` is ``start``, the final
    one covers up to ``end``), enqueue them durably, then call
    :meth:`PairProtocol.send_done`.  The log is read from ``read_from``
    (None: ``start``): ``(start, read_from]`` held nothing for the peer.
    When the range holds nothing for the peer, no message is made: call
    ``send_done(now, end, empty=True)``."""

    start: int
    end: int
    resend_count: int
    read_from: int | None = None

    @property
    def read_start(self) -> int:
        return self.start if self.read_from is None else self.read_from


@dataclass(frozen=True, slots=True)
class PurgeOutbound:
    """Drop queued-but-unsent outbound messages of epochs below this one."""

    below_resend_count: int


@dataclass(frozen=True, slots=True)
class SendControl:
    """Send this control message to the peer."""

    state: ControlState
    reason: str


@dataclass(frozen=True, slots=True)
class StreamStopped:
    """The peer's incarnation id changed: its stream is stopped until an
    operator acts (re-extraction).  Report it."""

    expected: bytes
    received: bytes

    def describe(self, peer: str) -> str:
        """What happened and what to do, in one line."""
        return (f"{peer} changed its incarnation id ({self.expected.hex()[:8]} -> {self.received.hex()[:8]}): its "
                "stream is stopped; re-extract the remote or re-add it")


Action = Union[Apply, DeleteInbound, Quarantine, SendData, PurgeOutbound, SendControl, StreamStopped]


@dataclass(frozen=True, slots=True)
class Counters:
    """What happened on this pair since the agent started."""

    applied_messages: int = 0
    stale_deleted: int = 0
    duplicates_deleted: int = 0
    rejected: int = 0
    resend_requests_sent: int = 0
    resends_done: int = 0
    controls_sent: int = 0
    probes_sent: int = 0


@dataclass(slots=True)
class Settings:
    """Tuning of the protocol (dbremote switches in brackets)."""

    patience: int = 1  # polls before a gap counts as a loss [-rp]
    resend_urgency: float = 30.0  # seconds a resend request waits [-ru]
    max_patience: int = 64  # the backoff between repeated requests stops growing here
    # Test-only switches that turn a safety rule off, so the fault-injection
    # suite can prove it notices the damage.  Never set them in production.
    unsafe_without_stale_rule: bool = False  # rule 1: stale epochs are kept (and may be applied)
    unsafe_without_duplicate_rule: bool = False  # rule 1 duplicates kept, rule 2 applies without skipping

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise LocalProtocolError("patience must be at least 1 poll")
        if self.resend_urgency < 0:
            raise LocalProtocolError("resend urgency must be >= 0 seconds")
