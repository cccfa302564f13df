from datetime import datetime, time, timedelta, timezone

from agent.schedule import sending_due

NOW = datetime(2026, 11, 21, 18, 45, tzinfo=timezone.utc)


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
