"""benchmarks.e2e --unscanned on a small backlog: the whole backlog arrives,
and the JSON has the figures docs/testing.md names."""

import json

from benchmarks import e2e


def test_unscanned_backlog_replicates_and_reports_peak_rss(capsys) -> None:
    assert e2e.main(["--json", "--unscanned", "--unscanned-ops", "3000"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mode"] == "unscanned" and result["operations"] == 3000
    assert result["application_transactions"] == 6 and result["messages"] >= 1
    for key in ("peak_rss_mb_sender", "peak_rss_mb_receiver", "peak_rss_mb_idle"):
        # The agent's own peak, not its launcher's parent's (this test process).
        assert 10 < result[key] < 1000, key
    assert set(result["seconds"]) == {"write", "send", "receive_apply", "confirm"}


def test_the_ratio_run_reports_the_raw_baseline_and_the_physical_floor(capsys) -> None:
    """The default run, small: its ratio against raw executemany, and
    against the least work both ends must do (floor_ratio), each measured
    in the same run; the floor is no more than the agent's run."""
    assert e2e.main(["--json", "--inserts", "3000", "--updates", "1000", "--backlog", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    seconds = result["seconds"]
    assert result["operations"] == 4000 and seconds["floor"] > 0 and seconds["raw"] > 0
    total = seconds["scan"] + seconds["send"] + seconds["receive_apply"] + seconds["confirm"]
    assert abs(result["floor_ratio"] - seconds["floor"] / total) < 0.01
    assert abs(result["ratio"] - seconds["raw"] / total) < 0.01
    assert 0 < result["floor_ratio"] < 1
