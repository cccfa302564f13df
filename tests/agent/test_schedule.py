import time as clock
from datetime import datetime, time, timedelta, timezone

import pytest

from agent.schedule import TruncationSchedule, sending_due

NOW = datetime(2026, 11, 21, 18, 45, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def zone(monkeypatch):
    """SEND AT reads the system time zone: UTC here unless a test sets
    another (``zone("Europe/Oslo")``); the process's own afterwards."""

    def use(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        clock.tzset()

    use("UTC")
    yield use
    monkeypatch.undo()
    clock.tzset()


def test_no_schedule_sends_every_cycle():
    assert sending_due(NOW, NOW, send_every=None, send_at=None)


def test_send_every_waits_for_the_interval():
    assert not sending_due(NOW, NOW - timedelta(minutes=10), send_every=1800, send_at=None)
    assert sending_due(NOW, NOW - timedelta(minutes=30), send_every=1800, send_at=None)
    assert sending_due(NOW, None, send_every=1800, send_at=None)


def test_send_at_once_a_day_at_or_after_the_time():
    at = time(18, 30)
    assert sending_due(NOW, NOW - timedelta(hours=2), send_every=None, send_at=at)  # 16:45 < 18:30 <= 18:45
    assert not sending_due(NOW, NOW - timedelta(minutes=5), send_every=None, send_at=at)  # sent at 18:40
    before = NOW.replace(hour=17)
    assert not sending_due(before, before - timedelta(hours=3), send_every=None, send_at=at)  # sent 14:00, after yesterday's
    assert sending_due(before, before - timedelta(days=1, hours=1), send_every=None, send_at=at)  # missed yesterday


def test_send_at_keeps_to_the_wall_clock_across_a_daylight_saving_change(zone):
    """Oslo, the night of 24-25 October 2026 (CEST +02 -> CET +01): sent at
    18:31 on the 24th, nothing is due on the morning of the 25th; on the
    evening, from 18:30 (CET), a send is."""
    zone("Europe/Oslo")
    at = time(18, 30)
    sent = datetime(2026, 10, 24, 16, 31, tzinfo=timezone.utc)  # 18:31 CEST
    # `now` as the agent takes it: the local time with the offset in force.
    morning = datetime(2026, 10, 25, 9, 0, tzinfo=timezone.utc).astimezone()  # 10:00 CET
    assert morning.utcoffset() == timedelta(hours=1)
    assert not sending_due(morning, sent, send_every=None, send_at=at)
    assert not sending_due(datetime(2026, 10, 25, 17, 29, tzinfo=timezone.utc).astimezone(), sent,
                           send_every=None, send_at=at)  # 18:29 CET
    assert sending_due(datetime(2026, 10, 25, 17, 30, tzinfo=timezone.utc).astimezone(), sent,
                       send_every=None, send_at=at)  # 18:30 CET
    # Spring: sent 18:31 CET on 28 March, the clocks go to CEST that night.
    sent = datetime(2026, 3, 28, 17, 31, tzinfo=timezone.utc)
    assert not sending_due(datetime(2026, 3, 29, 16, 29, tzinfo=timezone.utc).astimezone(), sent,
                           send_every=None, send_at=at)  # 18:29 CEST
    assert sending_due(datetime(2026, 3, 29, 16, 30, tzinfo=timezone.utc).astimezone(), sent,
                       send_every=None, send_at=at)  # 18:30 CEST
    # SEND EVERY counts real time, not wall time: one hour across the change.
    assert sending_due(datetime(2026, 10, 25, 1, 0, tzinfo=timezone.utc).astimezone(),
                       datetime(2026, 10, 25, 0, 0, tzinfo=timezone.utc), send_every=3600, send_at=None)


def test_truncation_waits_for_the_horizon_to_move_and_then_for_its_interval():
    schedule = TruncationSchedule(every=10.0)
    assert not schedule.due(0.0, None)  # no peers: never
    assert schedule.due(0.0, 5)  # the first one at once
    schedule.truncated(0.0, 5)
    assert not schedule.due(100.0, 5) and schedule.deadline(5) is None  # nothing moved: never
    assert schedule.deadline(7) == 10.0
    assert not schedule.due(9.9, 7) and schedule.due(10.0, 7)
    schedule.truncated(10.0, 7)
    assert schedule.due(25.0, 8)  # a horizon that moved long after the last one: at once
