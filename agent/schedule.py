"""When the agent does what it does on a schedule: send to a remote (SEND
EVERY and SEND AT, GRANT REMOTE), truncate the log (rule 8), wait on its
inbox again after the transport could not.

Rules of this file:
* Pure: no I/O, no clock; ``now`` comes from the caller (the runner's
  injected clock), which asks and then carries out.
* SEND AT reads wall-clock times in the system's time zone (``TZ``), with
  the zone's rules for each moment, so that a daylight-saving change moves
  no send.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING

from transports.backoff import Backoff

if TYPE_CHECKING:
    from .site import RemoteUser


def sending_due(now: datetime, last_sent_at: datetime | None, *, send_every: int | None,
                send_at: time | None) -> bool:
    """True when a send to a remote is due.

    * No schedule: every send cycle (every ``--send-delay``).
    * SEND EVERY n seconds: when n seconds have passed since the last send.
    * SEND AT hh:mm (local wall-clock time): once a day, the first cycle at
      or after that time; a site that was down at that time sends when it
      comes back.  The last send and ``now`` are compared as local wall
      times, each with the offset in force at its moment: the day after
      a daylight-saving change is no day with a send too many or too few.
    """
    if send_every is None and send_at is None:
        return True
    if last_sent_at is None:
        return True
    if send_every is not None:
        return (now - last_sent_at).total_seconds() >= send_every
    assert send_at is not None
    wall_now, wall_last = _wall(now), _wall(last_sent_at)
    today = wall_now.replace(hour=send_at.hour, minute=send_at.minute, second=send_at.second,
                             microsecond=send_at.microsecond)
    latest = today if today <= wall_now else today - timedelta(days=1)
    return wall_last < latest


class SendSchedule:
    """Which peers a send phase sends to: in a batch run every peer; in a
    continuous one each peer whose schedule (:func:`sending_due`) is due,
    counted from the last scheduled send of this agent (or the last
    recorded send), whether or not it carried data."""

    def __init__(self) -> None:
        self._last: dict[str, datetime] = {}

    def due(self, now: float, peer: str, remote: "RemoteUser | None") -> bool:
        """Whether ``peer``'s send is due at ``now``; ``remote``: its
        remote-user row (None: a batch run, which sends to every peer).  A
        due send counts as the last scheduled one."""
        wall = datetime.fromtimestamp(now).astimezone()
        if remote is not None and not sending_due(wall, self._last.get(peer, remote.last_sent_at),
                                                  send_every=remote.send_every, send_at=remote.send_at):
            return False
        self._last[peer] = wall
        return True


def _wall(moment: datetime) -> datetime:
    """The local wall-clock time (naive) of an aware ``moment``, by the
    system time zone's rules for that moment."""
    return moment.astimezone().replace(tzinfo=None)


# Continuous mode truncates the log at most this often (seconds), and at
# the latest this long after a confirmation moved the horizon (rule 8).
TRUNCATE_EVERY = 10.0


class TruncationSchedule:
    """When a continuous agent truncates its log (docs/protocol.md, rule 8):
    once the smallest horizon over all peers moved past the last
    truncation, at most every ``every`` seconds.  Pure: ``now`` and the
    horizon come from the caller, which truncates when :meth:`due` says
    so and then calls :meth:`truncated`."""

    def __init__(self, every: float = TRUNCATE_EVERY) -> None:
        self.every = every
        self._through: int | None = None  # the horizon at the last truncation
        self._at: float | None = None  # when it was made

    def due(self, now: float, horizon: int | None, *, run_ends: bool = False) -> bool:
        """Whether to truncate now: in continuous mode as :meth:`deadline`
        says; ``run_ends`` (a batch run ends) always (a batch run builds only
        the pairs with work: the database finds the horizon over every
        remote-user row, and with none deletes nothing)."""
        if run_ends:
            return True
        deadline = self.deadline(horizon)
        return deadline is not None and now >= deadline

    def deadline(self, horizon: int | None) -> float | None:
        """When a truncation falls due for this horizon (None: not at all,
        nothing moved or there are no peers)."""
        if horizon is None or (self._through is not None and horizon <= self._through):
            return None
        return float("-inf") if self._at is None else self._at + self.every

    def truncated(self, now: float, horizon: int) -> None:
        self._through, self._at = horizon, now


class PhaseSchedule:
    """When a continuous agent runs its receive phase (every
    ``receive_every`` seconds, sooner when its transport says files
    arrived) and its send phase (every ``send_every``); None: never (a
    ``--send-only`` or ``--receive-only`` agent).  Both are due at the start."""

    def __init__(self, now: float, *, receive_every: float | None, send_every: float | None) -> None:
        self.receive_every, self.send_every = receive_every, send_every
        self.next_receive = None if receive_every is None else now
        self.next_send = None if send_every is None else now

    def receive_due(self, now: float) -> bool:
        """Whether the receive phase is due at ``now``; if so, the next one is counted from ``now``."""
        if self.next_receive is None or self.receive_every is None or now < self.next_receive:
            return False
        self.next_receive = now + self.receive_every
        return True

    def send_due(self, now: float) -> bool:
        """Whether the send phase is due at ``now``; if so, the next one is counted from ``now``."""
        if self.next_send is None or self.send_every is None or now < self.next_send:
            return False
        self.next_send = now + self.send_every
        return True

    def files_arrived(self, now: float) -> None:
        """The transport says files arrived: receive them now."""
        if self.next_receive is not None:
            self.next_receive = now

    def deadline(self, *timers: float | None) -> float:
        """Until when the agent may wait: the next phase due, or one of
        ``timers`` (the protocols', the truncation's) if sooner."""
        return min((moment for moment in (self.next_receive, self.next_send, *timers) if moment is not None),
                   default=float("inf"))


# A continuous agent whose inbox's transport cannot wait (its server is
# gone) sleeps instead, and tries the transport again after 5 s, 10 s ...
# at most 5 minutes.
WAIT_BACKOFF = Backoff(None, 5.0, 300.0)


class InboxWait:
    """Whether a continuous agent waits on its inbox's transport, or sleeps
    while the transport cannot wait, trying it again with backoff.  Pure:
    the runner waits, and tells :meth:`failed` and :meth:`worked`."""

    def __init__(self, backoff: Backoff = WAIT_BACKOFF) -> None:
        self.backoff = backoff
        self.failures = 0  # in a row; 1: an outage began (warned about once)
        self._until: float | None = None  # no wait on the transport before then

    def ready(self, now: float) -> bool:
        """Whether to wait on the transport (else sleep: :meth:`sleep`)."""
        return self._until is None or now >= self._until

    def failed(self, now: float) -> float:
        """The transport could not wait: return the delay before it is tried again."""
        self.failures += 1
        delay = self.backoff.delay(self.failures)
        self._until = now + delay
        return delay

    def worked(self) -> None:
        self.failures = 0

    def sleep(self, now: float, timeout: float) -> float:
        """How long to sleep without the transport, at most ``timeout``:
        while it is backing off, until it may be tried again."""
        if self._until is None or now >= self._until:
            return max(0.0, timeout)
        return max(0.0, min(timeout, self._until - now))
