"""benchmarks.codec runs and prints one JSON object with the four ratios
(operations and runs, encode and decode) beside their figures."""

import json
import subprocess
import sys


def test_benchmark_prints_the_four_ratios_with_their_baselines():
    completed = subprocess.run([sys.executable, "-m", "benchmarks.codec", "--json", "--operations", "2000",
                                "--rounds", "1"], capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(completed.stdout)
    assert result["operations"] == 2000 and result["messages"] >= 1
    for prefix in ("", "runs_"):
        for step in ("encode", "decode"):
            measured = result[f"{prefix}{step}_ops_per_s"]
            baseline = result[f"{prefix}baseline_{step}_ops_per_s"]
            assert measured > 0 and baseline > 0
            assert abs(result[f"{prefix}{step}_ratio"] - measured / baseline) < 0.01
    assert result["target_ratio"] == 0.9
