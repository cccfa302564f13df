"""benchmarks.hostile_inbox runs and prints one JSON object with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_prints_one_json_object_and_the_bounds_hold():
    completed = subprocess.run([sys.executable, "-m", "benchmarks.hostile_inbox", "--json", "--rounds", "1",
                                "--junk-files", "1500"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                               check=True)
    lines = completed.stdout.strip().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    assert figures["junk_files"] == 1500
    for field in ("junk_run_s", "junk_baseline_read_and_delete_s", "junk_peak_rss_mb", "oversize_peak_rss_mb",
                  "oversize_baseline_idle_rss_mb"):
        assert figures[field] > 0, field
    assert abs(figures["junk_ratio"] - figures["junk_run_s"] / figures["junk_baseline_read_and_delete_s"]) < 0.1
    # Every junk file left the inbox, and the quarantine kept its cap (1,000 a peer).
    assert figures["junk_left_in_inbox"] == 0
    assert figures["quarantine_files_kept"] == 1000
    # The 200 MB file was never read.
    assert figures["oversize_peak_rss_mb"] < 100, figures
