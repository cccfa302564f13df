"""benchmarks.spark_batches runs both paths and prints one JSON object with
consistent figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_benchmark_prints_one_json_object(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "benchmarks.spark_batches", "--json", "--operations", "20000",
                                "--subscribers", "5", "--sizes", "10000,20000", "--crossover-sizes", "5000",
],
                               cwd=ROOT, env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.strip().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    for field in ("spark_ops_per_s", "agent_ops_per_s", "ratio", "ratio_with_startup", "spark_startup_s",
                  "spark_session_s", "spark_flatness", "agent_flatness", "world_build_s", "files", "bytes",
                  "agent_us_per_op", "agent_one_core_us_per_op", "agent_workers_speedup", "spark_core_us_per_op",
                  "efficiency", "local_scaling", "local_1_job_s"):
        assert figures[field] > 0, field
    assert figures["subscribers"] == 5
    sizes = figures["sizes"]
    assert len(sizes) == 2 and 10_000 <= sizes[0] < sizes[1] == figures["operations"]
    points = {point["operations"]: point for point in figures["points"]}
    assert len(points) == 3 and min(points) >= 5_000 and set(sizes) <= set(points)
    largest = points[figures["operations"]]
    spark_s = largest["spark_export_s"] + largest["spark_job_s"]
    assert abs(figures["spark_ops_per_s"] - figures["operations"] / spark_s) <= 0.01 * figures["spark_ops_per_s"]
    assert abs(figures["agent_ops_per_s"] - figures["operations"] / largest["agent_s"]) \
        <= 0.01 * figures["agent_ops_per_s"]
    assert abs(figures["ratio"] - figures["spark_ops_per_s"] / figures["agent_ops_per_s"]) < 0.01
    assert figures["ratio_with_startup"] < figures["ratio"]
    # Point times are rounded to milliseconds: compare within 1%.
    spark_us = [(points[end]["spark_export_s"] + points[end]["spark_job_s"]) / end * 1e6 for end in sizes]
    agent_us = [points[end]["agent_s"] / end * 1e6 for end in sizes]
    assert figures["spark_us_per_op_by_size"] == pytest.approx(spark_us, rel=1e-2)
    assert figures["agent_us_per_op_by_size"] == pytest.approx(agent_us, rel=1e-2)
    # The agent on as many packing workers as local[2] has cores, and in one process.
    assert figures["cores"] == figures["agent_workers"] == 2
    assert isinstance(figures["agent_workers_startup_s"], float)
    assert figures["agent_us_per_op"] == pytest.approx(agent_us[-1], rel=1e-2)
    one_core_us = largest["agent_one_core_s"] / figures["operations"] * 1e6
    assert figures["agent_one_core_us_per_op"] == pytest.approx(one_core_us, rel=1e-2)
    assert figures["agent_workers_speedup"] == pytest.approx(largest["agent_one_core_s"] / largest["agent_s"],
                                                             rel=1e-2)
    # Efficiency: the agent's one core against Spark's, the export on one core, the job on local[2]'s two.
    core_us = (largest["spark_export_s"] + 2 * largest["spark_job_s"]) / figures["operations"] * 1e6
    assert figures["spark_core_us_per_op"] == pytest.approx(core_us, rel=1e-2)
    # Efficiencies are rounded to 3 decimals: at the small sizes here (0.05) a step is 2%, so within one step too.
    assert figures["efficiency"] == pytest.approx(one_core_us / core_us, rel=1e-2, abs=1e-3)
    assert figures["efficiency_by_size"] == pytest.approx(
        [points[end]["agent_one_core_s"] / (points[end]["spark_export_s"] + 2 * points[end]["spark_job_s"])
         for end in sizes], rel=1e-2, abs=1e-3)
    assert 0 < figures["master_job_s"] <= largest["spark_job_s"]
    assert figures["local_scaling"] == pytest.approx(figures["local_1_job_s"] / figures["master_job_s"], rel=1e-2)
    assert len(figures["load_average"]) == 3
    assert figures["spark_flatness"] == pytest.approx(max(spark_us) / min(spark_us), rel=1e-2)
    assert (figures["files"], figures["bytes"]) == (largest["files"], largest["bytes"])
    if figures["crossover_operations"] is None:
        assert "never" in figures["crossover_method"]
    else:
        assert figures["crossover_operations"] >= 0
        assert figures["crossover_backlog"] == 5 * figures["crossover_operations"]
    assert not list(tmp_path.glob("fieldsync-spark-batches-*")), "the world and outputs are deleted"
