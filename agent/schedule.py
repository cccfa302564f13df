"""When sending to a remote is due: SEND EVERY and SEND AT (GRANT REMOTE).

Pure functions of the schedule, the last send and ``now``; no clock inside.
SEND AT reads wall-clock times in the system's time zone (``TZ``), with
the zone's rules for each moment, so that a daylight-saving change moves
no send.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta


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

    def due(self, now: float, horizon: int | None) -> bool:
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
