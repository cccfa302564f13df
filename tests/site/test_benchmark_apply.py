"""benchmarks.apply runs and prints one JSON object with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_prints_one_json_object():
    completed = subprocess.run([sys.executable, "-m", "benchmarks.apply", "--json", "--inserts", "2000",
                                "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    lines = completed.stdout.strip().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    for field in ("apply_ops_per_s", "raw_ops_per_s", "apply_ratio", "capture_ratio",
                  "published_insert_rows_per_s", "unpublished_insert_rows_per_s", "raw_unpublished_ops_per_s"):
        assert figures[field] > 0, field
    assert (figures["inserts"], figures["updates"]) == (2000, 1000)
    assert figures["apply_ratio"] == round(figures["apply_ops_per_s"] / figures["raw_ops_per_s"], 3) or \
        abs(figures["apply_ratio"] - figures["apply_ops_per_s"] / figures["raw_ops_per_s"]) < 0.01
