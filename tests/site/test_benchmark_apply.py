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
    for field in ("apply_ops_per_s", "raw_ops_per_s", "apply_ratio", "apply_operations_ratio", "capture_ratio",
                  "published_insert_rows_per_s", "unpublished_insert_rows_per_s", "raw_unpublished_ops_per_s"):
        assert figures[field] > 0, field
    assert (figures["inserts"], figures["updates"]) == (2000, 1000)
    assert figures["apply_ratio"] == round(figures["apply_ops_per_s"] / figures["raw_ops_per_s"], 3) or \
        abs(figures["apply_ratio"] - figures["apply_ops_per_s"] / figures["raw_ops_per_s"]) < 0.01


def test_benchmark_measures_the_unconfirmed_rule_against_its_baselines():
    completed = subprocess.run([sys.executable, "-m", "benchmarks.apply", "--json", "--inserts", "2000",
                                "--rounds", "1", "--unconfirmed", "20000", "--batches", "2"],
                               cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    figures = json.loads(completed.stdout)
    assert figures["unconfirmed_offsets"] >= 20000 and figures["unconfirmed_batches"] == 2
    for field in ("unconfirmed_long_batch_ms", "unconfirmed_small_batch_ms", "unconfirmed_none_batch_ms"):
        assert figures[field] > 0, field
    assert abs(figures["unconfirmed_flatness"]
               - figures["unconfirmed_long_batch_ms"] / figures["unconfirmed_none_batch_ms"]) < 0.01
    assert figures["targets"]["unconfirmed_flatness"] == 1.5
