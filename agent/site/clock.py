"""Moments a site records: the caller's clock, in UTC.

Rules of this file:
* A time a site method records is its ``now`` argument; only a caller
  outside an agent's run (the CLI, setup, tools) may leave it out and get
  :func:`utc_now`.  The agent passes its one clock's time, so that every
  time a run records is that clock's (tests/agent/test_layout.py).
* A moment is an aware datetime, kept in UTC; a naive one is refused.
* Pure: no database.  Each backend stores moments its own way (SQLite as
  ISO 8601 text, agent.site.sqlite._db; PostgreSQL as timestamptz).
"""

from __future__ import annotations

from datetime import datetime, timezone

from .errors import InvalidSetting


def utc_now() -> datetime:
    """The default ``now`` of the site library, for callers outside an
    agent's run; never reached while an agent runs (it passes ``now``)."""
    return datetime.now(timezone.utc)


def in_utc(moment: datetime | None) -> datetime | None:
    """``moment`` in UTC (None stays None); a naive datetime is refused."""
    if moment is None:
        return None
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        raise InvalidSetting(f"time {moment!r} has no time zone; pass an aware datetime")
    return moment.astimezone(timezone.utc)
