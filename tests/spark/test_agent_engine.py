"""The agent's Spark engine end to end (docs/spark.md, "When the agent uses
it"): real ``spark-submit`` jobs on ``local[2]``, compared file for file with
the agent's own packing.

Every Spark job costs 20-30 s here, so the worlds are built once per module
and each scenario runs on its own copy of ``hq.db`` (a copy without its
agent folder starts with empty queues).  Runs go through ``Agent`` and its
send phase, so the outbound queues are looked at before any transport
takes files away.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pytest

import agent.spark.engine
from agent.admin import site_keys
from agent.cli import main
from agent.errors import UsageError
from agent.keyfiles import copy_site_keys
from agent.runner import Agent, RunOptions, RunReport, agent_directory, run_agent
from agent.site import SiteDatabase
from agent.spark.engine import DEFAULT_TIMEOUT, SparkOptions, run_spark_batch
from agent.spark.errors import SparkBatchCancelled, SparkBatchError
from agent.outbound import BatchSend
from agent.spark.export import export_batch
from agent.spark.take import Sender, take_output
from benchmarks.spark_world import build_world, subscriber_names
from codec.keys import SiteKeys
from codec.names import MessageName
from codec.packing import pack_messages
from tests.spark.launchers import (LAST_LINE, HangingLauncher, group_members, groups_naming, hanging_launcher,
                                   wait_gone)

import pyspark  # noqa: E402,F401 - the Spark extra is part of the test install: fail, never skip

# Module-wide Spark worlds and jobs of minutes: the file starts early under pytest-xdist.
pytestmark = pytest.mark.slow
OPERATIONS = 30_000
SUBSCRIBERS = 6
# Quiet and quick local jobs; the engine adds spark.pyspark.python itself.
CONF = (("spark.ui.enabled", "false"), ("spark.log.level", "WARN"))
FAILING = ("--fail-after-files", "2")
NO_LAUNCHER = "/nonexistent/bin/spark-submit"


@dataclass(frozen=True)
class Sent:
    """What one send phase left behind."""

    report: RunReport
    outbound: dict[str, list[tuple[str, bytes]]]  # peer -> queued (name, bytes), oldest first
    log_sent: dict[str, int]
    logs: list[str]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def send_phase(database: Path, spark: SparkOptions, *, force_controls: bool = True, **options: Any) -> Sent:
    """One send phase (as `agent run --once --send-only` does before it
    flushes), with the fieldsync log lines it wrote; ``options`` go to
    RunOptions."""
    handler = _Lines()
    logger = logging.getLogger("fieldsync")
    saved = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)

    async def run() -> Sent:
        async with Agent(database, RunOptions(receive=False, spark=spark, **options)) as agent:
            await agent.send_phase(force_controls=force_controls)
            outbound = {peer: [(name, agent.queues.read_outbound(peer, name)) for name in agent.queues.outbound(peer)]
                        for peer in agent.peers}
            log_sent = {remote.name: remote.log_sent for remote in agent.db.remotes()}
            return Sent(agent.report, outbound, log_sent, handler.lines)

    try:
        return asyncio.run(run())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def local() -> SparkOptions:
    return SparkOptions(engine="local")


def on_spark(*, engine: str = "spark", threshold: int = 1_000_000, job_args: tuple[str, ...] = ()) -> SparkOptions:
    return SparkOptions(engine=engine, threshold=threshold, master="local[2]", conf=CONF, job_args=job_args)


def job_folders(database: Path) -> list[Path]:
    work = agent_directory(database) / "spark"
    return sorted(work.iterdir()) if work.exists() else []


def assert_same(spark: Sent, reference: Sent) -> None:
    assert spark.log_sent == reference.log_sent
    assert spark.outbound.keys() == reference.outbound.keys()
    for peer, files in reference.outbound.items():
        assert [name for name, _ in spark.outbound[peer]] == [name for name, _ in files], peer
        for (name, data), (_, expected) in zip(spark.outbound[peer], files):
            assert data == expected, f"{peer}: {name} differs"


# -- worlds ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("spark-agent-world")
    build_world(folder, OPERATIONS, SUBSCRIBERS).close()
    return folder / "hq.db"


def copy_site(world: Path, folder: Path) -> Path:
    """A copy of ``hq.db`` with its key file alone (not the rest of its agent
    folder: empty queues)."""
    folder.mkdir()
    shutil.copy(world, folder / "hq.db")
    copy_site_keys(world, folder / "hq.db")
    return folder / "hq.db"


@pytest.fixture(scope="module")
def first_local(world: Path) -> tuple[Path, Sent]:
    database = copy_site(world, world.parent / "local")
    return database, send_phase(database, local())


@pytest.fixture(scope="module")
def first_spark(world: Path) -> tuple[Path, Sent]:
    database = copy_site(world, world.parent / "spark")
    return database, send_phase(database, on_spark())


def prepare_resends(database: Path) -> tuple[int, dict[str, int]]:
    """After a first full send: new rows at hq, and two remotes resending
    from an older confirmation at epoch 1; return the backlog of the next
    send phase and each remote's start."""
    app = sqlite3.connect(database, isolation_level=None)
    try:
        for batch in range(5):
            app.execute("BEGIN")
            app.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                            [(900_000 + batch * 100 + index, f"region{index % SUBSCRIBERS:03d}", index,
                              f"late {batch}", 1.5) for index in range(100)])
            app.execute("UPDATE orders SET qty = qty + 1 WHERE id % 7 = ?", (batch,))
            app.execute("COMMIT")
    finally:
        app.close()
    with SiteDatabase.open(database) as site:
        end = site.scan()
        offsets = [row[0] for row in site.connection.execute(
            "SELECT commit_offset FROM fieldsync_log ORDER BY commit_offset")]
        for name, share in (("field002", 3), ("field005", 2)):
            start = next(offset for offset in offsets if offset >= end // share)
            site.update_remote(name, resend_count=1, confirm_sent=start, log_sent=start)
        starts = {remote.name: remote.log_sent for remote in site.remotes()}
    return sum(end - start for start in starts.values()), starts


@pytest.fixture(scope="module")
def resend_below(first_local: tuple[Path, Sent]) -> tuple[Sent, dict[str, int], int]:
    """The resends with --engine auto one offset below the threshold, and a
    launcher that does not exist: Spark must not even be tried."""
    database, _ = first_local
    backlog, starts = prepare_resends(database)
    spark = SparkOptions(engine="auto", threshold=backlog + 1, submit=NO_LAUNCHER)
    return send_phase(database, spark), starts, backlog


@pytest.fixture(scope="module")
def resend_at(first_spark: tuple[Path, Sent]) -> tuple[Sent, dict[str, int], int]:
    """The same resends with --engine auto exactly at the threshold."""
    database, _ = first_spark
    backlog, starts = prepare_resends(database)
    sent = send_phase(database, on_spark(engine="auto", threshold=backlog))
    assert job_folders(database) == []
    return sent, starts, backlog


# -- scenarios -------------------------------------------------------------------------


def queued_files(sent: Sent) -> int:
    return sum(len(files) for files in sent.outbound.values())


def test_spark_batch_queues_the_agents_own_files(first_local: tuple[Path, Sent],
                                                  first_spark: tuple[Path, Sent]) -> None:
    database, spark = first_spark
    _, reference = first_local
    assert spark.report.spark_batches == 1 and spark.report.ok, spark.report
    assert reference.report.spark_batches == 0
    assert_same(spark, reference)
    assert sorted(spark.outbound) == subscriber_names(SUBSCRIBERS)
    assert all(files for files in spark.outbound.values())
    # Queued, not yet taken by a transport: counted by the files in the queues, not as sent.
    assert queued_files(spark) == queued_files(reference) > SUBSCRIBERS
    assert spark.report.sent == reference.report.sent == 0
    assert set(spark.log_sent.values()) == {max(spark.log_sent.values())} and max(spark.log_sent.values()) > 0
    assert job_folders(database) == []  # the job folder is gone once the files are queued


def test_resends_from_older_confirmations_match(resend_below: tuple[Sent, dict[str, int], int],
                                                resend_at: tuple[Sent, dict[str, int], int]) -> None:
    reference, starts, _ = resend_below
    spark, spark_starts, _ = resend_at
    assert starts == spark_starts and all(start > 0 for start in starts.values())
    assert_same(spark, reference)
    resends = 0
    for name in ("field002", "field005"):
        headers = [MessageName.parse(file).header for file, _ in spark.outbound.get(name, []) if ".d." in file]
        resent = [header for header in headers if header.resend_count == 1]
        # A range that holds nothing for the subscriber is resent as no file at all (rule 5).
        if resent:
            assert resent[0].prev == starts[name] and resent[-1].last == spark.log_sent[name]
            resends += 1
        else:
            assert spark.log_sent[name] == starts[name]
    assert resends


def test_auto_uses_spark_from_the_threshold_on(resend_at: tuple[Sent, dict[str, int], int]) -> None:
    sent, _, backlog = resend_at
    assert sent.report.spark_batches == 1 and sent.report.ok, sent.report
    assert any(f"backlog {backlog} log offsets" in line for line in sent.logs)


def test_auto_below_the_threshold_never_starts_spark(resend_below: tuple[Sent, dict[str, int], int]) -> None:
    sent, _, _ = resend_below
    # A Spark attempt would have failed on the missing launcher and said so.
    assert sent.report.spark_batches == 0 and sent.report.ok, sent.report
    assert not any("Spark" in line for line in sent.logs), sent.logs
    assert queued_files(sent) > 0


def test_auto_on_a_local_master_without_a_threshold_packs_locally(world: Path, tmp_path: Path) -> None:
    """With no --spark-threshold, auto never starts a local Spark job, however
    large the backlog: the agent's own path packs faster here (docs/spark.md).
    The launcher does not exist, so an attempt would be logged."""
    database = copy_site(world, tmp_path / "site")
    sent = send_phase(database, SparkOptions(engine="auto", master="local[*]", submit=NO_LAUNCHER))
    assert sent.report.spark_batches == 0 and sent.report.ok, sent.report
    assert not any("Spark" in line for line in sent.logs), sent.logs
    assert sum(len(files) for files in sent.outbound.values()) >= SUBSCRIBERS
    assert min(sent.log_sent.values()) == max(sent.log_sent.values()) > 0


@pytest.mark.parametrize(("master", "threshold", "backlog", "expected"), [
    ("local[*]", None, 10 ** 12, False),
    ("local", None, 10 ** 12, False),
    ("local-cluster[2,1,1024]", None, 10 ** 12, False),
    ("local[4]", 1_000, 1_000, True),
    ("local[4]", 1_000, 999, False),
    ("spark://127.0.0.1:7077", None, agent.spark.engine.cluster_threshold(8), True),
    ("spark://127.0.0.1:7077", None, agent.spark.engine.cluster_threshold(8) - 1, False),
    ("yarn", 5, 5, True),
    ("k8s://https://127.0.0.1:6443", None, 0, False),
])
def test_auto_threshold_follows_the_master(master: str, threshold: int | None, backlog: int,
                                           expected: bool) -> None:
    spark = SparkOptions(engine="auto", master=master, threshold=threshold)
    assert spark.uses_spark(backlog) is expected
    # the other engines do not look at the threshold
    assert replace(spark, engine="spark").uses_spark(0) is True
    assert replace(spark, engine="local").uses_spark(10 ** 12) is False


def test_the_cluster_threshold_follows_the_formula_and_the_jobs_cores() -> None:
    engine = agent.spark.engine
    gain = engine.AGENT_US_PER_OFFSET - engine.EXPORT_US_PER_OFFSET - engine.JOB_CORE_US_PER_OFFSET / 16
    assert engine.cluster_threshold(16) == math.ceil(engine.STARTUP_S * 1e6 / gain)
    assert engine.cluster_threshold(16) < engine.cluster_threshold(4)
    assert engine.cluster_threshold(1) is None  # one core of Spark never beats the agent's
    master = "spark://127.0.0.1:7077"
    assert SparkOptions(master=master).auto_threshold() == engine.cluster_threshold(engine.DEFAULT_CLUSTER_CORES)
    assert SparkOptions(master=master, conf=(("spark.cores.max", "16"),)).auto_threshold() \
        == engine.cluster_threshold(16)
    assert SparkOptions(master=master, conf=(("spark.executor.instances", "4"), ("spark.executor.cores", "4"))
                        ).auto_threshold() == engine.cluster_threshold(16)


def names_the_failure(text: str) -> bool:
    """Whether ``text`` names the failure ``FAILING`` injects.

    Every pack task fails, two at a time on ``local[2]``, and Spark names the
    first failure it saw: the injected one, or a worker whose connection a
    failing task reset (or whose pipe it broke) as the stage was torn down.
    """
    return "injected failure after 2 files" in text or any(
        f"Python worker: {error}" in text for error in ("ConnectionResetError", "BrokenPipeError"))


def test_failed_job_with_engine_spark_changes_nothing(world: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A relative database path, as `agent run hq.db` gives: the job (which
    # runs in its own folder) must still find the export, or it would fail
    # before the injected failure.
    monkeypatch.chdir(copy_site(world, tmp_path / "failing").parent)
    database = Path("hq.db")
    sent = send_phase(database, on_spark(job_args=FAILING), force_controls=False)
    assert not sent.report.ok and sent.report.spark_batches == 0
    [problem] = sent.report.local_errors
    assert sent.report.transport_errors == []
    assert "\n" not in problem
    assert problem.startswith(f"Spark batch of {SUBSCRIBERS} sends: fieldsync batch job failed:"), problem
    assert names_the_failure(problem), problem
    assert set(sent.log_sent.values()) == {0}
    assert all(not [name for name, _ in files if ".d." in name] for files in sent.outbound.values())
    assert job_folders(database) == []
    # The sends are only put off: the next run sends them.
    again = send_phase(database, local())
    assert again.report.ok and set(again.log_sent.values()) == {max(again.log_sent.values())} != {0}


def test_failed_job_with_engine_auto_falls_back(world: Path, tmp_path: Path, first_local: tuple[Path, Sent]) -> None:
    database = copy_site(world, tmp_path / "falling-back")
    sent = send_phase(database, on_spark(engine="auto", threshold=0, job_args=FAILING))
    assert sent.report.ok and sent.report.spark_batches == 0, sent.report
    assert any("failed, so they are packed here" in line and names_the_failure(line) for line in sent.logs), sent.logs
    assert_same(sent, first_local[1])
    assert job_folders(database) == []


# -- the command line ------------------------------------------------------------------


@pytest.mark.parametrize("arguments, text", [
    (("--engine", "turbo"), "'--engine': 'turbo' is not one of 'local', 'auto', 'spark'"),
    (("--spark-conf", "spark.executor.memory"), "'--spark-conf': 'spark.executor.memory': write KEY=VALUE"),
    (("--spark-conf", "=4g"), "'--spark-conf': '=4g': write KEY=VALUE"),
    (("--spark-threshold", "-5"), "'--spark-threshold'"),
    (("--spark-work", "hdfs://namenode/work"), "'--spark-work': hdfs://namenode/work: the Spark work folder is a "
                                               "folder on this machine"),
    (("--spark-executor-wait", "-1"), "'--spark-executor-wait'"),
])
def test_bad_spark_options_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            arguments: tuple[str, ...], text: str) -> None:
    code = main(["run", str(tmp_path / "hq.db"), "--once", *arguments])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("agent: invalid value for ") and text in lines[0], lines


def test_cluster_deploy_mode_is_refused() -> None:
    with pytest.raises(UsageError, match="client mode"):
        SparkOptions(conf=(("spark.submit.deployMode", "cluster"),))
    SparkOptions(conf=(("spark.submit.deployMode", "client"),))


def test_the_launcher_is_found_without_an_activated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a systemd unit runs the agent: no venv on PATH, no SPARK_HOME, and
    the executors' Python given (which once made the agent drop its own)."""
    engine = agent.spark.engine
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    for name in ("VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    home = engine.spark_home()
    assert home is not None
    command = engine._submit_command(SparkOptions(engine="spark", conf=(("spark.pyspark.python", "/opt/py"),)),
                                     Path("/srv/hq.db.agent/keys/site.key"))
    assert command[0] == str(Path(home) / "bin" / "spark-submit")
    assert "spark.pyspark.python=/opt/py" in command and f"spark.pyspark.driver.python={sys.executable}" in command
    assert command[command.index("--keys") + 1] == "/srv/hq.db.agent/keys/site.key"
    assert command[command.index("--deploy-mode") + 1] == "client"
    env = engine._job_environment()
    assert env["SPARK_HOME"] == home
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable


def test_cli_engine_spark_failure_is_one_line_and_exit_1(world: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    database = copy_site(world, tmp_path / "cli")
    with SiteDatabase.open(database) as site:
        for name in subscriber_names(SUBSCRIBERS):
            (tmp_path / f"{name}-inbox").mkdir()
            site.update_remote(name, address=str(tmp_path / f"{name}-inbox"))
    code = main(["run", str(database), "--once", "--send-only", "--engine", "spark", "--spark-submit", NO_LAUNCHER,
                 "--spark-conf", "spark.ui.enabled=false", "--spark-work", str(tmp_path / "work")])
    err = capsys.readouterr().err
    problems = [line for line in err.splitlines() if line.startswith("agent: local error: ")]
    assert code == 1
    assert problems == [f"agent: local error: Spark batch of {SUBSCRIBERS} sends: the Spark launcher "
                        f"{NO_LAUNCHER} does not exist; check --spark-submit"], err
    with SiteDatabase.open(database) as site:
        assert {remote.log_sent for remote in site.remotes()} == {0}
    # Only the confirmations went out.
    assert all(".d." not in path.name for path in tmp_path.glob("field*-inbox/*"))


# -- take-over checks (docs/spark.md, step 3) ---------------------------------------------
# No Spark here: the output is written with the agent's own packer (which
# the job runs too), then broken one way at a time.


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[BatchSend]]:
    """A small world whose last transaction is too large for one 10,000-byte
    message, so field001 gets a group of parts; and the sends to check:
    field003's resends from the middle of the log, at epoch 2."""
    folder = tmp_path_factory.mktemp("take-world")
    site = build_world(folder, 3_000, 3)
    app = sqlite3.connect(folder / "hq.db", isolation_level=None)
    app.execute("BEGIN")
    app.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                    [(500_000 + index, "region000", index, hashlib.sha256(str(index).encode()).hexdigest(), 1.0)
                     for index in range(2_000)])
    app.execute("COMMIT")
    # And something for field003 after the middle, so its resend makes files.
    app.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", (600_000, "region002", 1, "late", 2.0))
    app.close()
    end = site.scan()
    middle = site.connection.execute("SELECT min(commit_offset) FROM fieldsync_log WHERE commit_offset >= ?",
                                     (end // 2,)).fetchone()[0]
    site.close()
    return folder / "hq.db", [BatchSend("field001", 0, end, 0), BatchSend("field002", 0, end, 0),
                              BatchSend("field003", middle, end, 2)]


def write_output(database: Path, sends: list[BatchSend], output: Path, *, keys: SiteKeys | None = None,
                 incarnation: bytes | None = None) -> Sender:
    """A finished job's output for ``sends``; return who must have made it."""
    with SiteDatabase.open(database) as site:
        own = site_keys(site)
        for send in sends:
            folder = output / "files" / send.subscriber
            folder.mkdir(parents=True)
            files = []
            # As the job does: no file when nothing is selected (docs/protocol.md, rule 5).
            transactions = list(site.read_log(send.subscriber, send.start, send.end))
            for message in pack_messages(transactions, keys=keys or own, recipient=send.subscriber,
                                         incarnation=incarnation or site.identity.incarnation,
                                         resend_count=send.resend_count, start=send.start, max_size=10_000,
                                         end=send.end, seal_to=send.seal_to) if transactions else ():
                (folder / message.name).write_bytes(message.data)
                header = message.header
                files.append({"name": message.name, "resend_count": header.resend_count, "prev": header.prev,
                              "last": header.last, "seq": header.seq, "size": len(message.data),
                              "sha256": hashlib.sha256(message.data).hexdigest()})
            manifest = {"format": 1, "subscriber": send.subscriber, "start": send.start, "end": send.end,
                        "resend_count": send.resend_count, "transactions": len(transactions), "files": files}
            (output / "manifests").mkdir(exist_ok=True)
            (output / "manifests" / f"{send.subscriber}.json").write_text(json.dumps(manifest))
        write_success(output)
        return Sender(site.identity.name, own.public, site.identity.incarnation)


def write_success(output: Path) -> None:
    manifests = [json.loads(path.read_text()) for path in (output / "manifests").iterdir()]
    files = [entry for manifest in manifests for entry in manifest["files"]]
    (output / "_SUCCESS.json").write_text(json.dumps({"format": 1, "subscribers": len(manifests),
                                                      "files": len(files),
                                                      "bytes": sum(entry["size"] for entry in files)}))


def edit_manifest(output: Path, subscriber: str, change: Callable[[dict], object]) -> None:
    path = output / "manifests" / f"{subscriber}.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    write_success(output)


def sealed_to_field003(sends: list[BatchSend]) -> list[BatchSend]:
    seal = SiteKeys.generate("field003").public
    return [replace(send, seal_to=seal) if send.subscriber == "field003" else send for send in sends]


def test_take_returns_the_files_in_queue_order(small: tuple[Path, list[BatchSend]], tmp_path: Path) -> None:
    database, sends = small
    sends = sealed_to_field003(sends)
    end = sends[0].end
    sender = write_output(database, sends, tmp_path)
    taken = take_output(tmp_path, sends, sender)
    assert list(taken) == ["field001", "field002", "field003"]
    for send in sends:
        manifest = json.loads((tmp_path / "manifests" / f"{send.subscriber}.json").read_text())
        assert [file.name for file in taken[send.subscriber]] == [entry["name"] for entry in manifest["files"]]
        assert taken[send.subscriber][-1].header.last == end
    assert max(file.header.seq for file in taken["field001"]) > 1  # a split transaction was checked
    first = taken["field003"][0]
    assert first.header.prev == sends[2].start > 0 and first.read() == first.path.read_bytes()


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _first_file(output: Path, subscriber: str) -> Path:
    return output / "files" / subscriber / json.loads(
        (output / "manifests" / f"{subscriber}.json").read_text())["files"][0]["name"]


def _reseal_manifest(output: Path, subscriber: str) -> None:
    path = _first_file(output, subscriber)
    _flip_last_byte(path)

    def fix(manifest: dict) -> None:
        manifest["files"][0]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()

    edit_manifest(output, subscriber, fix)


def _swap_parts(manifest: dict) -> None:
    files = manifest["files"]
    index = next(index for index, entry in enumerate(files) if entry["seq"] == 1)
    files[index], files[index + 1] = files[index + 1], files[index]


def _rename_first(output: Path) -> None:
    path = _first_file(output, "field002")
    path.rename(path.with_name(path.name.replace("-0000000000.fsm", "-0000000001.fsm")))
    edit_manifest(output, "field002", lambda manifest: manifest["files"][0].update(name=path.name.replace(
        "-0000000000.fsm", "-0000000001.fsm")))


@pytest.mark.parametrize("breaks, writer, fragment", [
    (lambda output: (output / "_SUCCESS.json").unlink(), {}, "has no _SUCCESS.json: the job did not finish"),
    (lambda output: _first_file(output, "field002").unlink(), {}, "subscriber field002, file hq.field002.d."),
    (lambda output: _flip_last_byte(_first_file(output, "field002")), {}, "the manifest lists"),
    (lambda output: _reseal_manifest(output, "field002"), {}, "signature does not verify"),
    (lambda output: edit_manifest(output, "field001", lambda manifest: manifest["files"].pop(1)), {},
     "does not follow offset"),
    # Its only file gone: no file is allowed only when nothing was selected.
    (lambda output: edit_manifest(output, "field003", lambda manifest: manifest["files"].pop()), {},
     "subscriber field003, manifest: 1 transactions selected, 0 files"),
    (lambda output: edit_manifest(output, "field001", lambda manifest: manifest["files"].pop()), {},
     "subscriber field001: the transaction after "),
    (lambda output: edit_manifest(output, "field001", _swap_parts), {}, "is out of sequence (expected seq 1)"),
    (lambda output: edit_manifest(output, "field002", lambda manifest: manifest.update(start=1)), {},
     "subscriber field002, manifest: start is 1, the send's is 0"),
    (_rename_first, {}, "is not the name of its header"),
    (lambda output: None, {"keys": SiteKeys.generate("hq")}, "signature does not verify"),
    (lambda output: None, {"incarnation": bytes(16)}, "made for incarnation 00000000"),
])
def test_take_refuses_a_broken_output(small: tuple[Path, list[BatchSend]], tmp_path: Path,
                                      breaks: Callable[[Path], None], writer: dict, fragment: str) -> None:
    database, sends = small
    sender = write_output(database, sends, tmp_path, **writer)
    breaks(tmp_path)
    with pytest.raises(SparkBatchError) as raised:
        take_output(tmp_path, sends, sender)
    message = str(raised.value)
    assert fragment in message and "\n" not in message, message


def test_take_refuses_plain_files_for_a_sealed_send(small: tuple[Path, list[BatchSend]], tmp_path: Path) -> None:
    database, sends = small
    sender = write_output(database, sends, tmp_path)
    sealed = sealed_to_field003(sends)
    with pytest.raises(SparkBatchError, match=r"subscriber field003, file hq\.field003\.d\..*: the file is not "
                                              r"sealed, the send is"):
        take_output(tmp_path, sealed, sender)


def test_a_job_folder_left_by_a_killed_agent_is_deleted_by_the_next_batch(small: tuple[Path, list[BatchSend]],
                                                                          tmp_path: Path) -> None:
    database, sends = small
    work = tmp_path / "work"
    stale = work / "job-hq.20261121T000000-abc"
    (stale / "export").mkdir(parents=True)
    (stale / "export" / "keys").write_text("secret")
    other_site = work / "job-hq-north.20261121T000000-abc"  # another site sharing the folder
    other_site.mkdir()
    # A launcher that fails at once: the batch fails after its folder was made.
    with SiteDatabase.open(database) as site:
        keys = site_keys(site)
        with pytest.raises(SparkBatchError, match="exit code 1"):
            run_spark_batch(site, keys, sends, max_size=50_000, work=work,
                            options=SparkOptions(engine="spark", submit="/bin/false"))
    assert not stale.exists()
    assert other_site.exists()
    assert [path.name for path in work.iterdir()] == [other_site.name]


# -- a job that hangs, cannot start, or is stopped (docs/spark.md, "A job that hangs") -------
# The launchers of tests/spark/launchers.py hang without a JVM, so these
# take seconds; one test stops a real job stalled in its Python workers.


def hanging(launcher: HangingLauncher, *, engine: str = "spark", timeout: float | None = 2.0,
            cancel: threading.Event | None = None) -> SparkOptions:
    return SparkOptions(engine=engine, threshold=0, master="local[2]", conf=CONF, submit=str(launcher.path),
                        timeout=timeout, cancel=cancel)


def test_a_job_over_its_timeout_is_stopped_with_its_whole_process_group(world: Path, tmp_path: Path) -> None:
    database = copy_site(world, tmp_path / "timeout")
    launcher = hanging_launcher(tmp_path / "bin")
    started = time.monotonic()
    sent = send_phase(database, hanging(launcher), force_controls=False)
    elapsed = time.monotonic() - started
    assert not sent.report.ok and sent.report.spark_batches == 0
    assert sent.report.local_errors == [
        f"Spark batch of {SUBSCRIBERS} sends: the Spark job ran over its 2 s timeout and was stopped "
        f"(its last line: {LAST_LINE}); give it longer with --spark-timeout (0: no limit)"]
    # The launcher died of SIGTERM; its child, which ignores SIGTERM, of the
    # SIGKILL sent to the group: no grace period was waited out.
    assert wait_gone(list(launcher.wait_started())) == []
    assert elapsed < 2 + 8, elapsed
    assert set(sent.log_sent.values()) == {0}
    assert all(not [name for name, _ in files if ".d." in name] for files in sent.outbound.values())
    assert job_folders(database) == []


def test_a_job_over_its_timeout_with_engine_auto_falls_back(world: Path, tmp_path: Path,
                                                            first_local: tuple[Path, Sent]) -> None:
    database = copy_site(world, tmp_path / "timeout-auto")
    launcher = hanging_launcher(tmp_path / "bin")
    sent = send_phase(database, hanging(launcher, engine="auto"))
    assert sent.report.ok and sent.report.spark_batches == 0, sent.report
    assert any("failed, so they are packed here: the Spark job ran over its 2 s timeout" in line
               for line in sent.logs), sent.logs
    assert_same(sent, first_local[1])
    assert wait_gone(list(launcher.wait_started())) == []
    assert job_folders(database) == []


@pytest.mark.parametrize("engine", ["spark", "auto"])
def test_setting_the_cancel_event_stops_the_job_and_leaves_the_sends(world: Path, tmp_path: Path,
                                                                     engine: str) -> None:
    """The agent is stopping: the sends are left for the next run, neither
    reported as a failure nor (under auto) packed here instead."""
    database = copy_site(world, tmp_path / f"cancelled-{engine}")
    launcher = hanging_launcher(tmp_path / "bin")
    cancel = threading.Event()
    pids: list[int] = []

    def cancel_once_started() -> None:
        pids.extend(launcher.wait_started())
        cancel.set()

    canceller = threading.Thread(target=cancel_once_started, daemon=True)
    canceller.start()
    sent = send_phase(database, hanging(launcher, engine=engine, timeout=None, cancel=cancel), force_controls=False)
    canceller.join()
    assert sent.report.ok, sent.report
    assert f"the Spark batch of {SUBSCRIBERS} sends was stopped; they are left for the next run" in sent.logs
    assert not any("packed here" in line for line in sent.logs), sent.logs
    assert len(pids) == 2 and wait_gone(pids) == []
    assert set(sent.log_sent.values()) == {0}
    assert all(not [name for name, _ in files if ".d." in name] for files in sent.outbound.values())
    assert job_folders(database) == []


def test_cancelling_the_agents_task_stops_the_job(world: Path, tmp_path: Path) -> None:
    """A task running the send phase is cancelled (an application stopping
    its agent): the job in the worker thread is stopped too, at once, not
    left to run out its timeout."""
    database = copy_site(world, tmp_path / "task-cancelled")
    launcher = hanging_launcher(tmp_path / "bin")

    jobs: list[tuple[int, int]] = []

    async def run() -> None:
        async with Agent(database, RunOptions(receive=False, spark=hanging(launcher, timeout=120))) as agent:
            # Twice with the same agent: a cancelled task stops its own job,
            # and the next send phase starts a job of its own again.
            for _ in range(2):
                launcher.pid_file.unlink(missing_ok=True)
                task = asyncio.create_task(agent.send_phase(force_controls=False))
                jobs.append(await asyncio.to_thread(launcher.wait_started))
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert await asyncio.to_thread(wait_gone, list(jobs[-1]), 30.0) == []

    started = time.monotonic()
    asyncio.run(run())  # waits for the worker thread, so for the job to be stopped
    assert time.monotonic() - started < 60
    assert len(set(jobs)) == 2
    assert wait_gone([pid for job in jobs for pid in job]) == []
    assert job_folders(database) == []
    with SiteDatabase.open(database) as site:
        assert {remote.log_sent for remote in site.remotes()} == {0}


def test_a_signal_in_continuous_mode_stops_the_job_and_the_agent(world: Path, tmp_path: Path) -> None:
    """`agent run` without --once: SIGTERM stops a running Spark job at once
    and the agent after the step it is in, as a clean stop."""
    database = copy_site(world, tmp_path / "continuous")
    launcher = hanging_launcher(tmp_path / "bin")
    options = RunOptions(receive=False, send_delay=3600, spark=hanging(launcher, timeout=120))

    def terminate_once_started() -> None:
        launcher.wait_started()
        os.kill(os.getpid(), signal.SIGTERM)

    terminator = threading.Thread(target=terminate_once_started, daemon=True)
    terminator.start()
    started = time.monotonic()
    report = asyncio.run(run_agent(database, options, once=False))
    terminator.join()
    assert time.monotonic() - started < 60
    # (The confirmations it flushed on the way out found no inbox folders.)
    assert report.sent == 0 and report.spark_batches == 0 and not report.stopped_streams, report
    assert all(problem.startswith("sending to field") for problem in report.transport_errors), report
    assert not report.local_errors, report  # a job stopped because the agent stops is no failure
    assert wait_gone(list(launcher.wait_started())) == []
    assert job_folders(database) == []
    # The handlers are gone with the agent: SIGTERM has its default action again.
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)


def test_an_interrupt_in_the_waiting_thread_stops_the_job(small: tuple[Path, list[BatchSend]],
                                                          tmp_path: Path) -> None:
    """Run in the main thread, as a script would: Ctrl-C there stops the
    job before the KeyboardInterrupt goes on."""
    database, sends = small
    launcher = hanging_launcher(tmp_path / "bin")
    work = tmp_path / "work"

    def interrupt_once_started() -> None:
        launcher.wait_started()
        os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_started, daemon=True)
    with SiteDatabase.open(database) as site:
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            run_spark_batch(site, site_keys(site), sends, max_size=50_000, work=work,
                            options=hanging(launcher, timeout=60))
    interrupter.join()
    assert wait_gone(list(launcher.wait_started())) == []
    assert list(work.iterdir()) == []


def test_a_cancel_during_the_export_stops_it_there(small: tuple[Path, list[BatchSend]], tmp_path: Path) -> None:
    """The export of a large backlog takes a while: a cancel is seen after
    each row group written, and nothing after it runs."""
    database, sends = small
    launcher = hanging_launcher(tmp_path / "bin")
    work = tmp_path / "work"
    groups: list[int] = []

    def stop_at_the_second_group() -> None:
        groups.append(len(groups) + 1)
        if len(groups) == 2:
            raise SparkBatchCancelled("stopped in the export")

    with SiteDatabase.open(database) as site:
        with pytest.raises(SparkBatchCancelled, match="stopped in the export"):
            export_batch(site, sends, work / "export", max_size=50_000, rows_per_group=500,
                         check_stop=stop_at_the_second_group)
        assert groups == [1, 2]
        assert not (work / "export" / "job.json").exists()  # an export without it is incomplete
        # Through the engine: the event set while the export runs stops it
        # there; the job is never started and the folder is gone.
        cancel = threading.Event()
        options = hanging(launcher, cancel=cancel)
        calls = 0
        check = agent.spark.engine._check_cancel

        def set_in_the_export(checked: tuple[threading.Event, ...]) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:  # the first check inside the export, which has not finished
                [export] = (work / "engine").glob("job-hq.*/export")
                assert (export / "log").is_dir() and not (export / "job.json").exists()
                cancel.set()
            check(checked)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(agent.spark.engine, "_check_cancel", set_in_the_export)
            with pytest.raises(SparkBatchCancelled, match="cancelled because the agent is stopping"):
                run_spark_batch(site, site_keys(site), sends, max_size=50_000, work=work / "engine", options=options)
    assert calls == 2
    assert not launcher.pid_file.exists()
    assert list((work / "engine").iterdir()) == []


def test_a_cancel_event_set_before_the_batch_starts_nothing(small: tuple[Path, list[BatchSend]],
                                                             tmp_path: Path) -> None:
    database, sends = small
    launcher = hanging_launcher(tmp_path / "bin")
    cancel = threading.Event()
    cancel.set()
    with SiteDatabase.open(database) as site:
        with pytest.raises(SparkBatchCancelled, match="cancelled because the agent is stopping"):
            run_spark_batch(site, site_keys(site), sends, max_size=50_000, work=tmp_path / "work",
                            options=hanging(launcher, cancel=cancel))
    assert not launcher.pid_file.exists()
    assert not (tmp_path / "work").exists()


def test_cancelling_a_real_job_stops_the_jvm_and_its_python_workers(small: tuple[Path, list[BatchSend]],
                                                                    tmp_path: Path) -> None:
    database, sends = small
    work = tmp_path / "work"
    cancel = threading.Event()
    options = SparkOptions(engine="spark", master="local[2]", conf=CONF, job_args=("--stall-seconds", "600"),
                           cancel=cancel)
    raised: list[BaseException] = []

    def batch() -> None:  # as the runner calls it: in a worker thread
        with SiteDatabase.open(database) as site:
            try:
                run_spark_batch(site, site_keys(site), sends, max_size=50_000, work=work, options=options)
            except BaseException as error:
                raised.append(error)

    runner = threading.Thread(target=batch)
    runner.start()
    try:
        deadline = time.monotonic() + 240
        while not (stalled := sorted(work.glob("job-hq.*/output/_stalled/*"))):
            assert runner.is_alive(), raised
            assert time.monotonic() < deadline, "no route task of the job started"
            time.sleep(0.2)
        [folder] = work.glob("job-hq.*")
        # The JVM (spark-submit) and the job's Python driver name the job
        # folder on their command lines, and share the group spark-submit leads.
        [group] = groups_naming(os.fspath(folder))
        members = group_members(group)
        workers = [int(path.name) for path in stalled]
        assert group in members and len(members) >= 2 and not set(workers) & set(members)
    finally:
        cancel.set()
        stopping = time.monotonic()
        runner.join(60)
    assert not runner.is_alive()
    assert time.monotonic() - stopping < 20
    [error] = raised
    assert isinstance(error, SparkBatchCancelled), error
    # The workers are in pyspark's own process group: they go when the JVM
    # that feeds them does.
    assert wait_gone(members + workers, within=20) == []
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("launcher, message", [
    (lambda folder: NO_LAUNCHER, f"the Spark launcher {NO_LAUNCHER} does not exist; check --spark-submit"),
    (lambda folder: "fieldsync-no-such-spark-submit",
     "the Spark launcher fieldsync-no-such-spark-submit was not found on PATH; give its path with --spark-submit"),
    (lambda folder: _write(folder / "not-executable", "#!/bin/sh\nexit 0\n", 0o644),
     "the Spark launcher {path} cannot be run (it is not an executable file); check --spark-submit"),
    (lambda folder: os.fspath(folder),
     "the Spark launcher {path} cannot be run (it is not an executable file); check --spark-submit"),
    (lambda folder: _write(folder / "no-interpreter", "#!/nonexistent/bin/sh\nexit 0\n", 0o755),
     "cannot start the Spark launcher {path}: the interpreter its first line (#!) names does not exist; "
     "check --spark-submit"),
    (lambda folder: _write(folder / "not-a-program", "\x7fELF but not really\n", 0o755),
     "cannot start the Spark launcher {path}: Exec format error; check --spark-submit"),
])
def test_a_launcher_that_cannot_start_is_one_line(small: tuple[Path, list[BatchSend]], tmp_path: Path,
                                                  launcher: Callable[[Path], str], message: str) -> None:
    database, sends = small
    path = launcher(tmp_path)
    work = tmp_path / "work"
    with SiteDatabase.open(database) as site:
        with pytest.raises(SparkBatchError) as raised:
            run_spark_batch(site, site_keys(site), sends, max_size=50_000, work=work,
                            options=SparkOptions(engine="spark", submit=path))
    assert str(raised.value) == message.format(path=path)
    assert not work.exists() or list(work.iterdir()) == []


def _write(path: Path, text: str, mode: int) -> str:
    path.write_text(text)
    path.chmod(mode)
    return os.fspath(path)


def test_a_relative_launcher_path_is_run_from_the_agents_folder(small: tuple[Path, list[BatchSend]],
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The job runs in its job folder: the path must not be looked up there.
    database, sends = small
    (tmp_path / "bin").mkdir()
    _write(tmp_path / "bin" / "spark-submit", "#!/bin/sh\necho 'the launcher ran'\nexit 3\n", 0o755)
    monkeypatch.chdir(tmp_path)
    with SiteDatabase.open(database) as site:
        with pytest.raises(SparkBatchError) as raised:
            run_spark_batch(site, site_keys(site), sends, max_size=50_000, work=tmp_path / "work",
                            options=SparkOptions(engine="spark", submit="bin/spark-submit"))
    assert str(raised.value) == "the Spark job failed (exit code 3): the launcher ran"


@pytest.mark.parametrize("timeout", [0, -1, 0.0, float("nan"), float("inf"), True, "60"])
def test_bad_timeouts_are_refused(timeout: object) -> None:
    with pytest.raises(UsageError, match="the Spark timeout must be a number of seconds > 0, or none"):
        SparkOptions(timeout=timeout)  # type: ignore[arg-type]


def test_no_timeout_and_fractions_are_accepted() -> None:
    assert SparkOptions(timeout=None).timeout is None
    assert SparkOptions(timeout=0.5).timeout == 0.5
    assert SparkOptions().timeout == DEFAULT_TIMEOUT == 3600
    # The event is not part of the options' value.
    assert SparkOptions(cancel=threading.Event()) == SparkOptions()
