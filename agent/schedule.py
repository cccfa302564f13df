"""When sending to a remote is due: SEND EVERY and SEND AT (GRANT REMOTE).

Pure functions of the schedule, the last send and ``now``; no clock inside.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta


def sending_due(now: datetime, last_sent_at: datetime | None, *, send_every: int | None,
                send_at: time | None) -> bool:
    """True when a send to a remote is due.

    * No schedule: every send cycle (every ``--send-delay``).
    * SEND EVERY n seconds: when n seconds have passed since the last send.
    * SEND AT hh:mm (local time of ``now``): once a day, the first cycle at or
      after that time; a site that was down at that time sends when it
      comes back.
    """
    if send_every is None and send_at is None:
        return True
    if last_sent_at is None:
        return True
    if send_every is not None:
        return (now - last_sent_at).total_seconds() >= send_every
    assert send_at is not None
    today = now.replace(hour=send_at.hour, minute=send_at.minute, second=send_at.second,
                        microsecond=send_at.microsecond)
    latest = today if today <= now else today - timedelta(days=1)
    return last_sent_at < latest
