"""agent.cli._common: durations, sizes, times and their wording."""

from __future__ import annotations

from datetime import datetime, timezone

import click
import pytest

from agent.cli._common import ByteSize, Duration, TimeOfDay, format_moment, format_seconds, parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0), ("1h30m", 5400.0), ("2m30s", 150.0),
    ("0.5s", 0.5), (" 10 m ", 600.0), ("1H", 3600.0), ("250ms", 0.25), ("1e3", 1000.0)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "5x", "-5", "5m5m", "1m2h3", "5 minutes", "1e400", "5mss", "inf"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_duration_type() -> None:
    assert Duration().convert("5m", None, None) == 300.0
    assert Duration(whole_seconds=True).convert("1h", None, None) == 3600
    with pytest.raises(click.BadParameter, match="longer than zero"):
        Duration().convert("0", None, None)
    assert Duration(positive=False).convert("0", None, None) == 0.0
    with pytest.raises(click.BadParameter, match="whole number"):
        Duration(whole_seconds=True).convert("1.5", None, None)


@pytest.mark.parametrize("seconds", [1, 59, 60, 90, 3600, 5400, 86400 + 61])
def test_format_seconds_round_trips(seconds: int) -> None:
    assert parse_duration(format_seconds(seconds)) == seconds


def test_byte_size() -> None:
    size = ByteSize(10_000)
    assert size.convert("50000", None, None) == 50_000
    assert size.convert("48k", None, None) == 48 * 1024
    assert size.convert("1M", None, None) == 1024 * 1024
    with pytest.raises(click.BadParameter, match="minimum"):
        size.convert("9999", None, None)
    with pytest.raises(click.BadParameter, match="not a size"):
        size.convert("lots", None, None)


def test_time_of_day() -> None:
    assert TimeOfDay().convert("18:30", None, None).isoformat() == "18:30:00"
    with pytest.raises(click.BadParameter, match="time of day"):
        TimeOfDay().convert("half past six", None, None)
    with pytest.raises(click.BadParameter, match="time zone"):
        TimeOfDay().convert("18:30+02:00", None, None)
    assert TimeOfDay().convert("7:05", None, None).isoformat() == "07:05:00"
    assert TimeOfDay().convert("18:30:15", None, None).isoformat() == "18:30:15"
    for text in ("18.30", "18", "1830", "T18:30", "18:30:00.5", "24:00", "18:60", "\u0661\u0668:30"):
        with pytest.raises(click.BadParameter, match="not a time of day"):
            TimeOfDay().convert(text, None, None)


def test_durations_and_sizes_have_a_ceiling() -> None:
    with pytest.raises(click.BadParameter, match="longer than the most this takes, 8784h"):
        Duration(whole_seconds=True).convert("99999999999999999999999", None, None)
    with pytest.raises(click.BadParameter, match="not a duration"):
        Duration().convert("9" * 400, None, None)
    assert Duration().convert("8784h", None, None) == 366 * 86400
    with pytest.raises(click.BadParameter, match="above the maximum of 16777216 bytes"):
        ByteSize(10_000, 16 * 1024 * 1024).convert("1g", None, None)


def test_format_moment() -> None:
    assert format_moment(None) == "-"
    assert format_moment(datetime(2024, 5, 1, 18, 30, 2, tzinfo=timezone.utc)) == "2024-05-01 18:30:02Z"
