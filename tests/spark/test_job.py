"""The Spark job against the agent's own sending path, on real Spark in
local mode: the same log, subscriptions, keys, epoch and size limit must
give the same files, byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent.admin import init_site, site_keys
from agent.keyfiles import key_path
from agent.site import Article, SiteDatabase
from agent.outbound import BatchSend
from agent.spark.export import export_batch
from benchmarks.spark_world import build_world, subscriber_names
from codec.keys import SiteKeys
from codec.ops import Operation, change_of
from codec.packing import pack_messages
from contrib.spark.job import run_job

# Module-wide Spark worlds and jobs of minutes: the file starts early under pytest-xdist.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MAX_SIZE = 50_000


def agent_files(site: SiteDatabase, send: BatchSend, max_size: int = MAX_SIZE, version: int = 2) -> dict[str, str]:
    """sha256 by file name of what the agent's own path makes for ``send``
    (no file when the range holds nothing for the subscriber)."""
    transactions = list(site.read_log(send.subscriber, send.start, send.end))
    if not transactions:
        return {}
    messages = pack_messages(transactions, keys=site_keys(site),
                             recipient=send.subscriber, incarnation=site.identity.incarnation,
                             resend_count=send.resend_count, start=send.start, max_size=max_size, end=send.end,
                             seal_to=send.seal_to, version=version)
    return {message.name: hashlib.sha256(message.data).hexdigest() for message in messages}


def job_files(output: Path, subscriber: str) -> dict[str, str]:
    folder = output / "files" / subscriber
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.iterdir()}


def middle_commit(site: SiteDatabase, fraction: float) -> int:
    """A commit offset about ``fraction`` into the log (a valid start)."""
    end = site.log_end()
    return site.connection.execute("SELECT max(commit_offset) FROM fieldsync_log WHERE commit_offset <= ?",
                                   (int(end * fraction),)).fetchone()[0]


def same_files_as_the_agent(site: SiteDatabase, spark, tmp_path: Path, sends: list[BatchSend]) -> dict[str, set]:
    """Export ``sends``, run the job on them and check that each subscriber
    gets files, the agent's byte for byte; returns the message format
    versions of each subscriber's files."""
    export_batch(site, sends, tmp_path / "export", max_size=MAX_SIZE)
    run_job(spark, tmp_path / "export", tmp_path / "out", keys=site_keys(site))
    versions = {}
    for send in sends:
        expected = agent_files(site, send)
        assert expected and job_files(tmp_path / "out", send.subscriber) == expected, send.subscriber
        versions[send.subscriber] = {(tmp_path / "out" / "files" / send.subscriber / name).read_bytes()[4]
                                     for name in expected}
    return versions


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    directory = tmp_path_factory.mktemp("world")
    site = build_world(directory, 100_000, 20, seed=5)
    yield site
    site.close()


def test_100k_operations_for_20_subscribers_are_byte_identical_to_the_agent(world, spark, tmp_path):
    end = world.log_end()
    assert end >= 100_000
    resend_from = middle_commit(world, 0.4)
    sealed = {name: SiteKeys.generate(name).public for name in subscriber_names(20)[::4]}
    sends = []
    for index, name in enumerate(subscriber_names(20)):
        # Some sends are resends from an old confirm_sent, at a later epoch.
        start, epoch = (resend_from, 3) if index % 3 == 0 else (0, 0)
        sends.append(BatchSend(name, start, end, epoch, sealed.get(name)))
    export = export_batch(world, sends, tmp_path / "export", max_size=MAX_SIZE)
    assert export.rows == end and export.range == (0, end)
    # The export, which executors read, holds nothing of the site's key.
    secret = site_keys(world).secret_seed()
    key_text = site_keys(world).to_text().encode()
    exported = [path for path in (tmp_path / "export").rglob("*") if path.is_file()]
    assert exported and not [path for path in exported if secret in path.read_bytes() or key_text in path.read_bytes()]
    summary = run_job(spark, tmp_path / "export", tmp_path / "out", keys=site_keys(world))

    total = 0
    for send in sends:
        expected = agent_files(world, send)
        assert expected, send.subscriber
        assert job_files(tmp_path / "out", send.subscriber) == expected, send.subscriber
        manifest = json.loads((tmp_path / "out" / "manifests" / f"{send.subscriber}.json").read_text())
        assert [entry["name"] for entry in manifest["files"]] == sorted(expected, key=lambda n: n.split(".")[3])
        assert {entry["name"]: entry["sha256"] for entry in manifest["files"]} == expected
        assert (manifest["start"], manifest["end"], manifest["resend_count"]) == (send.start, end, send.resend_count)
        assert manifest["files"][0]["prev"] == send.start and manifest["files"][-1]["last"] == end
        total += len(expected)
    assert summary["files"] == total and summary["subscribers"] == 20
    assert json.loads((tmp_path / "out" / "_SUCCESS.json").read_text()) == summary
    # The world holds what the selection must get right, so the identity above means something.
    conn = world.connection
    assert conn.execute("SELECT count(*) FROM fieldsync_returned").fetchone()[0] > 0
    assert conn.execute("SELECT count(DISTINCT origin) FROM fieldsync_log").fetchone()[0] > 5
    # Rows written back carry what hq had applied of their origin: version-4 files, from both.
    versions = {path.read_bytes()[4] for path in (tmp_path / "out" / "files").rglob("*.fsm")}
    assert versions == {2, 4}


