import time as clock
from datetime import datetime, time, timedelta, timezone

import pytest

from agent.schedule import InboxWait, PhaseSchedule, SendSchedule, TruncationSchedule, sending_due

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


def test_a_batch_run_end_always_truncates():
    """Rule 8 is one decision for both modes: a batch run truncates as it
    ends (even with the horizon where the last one left it); a continuous
    run as above."""
    schedule = TruncationSchedule(every=10.0)
    assert schedule.due(0.0, None, run_ends=True)  # no pair built: the database finds the horizon
    assert schedule.due(0.0, 5, run_ends=True)
    schedule.truncated(0.0, 5)
    assert schedule.due(1.0, 5, run_ends=True) and not schedule.due(1.0, 5)


class Row:
    """The columns of a remote-user row a send schedule reads."""

    def __init__(self, last_sent_at=None, send_every=None, send_at=None):
        self.last_sent_at, self.send_every, self.send_at = last_sent_at, send_every, send_at


def test_a_send_schedule_is_due_in_every_batch_run_and_counts_from_the_last_scheduled_send():
    schedule, now = SendSchedule(), NOW.timestamp()
    assert schedule.due(now, "f1", None) and schedule.due(now + 1, "f1", None)  # batch: every run
    hourly = Row(last_sent_at=NOW - timedelta(hours=2), send_every=3600)
    assert schedule.due(now, "f2", hourly)  # the last recorded send is two hours old
    # From now on it counts from this scheduled send, whether or not it carried data.
    assert not schedule.due(now + 1800, "f2", hourly)
    assert schedule.due(now + 3600, "f2", hourly)
    assert schedule.due(now + 3601, "f3", Row())  # no schedule: every send phase


def test_a_continuous_agents_phases_fall_due_by_their_delays_and_sooner_when_files_arrive():
    phases = PhaseSchedule(100.0, receive_every=30.0, send_every=60.0)
    assert phases.receive_due(100.0) and phases.send_due(100.0)  # both at the start
    assert not phases.receive_due(110.0) and not phases.send_due(110.0)
    assert phases.deadline() == 130.0
    assert phases.deadline(None, 120.0, 500.0) == 120.0  # a protocol's timer comes sooner
    phases.files_arrived(115.0)
    assert phases.deadline() == 115.0 and phases.receive_due(115.0)
    assert phases.receive_due(145.0) and phases.send_due(160.0)
    send_only = PhaseSchedule(0.0, receive_every=None, send_every=60.0)
    send_only.files_arrived(5.0)
    assert not send_only.receive_due(1e9) and send_only.deadline() == 0.0


def test_an_inbox_wait_that_fails_backs_off_to_five_minutes_and_sleeps_the_whole_timeout_otherwise():
    wait = InboxWait()
    assert wait.ready(0.0) and wait.sleep(0.0, 30.0) == 30.0  # never failed: a plain wait is the timeout
    delays = [wait.failed(float(moment)) for moment in range(10)]
    assert delays == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0, 300.0]
    assert wait.failures == 10 and not wait.ready(9.0) and wait.ready(309.0)
    assert wait.sleep(9.0, 30.0) == 30.0 and wait.sleep(300.0, 30.0) == 9.0 and wait.sleep(309.0, 30.0) == 30.0
    wait.worked()
    assert wait.failures == 0 and wait.failed(400.0) == 5.0  # a new outage starts over (and is warned about)
    assert InboxWait().failed(0.0) == 5.0 and wait.backoff.delay(10_000) == 300.0  # no overflow, however long
