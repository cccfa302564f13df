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