def test_a_range_across_subscription_changes_is_byte_identical_to_the_agent(spark, tmp_path):
    """The job reads each log transaction with the subscriptions that held
    at it (export format 4's since and until), as the agent does: a
    subscriber that gained a region and then lost its own, mid-range,
    gets the same files from both."""
    from benchmarks.spark_world import region_of

    site = build_world(tmp_path, 3_000, 4, seed=7)
    names = subscriber_names(4)
    regions = 4
    moved = names[0]
    site.update_remote(moved, peer_incarnation=b"\x01" * 16)  # extracted: changes go through its stream
    app = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    own, gained = region_of(0, regions), region_of(2, regions)
    assert site.subscribe(moved, "sales", gained).inserts > 0
    app.execute("UPDATE orders SET qty = qty + 1 WHERE id % 7 = 0")
    site.scan()
    assert site.unsubscribe(moved, "sales", own).deletes > 0
    app.execute("UPDATE orders SET qty = qty + 1 WHERE id % 5 = 0")
    end = site.scan()
    app.close()
    same_files_as_the_agent(site, spark, tmp_path, [BatchSend(name, 0, end, 0) for name in names])
    site.close()


def test_a_range_across_a_schema_change_is_byte_identical_to_the_agent(spark, tmp_path):
    """A schema change in the range (docs/site-database.md, "Schema
    changes") travels alone in a version-3 file from the job as from the
    agent, with the data before it in the old shape and after it in the new."""
    site = build_world(tmp_path, 3_000, 4, seed=11)
    app = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    app.execute("UPDATE orders SET qty = qty + 1 WHERE id % 7 = 0")
    site.apply_schema(["ALTER TABLE orders ADD COLUMN promo TEXT DEFAULT 'none'",
                       "ALTER TABLE product ADD COLUMN weight REAL"])
    app.execute("UPDATE orders SET promo = 'spring' WHERE id % 5 = 0")
    end = site.scan()
    app.close()
    sends = [BatchSend(name, 0, end, 0) for name in subscriber_names(4)]
    for subscriber, versions in same_files_as_the_agent(site, spark, tmp_path, sends).items():
        assert {2, 3} <= versions <= {2, 3, 4}, subscriber  # 4: rows written back (with applied)
    site.close()


def test_a_range_across_a_table_rename_is_byte_identical_to_the_agent(spark, tmp_path):
    """Rows logged under a table's old name before a rename are selected by
    the job with the table's article (export format 5's renames), as the
    agent selects them, and the data after it under the new name."""
    site = build_world(tmp_path, 3_000, 4, seed=13)
    app = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    app.execute("UPDATE orders SET qty = qty + 1 WHERE id % 7 = 0")
    site.apply_schema(["ALTER TABLE orders RENAME TO sale_order", "ALTER TABLE sale_order DROP COLUMN note"])
    app.close()
    app = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    app.execute("UPDATE sale_order SET qty = qty + 1 WHERE id % 5 = 0")
    end = site.scan()
    app.close()
    sends = [BatchSend(name, 0, end, 0) for name in subscriber_names(4)]
    export_batch(site, sends, tmp_path / "export", max_size=MAX_SIZE)
    assert json.loads((tmp_path / "export" / "job.json").read_text())["renames"] == {"orders": "sale_order"}
    run_job(spark, tmp_path / "export", tmp_path / "out", keys=site_keys(site))
    tables = {op.table for send in sends for transaction in site.read_log(send.subscriber, send.start, send.end)
              for op in transaction.ops if isinstance(op, Operation)}
    assert {"orders", "sale_order"} <= tables  # the rows logged under the old name are selected
    for send in sends:
        expected = agent_files(site, send)
        assert job_files(tmp_path / "out", send.subscriber) == expected, send.subscriber
    site.close()


