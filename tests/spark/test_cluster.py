"""`agent run --spark-master spark://...` on a standalone Spark cluster (a
master and a worker started on 127.0.0.1), as an operator runs it: the
agent started by its full path without an activated virtual environment
(as the systemd units run it), the worker running as another OS user that
cannot read the agent's work folder, nothing shared between them but what
Spark carries (docs/spark.md, "On a cluster").

The worker's user cannot enter /root, where this Python lives: its
executors run the system's Python 3 with the agent's packages on
PYTHONPATH (``spark.pyspark.python``, ``spark.executorEnv.PYTHONPATH``),
as a cluster's own Python with fieldsync installed would.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from agent.keyfiles import key_path
from agent.site import SiteDatabase
from agent.spark.engine import spark_home
from benchmarks.spark_world import build_world, subscriber_names
from codec.keys import SiteKeys
from tests.sysusers import system_user
from tests.transports.servers import free_port

# Module-wide Spark worlds and jobs of minutes: the file starts early under pytest-xdist.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(sys.executable).parent / "agent"
WORKER_USER = "fieldsync-worker"
SYSTEM_PYTHON = "/usr/bin/python3"
SUBSCRIBERS = 6


def wait_for(path: Path, text: str, process: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    pytest.fail(f"{path.name}: no '{text}' within {timeout:.0f} s:\n{path.read_text(errors='replace')[-3000:]}")


def worker_user() -> pwd.struct_passwd:
    """The worker's OS user, made when absent (the tests run as root)."""
    return system_user(WORKER_USER, "--no-create-home", "--shell", "/usr/sbin/nologin")


def _reaches(path: Path, test: str = "-r") -> bool:
    return subprocess.run(["runuser", "-u", WORKER_USER, "--", "test", test, str(path)]).returncode == 0


_WORKER_PATHS: list[tuple[str, str, str]] = []


def worker_paths() -> tuple[str, str, str]:
    """(site-packages, the project folder, SPARK_HOME) as the worker's user
    reaches them: this checkout's own when it can, else a copy readable by
    all (a clone under a 0700 folder such as /root), made once a session."""
    if _WORKER_PATHS:
        return _WORKER_PATHS[0]
    site_packages, home = Path(sysconfig.get_paths()["purelib"]), Path(spark_home() or "")
    if (_reaches(ROOT / "agent" / "__init__.py") and _reaches(site_packages / "msgpack" / "__init__.py")
            and _reaches(home / "bin" / "spark-class", "-x")):
        _WORKER_PATHS.append((str(site_packages), str(ROOT), str(home)))
        return _WORKER_PATHS[0]
    copy = Path(tempfile.mkdtemp(prefix="fieldsync-worker-code-"))
    atexit.register(shutil.rmtree, copy, True)
    os.chmod(copy, 0o755)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(site_packages, copy / "site-packages", symlinks=True, ignore=skip)
    for package in ("agent", "codec", "contrib", "transports"):
        shutil.copytree(ROOT / package, copy / "project" / package, ignore=skip)
    _WORKER_PATHS.append((str(copy / "site-packages"), str(copy / "project"),
                          str(copy / "site-packages" / home.relative_to(site_packages))))
    return _WORKER_PATHS[0]


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(spark://127.0.0.1:PORT, the worker's folder): one worker of 2 cores
    and 2 GB, running as WORKER_USER in a folder of its own."""
    assert os.geteuid() == 0, "the cluster tests start the worker as another user: run them as root"
    user = worker_user()
    directory = tmp_path_factory.mktemp("cluster")
    assert spark_home() is not None
    *_, home = worker_paths()
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1")
    # Outside pytest's 0700 folder: the worker's user must reach it.
    worker_folder = Path(tempfile.mkdtemp(prefix="fieldsync-worker-"))
    os.chown(worker_folder, user.pw_uid, user.pw_gid)
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    processes = []
    try:
        master_log = directory / "master.log"
        processes.append(subprocess.Popen(
            [f"{home}/bin/spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            env=env, stdout=master_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(master_log, "I have been elected leader", processes[0])
        worker_log = directory / "worker.log"
        worker_env = dict(env, HOME=str(worker_folder), SPARK_LOCAL_DIRS=str(worker_folder / "local"),
                          SPARK_LOG_DIR=str(worker_folder / "logs"))
        processes.append(subprocess.Popen(
            ["runuser", "-u", WORKER_USER, "--", f"{home}/bin/spark-class", "org.apache.spark.deploy.worker.Worker",
             url, "--host", "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
             "--work-dir", str(worker_folder / "work")],
            env=worker_env, stdout=worker_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(worker_log, "Successfully registered with master", processes[1])
        yield url, worker_folder
    finally:
        for process in reversed(processes):
            stop(process)
        shutil.rmtree(worker_folder, ignore_errors=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cluster-world")
    build_world(folder, 20_000, SUBSCRIBERS, seed=9).close()
    return folder / "hq.db"


def copy_site(world: Path, folder: Path) -> Path:
    """A copy of the site with its key file, its remotes addressed to
    inbox folders of their own."""
    folder.mkdir()
    shutil.copy(world, folder / "hq.db")
    key = key_path(folder / "hq.db")
    key.parent.mkdir(parents=True, mode=0o700)
    shutil.copy(key_path(world), key)
    with SiteDatabase.open(folder / "hq.db") as site:
        for name in subscriber_names(SUBSCRIBERS):
            (folder / f"{name}-inbox").mkdir()
            site.update_remote(name, address=str(folder / f"{name}-inbox"))
    return folder / "hq.db"


def agent_run(database: Path, *options: str) -> subprocess.CompletedProcess:
    """`agent run --once --send-only` by its full path, without an activated
    virtual environment: a PATH of the system's folders only."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    return subprocess.run([str(AGENT), "run", str(database), "--once", "--send-only", *options],
                          env=env, cwd=database.parent, capture_output=True, text=True, timeout=600)


