"""benchmarks.codec runs and prints one JSON object with the four ratios
(operations and runs, encode and decode) beside their figures, and the
runs' against msgspec, the codec's own library."""

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
    for step in ("encode", "decode"):  # the same against the codec's own msgpack library
        measured, baseline = result[f"runs_{step}_ops_per_s"], result[f"msgspec_runs_baseline_{step}_ops_per_s"]
        assert baseline > 0 and abs(result[f"msgspec_runs_{step}_ratio"] - measured / baseline) < 0.01
    assert result["target_ratio"] == 0.9