def test_a_range_across_a_publication_dropped_is_byte_identical_to_the_agent(spark, tmp_path):
    """The removal of a publication's articles (docs/site-database.md,
    "Removing an article") goes to the remotes its row lists, those
    extracted then, from the job as from the agent; the others get nothing
    of it.  The rows of its tables logged before it are read with the
    articles as they were (export format 7's ``removed``), and the
    publication's subscriptions as they were (ended, not deleted)."""
    site = build_world(tmp_path, 3_000, 4, seed=17)
    names = subscriber_names(4)
    for name in names[:2]:
        site.extract(name, tmp_path / f"{name}.db")
    app = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    app.execute("UPDATE orders SET qty = qty + 1 WHERE id % 7 = 0")
    assert site.drop_publication("catalog") == tuple(sorted(names[:2]))  # both subscribe to catalog
    app.execute("UPDATE orders SET qty = qty + 1 WHERE id % 5 = 0")
    end = site.scan()
    app.close()
    sends = [BatchSend(name, 0, end, 0) for name in names]
    for subscriber, versions in same_files_as_the_agent(site, spark, tmp_path, sends).items():
        assert (3 in versions) == (subscriber in names[:2]), subscriber  # the change, version 3
    (removed,) = json.loads((tmp_path / "export" / "job.json").read_text())["removed"]
    change = next(t.commit for t in site.read_log(names[0], 0, end) if change_of(t) is not None)
    assert removed == {"table": "product", "publication": "catalog", "columns": '["sku", "name", "price"]',
                       "subscribe_by": None, "until": change}
    for name in (names[0], names[2]):  # extracted or not, subscribed to catalog until the drop
        tables = {op.table for t in site.read_log(name, 0, end) for op in t.ops if isinstance(op, Operation)}
        assert "product" in tables, name
    site.close()


def test_a_subscriber_with_nothing_in_its_range_gets_a_manifest_and_no_file(world, spark, tmp_path):
    end = world.log_end()
    start = middle_commit(world, 0.5)
    if "idle" not in {remote.name for remote in world.remotes()}:
        world.add_remote("idle", start=0)
        world.subscribe("idle", "sales", "nowhere")
    sends = [BatchSend("idle", start, end, 1), BatchSend(subscriber_names(20)[1], start, end, 1)]
    export_batch(world, sends, tmp_path / "export", max_size=MAX_SIZE)
    run_job(spark, tmp_path / "export", tmp_path / "out", keys=site_keys(world))
    for send in sends:
        assert job_files(tmp_path / "out", send.subscriber) == agent_files(world, send)
    manifest = json.loads((tmp_path / "out" / "manifests" / "idle.json").read_text())
    assert (manifest["files"], manifest["transactions"], manifest["start"], manifest["end"]) == ([], 0, start, end)
    other = json.loads((tmp_path / "out" / "manifests" / f"{sends[1].subscriber}.json").read_text())
    assert other["files"] and other["transactions"] > 0


def test_the_job_writes_the_message_format_it_is_asked_for(world, spark, tmp_path):
    """agent run --message-format 1 reaches the job through the export: its
    files are version 1, byte for byte the agent's own."""
    end = world.log_end()
    start = middle_commit(world, 0.8)
    sends = [BatchSend(name, start, end, 2) for name in subscriber_names(20)[:2]]
    export_batch(world, sends, tmp_path / "export", max_size=MAX_SIZE, version=1)
    run_job(spark, tmp_path / "export", tmp_path / "out", keys=site_keys(world))
    for send in sends:
        files = job_files(tmp_path / "out", send.subscriber)
        assert files and files == agent_files(world, send, version=1)
        assert files != agent_files(world, send)  # version 2 is another file
        assert {(tmp_path / "out" / "files" / send.subscriber / name).read_bytes()[4] for name in files} == {1}


