"""benchmarks.follow runs and prints one JSON object: the chain and the
column layout select the same operations, each with its cost."""

import json
import subprocess
import sys


def test_benchmark_prints_both_layouts_and_their_ratio():
    completed = subprocess.run([sys.executable, "-m", "benchmarks.follow", "--json", "--operations", "2000",
                                "--subscribers", "20", "--rounds", "1"], capture_output=True, text=True,
                               timeout=300, check=True)
    result = json.loads(completed.stdout)
    assert result["operations"] == 2000 and result["subscribers"] == 20
    assert result["selected_operations"] >= 2000  # moves add a DELETE and an INSERT per row moved
    assert result["follow_us_per_op"] > 0 and result["column_us_per_op"] > 0
    assert abs(result["ratio"] - result["column_us_per_op"] / result["follow_us_per_op"]) < 0.02
