"""benchmarks.postgres at a tiny size: it starts and stops its own
PostgreSQL cluster, prints one JSON object with every figure docs/postgres.md
("Performance") names, and each figure is measured (positive); a fleet's
idle run writes no file and a run after one change writes that remote's
only.  The targets are not checked: the machine is shared."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

RATIOS = ("capture_ratio", "apply_ratio", "e2e_ratio")
POSITIVE = (*RATIOS, "capture_published_rows_per_s", "capture_unpublished_rows_per_s", "apply_ops_per_s",
            "apply_raw_ops_per_s", "apply_raw_unpublished_ops_per_s", "e2e_ops_per_s", "e2e_raw_sqlite_ops_per_s",
            "fleet_idle_s", "fleet_one_change_s", "fleet_bulk_add_s", "fleet_sqlite_idle_s",
            "fleet_sqlite_one_change_s")


def test_benchmark_prints_one_json_object_with_its_figures_and_leaves_no_cluster() -> None:
    # The benchmark's temporary folders go here (the cluster's too, which
    # its system user must reach when the tests run as root: not under
    # pytest's 0700 tmp_path).
    scratch = Path(tempfile.mkdtemp(prefix="fieldsync-bench-test-"))
    scratch.chmod(0o755)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.postgres", "--json", "--capture-rows", "2000", "--apply-operations",
             "2000", "--e2e-operations", "2000", "--remotes", "12", "--repeat", "2"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(scratch)})
        left = list(scratch.iterdir())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.strip().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    for key in POSITIVE:
        assert figures[key] > 0, key
    assert (figures["capture_rows"], figures["apply_operations"], figures["e2e_operations"],
            figures["fleet_remotes"]) == (2000, 2000, 2000, 12)
    assert figures["apply_inserts"] + figures["apply_updates"] + figures["apply_deletes"] == 2000
    assert min(figures["apply_updates"], figures["apply_deletes"]) > 0
    assert figures["fleet_idle_files"] == figures["fleet_sqlite_idle_files"] == 0
    assert figures["fleet_one_change_files"] == figures["fleet_sqlite_one_change_files"] == 1
    for key in ("capture_published_runs_s", "apply_runs_s", "e2e_runs_s", "fleet_idle_runs_s",
                "fleet_one_change_runs_s"):
        assert len(figures[key]) == 2, key
    assert set(figures["e2e_seconds"]) == {"send", "receive_apply", "confirm", "raw"}
    assert set(RATIOS) <= set(figures["targets"])
    # The cluster was stopped and its folder removed, as was the benchmark's own.
    assert left == []