def test_a_failure_mid_job_leaves_no_finished_output(world, spark, tmp_path):
    end = world.log_end()
    sends = [BatchSend(name, 0, end, 0) for name in subscriber_names(20)[:4]]
    export_batch(world, sends, tmp_path / "export", max_size=MAX_SIZE)
    with pytest.raises(Exception, match="injected failure after 1 files"):
        run_job(spark, tmp_path / "export", tmp_path / "out", keys=site_keys(world), fail_after_files=1)
    assert not (tmp_path / "out" / "_SUCCESS.json").exists()
    assert not (tmp_path / "out" / "manifests").exists()
    # A message file the driver put in place is whole (written under a
    # temporary name, then renamed): the agent's own file of that name.
    for send in sends:
        folder = tmp_path / "out" / "files" / send.subscriber
        if folder.exists():
            expected = agent_files(world, send)
            for path in folder.iterdir():
                assert not path.name.startswith(".")
                assert hashlib.sha256(path.read_bytes()).hexdigest() == expected[path.name]


def test_export_refuses_a_start_before_the_truncation_point(tmp_path):
    site = build_world(tmp_path, 2_000, 3)
    end = site.log_end()
    for name in subscriber_names(3):
        site.record_send(name, log_sent=end)
        site.update_remote(name, confirm_sent=end)
    floor = site.truncate_log()
    assert floor == end
    from agent.site import LogTruncated

    with pytest.raises(LogTruncated):
        export_batch(site, [BatchSend("field001", 0, end, 0)], tmp_path / "export",
                     max_size=MAX_SIZE)
    assert not (tmp_path / "export" / "job.json").exists()
    site.close()


def big_backlog(directory: Path, rows: int, body: int) -> SiteDatabase:
    """One subscriber receiving ``rows`` rows of ``body`` bytes each."""
    path = directory / "hq.db"
    site = init_site(path, name="hq", role="consolidated")
    app = sqlite3.connect(path, isolation_level=None)
    app.execute("CREATE TABLE doc (id INTEGER PRIMARY KEY, body TEXT)")
    site.create_publication("docs", [Article("doc")])
    site.add_remote("field001", start=0)
    site.subscribe("field001", "docs")
    filler = "".join(chr(97 + (index * 7) % 26) for index in range(body))
    for first in range(0, rows, 5_000):
        app.execute("BEGIN")
        app.executemany("INSERT INTO doc VALUES (?, ?)",
                        ((row_id, f"{row_id:08d}{filler}") for row_id in range(first, min(rows, first + 5_000))))
        app.execute("COMMIT")
        site.scan()
    app.close()
    return site


def test_a_backlog_larger_than_driver_memory_goes_through(tmp_path):
    """220 MB of operations for one subscriber through a driver JVM of
    512 MB (about 130 MB of it for execution and storage): the job spills
    and streams; it never holds the backlog."""
    site = big_backlog(tmp_path, 55_000, 4_000)
    end = site.log_end()
    send = BatchSend("field001", 0, end, 0)
    summary = export_batch(site, [send], tmp_path / "export", max_size=MAX_SIZE)
    log_bytes = sum(path.stat().st_size for path in (tmp_path / "export" / "log").iterdir())
    assert summary.rows == 55_000
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[2]", "--driver-memory", "512m",
         "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=500",
         str(ROOT / "contrib" / "spark" / "job.py"), "--keys", str(key_path(site.path)),
         str(tmp_path / "export"), str(tmp_path / "out")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    expected = agent_files(site, send)
    assert job_files(tmp_path / "out", "field001") == expected
    raw = 55_000 * 4_000
    assert raw > 200_000_000 and log_bytes > 0
    assert json.loads(completed.stdout.strip().splitlines()[-1])["files"] == len(expected)
    site.close()


def test_the_commands_of_running_the_job_by_hand_work(tmp_path):
    """docs/spark.md, "Running the job by hand", run as written from a
    folder that has the repository's .venv and contrib."""
    text = (ROOT / "docs" / "spark.md").read_text(encoding="utf-8")
    section = text.split("## Running the job by hand", 1)[1].split("\n## ", 1)[0]
    script = section.split("```sh\n", 1)[1].split("```", 1)[0]
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (tmp_path / "contrib").symlink_to(ROOT / "contrib")
    completed = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True,
                               text=True, timeout=600)
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-3000:]
    summary = json.loads(completed.stdout.strip().splitlines()[-1])
    assert summary["format"] == 1 and summary["subscribers"] >= 1 and summary["files"] >= 1
    assert (tmp_path / "OUTPUT_DIR" / "_SUCCESS.json").exists()
    assert not (tmp_path / "EXPORT_DIR" / "keys").exists()