def sent_files(database: Path) -> dict[str, str]:
    """SHA-256 by ``inbox/name`` of every data message delivered."""
    return {f"{path.parent.name}/{path.name}": hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(database.parent.glob("field*-inbox/*")) if ".d." in path.name}


def log_sent(database: Path) -> dict[str, int]:
    with SiteDatabase.open(database) as site:
        return {remote.name: remote.log_sent for remote in site.remotes()}


def executor_options(url: str, work: Path) -> list[str]:
    site_packages, root, _ = worker_paths()
    return ["--spark-master", url, "--spark-work", str(work),
            "--spark-conf", f"spark.pyspark.python={SYSTEM_PYTHON}",
            "--spark-conf", f"spark.executorEnv.PYTHONPATH={site_packages}:{root}",
            "--spark-conf", "spark.executor.memory=1g", "--spark-conf", "spark.ui.enabled=false"]


def secrets_of(database: Path) -> list[bytes]:
    """What of the site's key must appear nowhere else: the key file's text,
    each secret line's value, and the raw signing seed."""
    keys = SiteKeys.load(key_path(database))
    text = key_path(database).read_text(encoding="ascii")
    values = [line.split(": ", 1)[1].encode() for line in text.splitlines() if line.startswith(("sign: ", "seal: "))]
    return [text.encode(), keys.secret_seed(), *values]


def files_holding(folder: Path, secrets: list[bytes]) -> list[Path]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(secret in data for secret in secrets):
                found.append(path)
    return found


def test_agent_run_on_a_cluster_queues_the_files_a_local_run_makes(cluster, world, tmp_path):
    url, worker_folder = cluster
    reference = copy_site(world, tmp_path / "local")
    completed = agent_run(reference, "--engine", "local")
    assert completed.returncode == 0, completed.stderr[-3000:]
    expected = sent_files(reference)
    assert len(expected) >= SUBSCRIBERS

    database = copy_site(world, tmp_path / "spark")
    work = tmp_path / "spark-work"  # the agent's own, closed to the worker's user
    work.mkdir(mode=0o700)
    completed = agent_run(database, "--engine", "spark", *executor_options(url, work))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert sent_files(database) == {name: digest for name, digest in expected.items()}
    assert log_sent(database) == log_sent(reference)
    assert set(log_sent(database).values()) != {0}
    # The job ran on the cluster's executor, as the worker's user.
    executors = list((worker_folder / "work").glob("app-*/*"))
    assert executors, "no executor ran on the worker"
    assert all(path.stat().st_uid == pwd.getpwnam(WORKER_USER).pw_uid for path in executors)
    # The site's secret key was written nowhere but its key file.
    secrets = secrets_of(database)
    assert files_holding(work, secrets) == []
    assert files_holding(worker_folder, secrets) == []
    assert [path for path in files_holding(tmp_path, secrets) if path != key_path(database)
            and path != key_path(reference)] == []


def test_a_cluster_that_gives_no_executor_fails_the_job_and_auto_packs_locally(cluster, world, tmp_path):
    url, _ = cluster
    reference = copy_site(world, tmp_path / "local")
    assert agent_run(reference, "--engine", "local").returncode == 0
    database = copy_site(world, tmp_path / "spark")
    work = tmp_path / "spark-work"
    options = executor_options(url, work) + ["--spark-conf", "spark.executor.memory=4g",  # the worker has 2g
                                             "--spark-executor-wait", "5s"]
    started = time.monotonic()
    completed = agent_run(database, "--engine", "auto", "--spark-threshold", "0", *options)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert time.monotonic() - started < 120
    warnings = [line for line in completed.stderr.splitlines() if "no executor within 5 s" in line]
    assert len(warnings) == 1, completed.stderr[-3000:]
    assert "spark.executor.memory" in warnings[0] and "--spark-executor-wait" in warnings[0]
    # Packed by the agent in the same run.
    assert sent_files(database) == sent_files(reference)
    assert log_sent(database) == log_sent(reference)


def test_a_work_folder_uri_is_refused_before_anything_runs(world, tmp_path):
    database = copy_site(world, tmp_path / "site")
    completed = agent_run(database, "--engine", "spark", "--spark-work", "s3a://bucket/work")
    assert completed.returncode == 2
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "s3a://bucket/work" in lines[0] and "local path" in lines[0], completed.stderr
    assert not (database.parent / "s3a:").exists()
    assert set(log_sent(database).values()) == {0}
