"""The job on a standalone Spark cluster (a master and a worker started on
127.0.0.1), submitted the way docs/spark.md shows, with the export and the
output on storage both the driver and the executors reach."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.admin import site_keys
from agent.outbound import BatchSend
from agent.spark.export import export_batch
from benchmarks.spark_world import build_world, subscriber_names
from tests.transports.servers import free_port

from .test_job import agent_files, job_files

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()


def wait_for(path: Path, text: str, process: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    pytest.fail(f"{path.name}: no '{text}' within {timeout:.0f} s:\n{path.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """spark://127.0.0.1:PORT with one worker of 2 cores."""
    directory = tmp_path_factory.mktemp("cluster")
    env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    processes = []
    try:
        master_log = directory / "master.log"
        processes.append(subprocess.Popen(
            [str(BIN / "spark-class"), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            env=env, stdout=master_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(master_log, "I have been elected leader", processes[0])
        worker_log = directory / "worker.log"
        processes.append(subprocess.Popen(
            [str(BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
             "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
             "--work-dir", str(directory / "work")],
            env=env, stdout=worker_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(worker_log, "Successfully registered with master", processes[1])
        yield url
    finally:
        for process in reversed(processes):
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_the_job_runs_unchanged_on_a_standalone_cluster(cluster, tmp_path):
    site = build_world(tmp_path, 30_000, 6, seed=9)
    end = site.log_end()
    sends = [BatchSend(name, 0, end, 0) for name in subscriber_names(6)]
    shared = tmp_path / "shared"  # what would be an NFS or object-store path on a real cluster
    export_batch(site, site_keys(site), sends, shared / "export", max_size=50_000)
    completed = subprocess.run(
        [str(BIN / "spark-submit"), "--master", cluster, "--executor-memory", "1g",
         "--conf", "spark.ui.enabled=false",
         str(ROOT / "contrib" / "spark" / "job.py"), str(shared / "export"), str(shared / "out")],
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable), cwd=ROOT, capture_output=True, text=True,
        timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads(completed.stdout.strip().splitlines()[-1])
    total = 0
    for send in sends:
        expected = agent_files(site, send)
        assert job_files(shared / "out", send.subscriber) == expected
        total += len(expected)
    assert summary == {"format": 1, "subscribers": 6, "files": total,
                       "bytes": sum(p.stat().st_size for p in (shared / "out" / "files").rglob("*") if p.is_file())}
    # The work ran on the cluster's executor, not in the driver.
    assert "Executor added" in completed.stderr or "Granted executor" in completed.stderr
    site.close()
