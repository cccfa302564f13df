"""Packing a send phase's sends on several cores (agent.pack_workers): the
workers make byte for byte the files one process makes, each send's in
order; a send that fails in a worker, or whose worker dies, fails alone and
says why; an error reading the log is raised; the agent's send phase on
workers queues what each send alone would.

The world is test_outbound's (``benchmarks.spark_world``, with sends of
different ranges, epochs, and one with nothing to send).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent import pack_processes, pack_workers
from agent.admin import init_site, site_keys
from agent.keyfiles import copy_site_keys
from agent.outbound import BatchSend, pack_sends
from agent.pack_processes import PackWorkerError
from agent.pack_workers import pack_due_sends, uses_workers
from agent.runner import Agent, RunOptions
from agent.site import Article, SiteDatabase
from agent.site.errors import SiteError
from agent.spark.engine import SparkOptions
from codec.errors import InvalidValue
from codec.keys import SiteKeys
from codec.message import EncodedMessage

from tests.sqlfiles import connected

from .test_outbound import (MAX_SIZE, NAMES, Expected, Phase, assert_sent_as_alone, data_files, expected, queued,
                            site, world)

__all__ = ["site", "world"]  # fixtures


def due_sends(db: SiteDatabase, reference: Expected) -> list[BatchSend]:
    return [BatchSend(remote.name, remote.log_sent, reference.end, remote.resend_count)
            for remote in db.remotes() if remote.log_sent < reference.end]


def pack(db: SiteDatabase, sends: list[BatchSend], *, workers: int, put: object = None
         ) -> tuple[list, dict[str, list[tuple[str, bytes]]]]:
    made: dict[str, list[tuple[str, bytes]]] = {send.subscriber: [] for send in sends}

    def keep(index: int, message: EncodedMessage) -> None:
        made[sends[index].subscriber].append((message.name, message.data))

    outcomes = pack_due_sends(db, site_keys(db), sends, put or keep, max_size=MAX_SIZE, workers=workers,
                              workers_from=0)
    return outcomes, made


@pytest.mark.parametrize("workers", [2, 3, 9])
def test_workers_make_the_files_one_process_makes(site: Path, workers: int) -> None:
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = due_sends(db, reference)
        assert len(sends) == 5 and uses_workers(sends, workers, 0)
        outcomes, made = pack(db, sends, workers=workers)
        one: dict[str, list[tuple[str, bytes]]] = {send.subscriber: [] for send in sends}
        alone = pack_sends(db, site_keys(db), sends, lambda index, message: one[sends[index].subscriber].append(
            (message.name, message.data)), max_size=MAX_SIZE)
    assert [outcome.error for outcome in outcomes] == [None] * len(sends)
    assert [outcome.messages for outcome in outcomes] == [outcome.messages for outcome in alone] == [
        len(reference.files[send.subscriber]) for send in sends]
    assert made == one == {send.subscriber: reference.files[send.subscriber] for send in sends}


def test_workers_share_the_packers_memory_of_one_pass(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for the packers of four sends in one pass: two workers get room
    for two each, so each packs its three sends in two passes; the files
    are the same."""
    import agent.outbound as outbound

    monkeypatch.setattr(outbound, "PACKING_MEMORY", 4 * outbound.PACKER_MEMORY_FACTOR * MAX_SIZE)
    shares: list[int] = []
    start = pack_processes._start  # noqa: SLF001

    def recorded(*args):  # type: ignore[no-untyped-def]
        shares.append(args[-1].memory)  # (running, parts, sends, job)
        return start(*args)

    monkeypatch.setattr(pack_processes, "_start", recorded)
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = due_sends(db, reference) + [BatchSend("field006", 0, reference.end, 0)]
        outcomes, made = pack(db, sends, workers=2)
        one: dict[str, list[tuple[str, bytes]]] = {send.subscriber: [] for send in sends}
        pack_sends(db, site_keys(db), sends, lambda index, message: one[sends[index].subscriber].append(
            (message.name, message.data)), max_size=MAX_SIZE)
    assert shares == [2 * outbound.PACKER_MEMORY_FACTOR * MAX_SIZE]
    assert [outcome.error for outcome in outcomes] == [None] * 6
    assert made == one and all(made.values())


def test_when_workers_are_used() -> None:
    sends = [BatchSend("a", 0, 600, 0), BatchSend("b", 100, 600, 0, read_from=200)]
    assert uses_workers(sends, 2, 900)  # 600 + 400 offsets
    assert not uses_workers(sends, 2, 1001)  # below the threshold
    assert not uses_workers(sends, 1, 0)  # one worker: this process
    assert not uses_workers(sends[:1], 4, 0)  # one send: nothing to share
    assert pack_workers.PACK_WORKERS_FROM == RunOptions().pack_workers_from
    assert 1 <= RunOptions().pack_workers == pack_workers.default_workers() <= pack_workers.MAX_DEFAULT_WORKERS


def test_a_bad_send_fails_alone_in_a_worker(site: Path) -> None:
    """A range the log cannot serve and a sealing key of another site: each
    send fails with its error, carried back from its worker; the others are
    whole."""
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = [BatchSend("field001", 0, reference.end, 0), BatchSend("field005", 1, reference.end, 0),
                 BatchSend("field002", 0, reference.end, 0, SiteKeys.generate("elsewhere").public),
                 BatchSend("field003", 0, reference.end, 0)]
        outcomes, made = pack(db, sends, workers=2)
    assert outcomes[0].error is None and made["field001"] == reference.files["field001"]
    assert outcomes[3].error is None and made["field003"] == reference.files["field003"]
    assert isinstance(outcomes[1].error, SiteError) and "start offset 1 is not a commit offset" in str(
        outcomes[1].error)
    assert isinstance(outcomes[2].error, InvalidValue) and "elsewhere" in str(outcomes[2].error)
    assert made["field005"] == made["field002"] == [] and outcomes[1].messages == outcomes[2].messages == 0


def test_a_put_that_fails_stops_its_send_alone(site: Path) -> None:
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = due_sends(db, reference)
        made: dict[str, list[str]] = {send.subscriber: [] for send in sends}

        def put(index: int, message: EncodedMessage) -> None:
            peer = sends[index].subscriber
            if peer == "field003" and len(made[peer]) == 2:
                raise OSError(28, "No space left on device")
            made[peer].append(message.name)

        outcomes, _ = pack(db, sends, workers=2, put=put)
    for send, outcome in zip(sends, outcomes):
        names = [name for name, _ in reference.files[send.subscriber]]
        if send.subscriber == "field003":
            assert isinstance(outcome.error, OSError) and outcome.messages == 2 and made["field003"] == names[:2]
        else:
            assert outcome.error is None and made[send.subscriber] == names


def test_a_worker_that_dies_fails_its_unfinished_sends(site: Path) -> None:
    """A worker killed half-way (the out-of-memory killer, an operator):
    its sends not finished fail with one line naming the send and the exit;
    the files put before stay a prefix of the send's, and the other
    worker's sends are whole."""
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = due_sends(db, reference)
        made: dict[str, list[tuple[str, bytes]]] = {send.subscriber: [] for send in sends}
        killed: list[int] = []  # the first worker's pid, and the size of the message before its kill

        def put(index: int, message: EncodedMessage) -> None:
            made[sends[index].subscriber].append((message.name, message.data))
            if not killed and index % 2 == 0:  # the first worker packs sends 0, 2 and 4: its first message
                [worker] = [child for child in multiprocessing.active_children() if child.name == "fieldsync-pack-1"]
                os.kill(worker.pid, signal.SIGKILL)
                killed.extend((worker.pid, len(message.data)))

        outcomes, _ = pack(db, sends, workers=2, put=put)
    assert killed
    for position, (send, outcome) in enumerate(zip(sends, outcomes)):
        files = reference.files[send.subscriber]
        if position % 2 == 1:
            assert outcome.error is None and made[send.subscriber] == files
            continue
        assert made[send.subscriber] == files[:len(made[send.subscriber])]  # what was put is a prefix
        if outcome.error is not None:
            assert isinstance(outcome.error, PackWorkerError)
            assert str(outcome.error) == (f"the packing worker of the send to {send.subscriber} stopped (exit code "
                                          f"-9) before it finished; the next run sends it again")
    # What the killed worker had left after its first message is more than
    # its pipe holds (64 KiB), so it was killed before it had handed it all
    # over: some of its sends failed.
    killed_part = [reference.files[send.subscriber] for send in sends[0::2]]
    assert sum(len(data) for files in killed_part for _, data in files) - killed[1] > 65536
    assert any(outcome.error is not None for outcome in outcomes[0::2])


def test_a_worker_that_cannot_open_the_site_leaves_its_share_to_this_process(
        site: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A worker that cannot open the site (here it is moved away; a
    PostgreSQL server at its connection limit does the same): its sends
    are packed here, once the others are done, and the files are the
    same."""
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = due_sends(db, reference)
        os.rename(site, site.with_name("moved.db"))  # this connection stays open; the workers find nothing
        try:
            outcomes, made = pack(db, sends, workers=2)
        finally:
            os.rename(site.with_name("moved.db"), site)
    assert [outcome.error for outcome in outcomes] == [None] * len(sends)
    assert made == {send.subscriber: reference.files[send.subscriber] for send in sends}
    opened = [record.getMessage() for record in caplog.records if "could not open" in record.getMessage()]
    assert len(opened) == 2 and all(line.startswith(f"a packing worker could not open {site} (") for line in opened)
    assert sorted(int(line.split("; its ")[1].split()[0]) for line in opened) == [2, 3]


def test_an_error_reading_the_log_in_a_worker_is_raised(site: Path) -> None:
    """As pack_sends raises it in one process: here the capture table is gone."""
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = due_sends(db, reference)
        with connected(site) as other:
            other.execute("DROP TABLE fieldsync_capture")
        with pytest.raises(Exception, match="fieldsync_capture") as alone:
            pack_sends(db, site_keys(db), sends, lambda index, message: None, max_size=MAX_SIZE)
        with pytest.raises(Exception, match="fieldsync_capture") as on_workers:
            pack(db, sends, workers=2)
    assert type(on_workers.value) is type(alone.value) and str(on_workers.value) == str(alone.value)


def test_workers_that_cannot_start_leave_the_sends_to_this_process(site: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    class Refused:
        def __init__(self, **_: object) -> None:
            pass

        def start(self) -> None:
            raise OSError(24, "Too many open files")

    monkeypatch.setattr(pack_processes, "_Worker", Refused)
    monkeypatch.setattr(pack_workers, "_unavailable", None)
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = due_sends(db, reference)
        outcomes, made = pack(db, sends, workers=2)
        assert pack_workers._unavailable is not None  # noqa: SLF001 - not tried again in this process
        assert not uses_workers(sends, 2, 0)
    assert [outcome.error for outcome in outcomes] == [None] * len(sends)
    assert made == {send.subscriber: reference.files[send.subscriber] for send in sends}
    assert "packing workers cannot be started ([Errno 24] Too many open files); sends are packed in the " \
           "agent's process" in caplog.text


def test_a_send_phase_on_workers_queues_what_each_send_alone_would(site: Path) -> None:
    reference = expected(site)

    async def run() -> Phase:
        options = RunOptions(receive=False, max_message_size=MAX_SIZE, spark=SparkOptions(engine="local"),
                             pack_workers=2, pack_workers_from=0)
        async with Agent(site, options) as agent:
            await agent.send_phase(force_controls=True)
            return Phase(agent.report, queued(agent.queues),
                         {remote.name: remote.log_sent for remote in agent.db.remotes()})

    phase = asyncio.run(run())
    assert phase.report.ok, phase.report
    assert_sent_as_alone(phase, reference, NAMES)
    assert sum(len(data_files(phase.outbound[peer])) for peer in NAMES) == sum(
        len(files) for files in reference.files.values())


def test_pack_workers_is_checked_at_the_command_line(tmp_path: Path) -> None:
    completed = subprocess.run([sys.executable, "-m", "agent.cli", "run", str(tmp_path / "none.db"),
                                "--pack-workers", "0"], capture_output=True, text=True)
    assert completed.returncode == 2
    assert completed.stderr == ("agent: invalid value for '--pack-workers': 0 is not in the range x>=1 "
                                "(see 'agent run --help')\n")


def test_a_worker_does_not_run_the_agents_main_module_again(site: Path, tmp_path: Path) -> None:
    """multiprocessing hands a worker the main module to run again (the
    agent's whole command line, in every worker); the workers here run
    agent.pack_workers alone.  The script notes each time its top level
    runs, outside its ``__main__`` guard."""
    script = tmp_path / "main.py"
    notes = tmp_path / "notes"
    script.write_text(f"""
import sys
with open({str(notes)!r}, "a") as handle:
    handle.write(__name__ + "\\n")
if __name__ == "__main__":
    from agent.admin import site_keys
    from agent.outbound import BatchSend
    from agent.pack_workers import pack_due_sends
    from agent.site import SiteDatabase

    with SiteDatabase.open(sys.argv[1]) as db:
        sends = [BatchSend(name, 0, db.log_end(), 0) for name in ("field001", "field002", "field003")]
        made = []
        outcomes = pack_due_sends(db, site_keys(db), sends, lambda index, message: made.append(index),
                                  max_size={MAX_SIZE}, workers=3, workers_from=0)
        assert [outcome.error for outcome in outcomes] == [None] * 3 and sorted(set(made)) == [0, 1, 2]
""")
    completed = subprocess.run([sys.executable, str(script), str(site)], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert notes.read_text() == "__main__\n"


def test_an_agent_that_packs_in_its_own_process_never_imports_multiprocessing(site: Path, tmp_path: Path) -> None:
    """The processes' module (and multiprocessing with it) is imported at
    the first batch on workers, not when the agent starts: a fresh
    interpreter with the command line and the runner loaded runs a send
    phase below ``--pack-workers-from`` without it, then one above with
    it."""
    script = tmp_path / "phases.py"
    script.write_text(f"""
import asyncio, sys
import agent.cli.run
from agent.runner import Agent, RunOptions
from agent.spark.engine import SparkOptions

async def phase(path, workers_from):
    options = RunOptions(receive=False, max_message_size={MAX_SIZE}, spark=SparkOptions(engine="local"),
                         pack_workers=2, pack_workers_from=workers_from)
    async with Agent(path, options) as agent:
        await agent.send_phase(force_controls=True)
        assert agent.report.ok, agent.report
    return "multiprocessing" in sys.modules, "agent.pack_processes" in sys.modules

print(asyncio.run(phase(sys.argv[1], 10 ** 12)), asyncio.run(phase(sys.argv[2], 0)))
""")
    again = tmp_path / "again" / "hq.db"  # the same sends for the second phase
    again.parent.mkdir()
    shutil.copy(site, again)
    copy_site_keys(site, again)
    completed = subprocess.run([sys.executable, str(script), str(site), str(again)], capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.split() == ["(False,", "False)", "(True,", "True)"]


def test_a_workers_log_records_reach_the_agents_handlers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What a worker logs (here a TEXT value of the log that is not UTF-8,
    read by each worker) goes to the agent's handlers (its terminal and
    ``--log-file``; here the test's), said by the worker that met it."""
    db = init_site(tmp_path / "hq.db", name="hq", role="consolidated", address="hq@example.org")
    with db:
        db.connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        db.create_publication("p", [Article("t")])
        for name in ("n1", "n2"):
            db.add_remote(name, address=f"{name}@example.org")
            db.subscribe(name, "p")
        with connected(db.path) as app:
            app.execute("INSERT INTO t VALUES (1, CAST(x'ff41' AS TEXT)), (2, 'ok')")
        sends = [BatchSend(name, 0, db.scan(), 0) for name in ("n1", "n2")]
        with caplog.at_level("INFO", logger="fieldsync"):
            outcomes, made = pack(db, sends, workers=2)
    assert [outcome.error for outcome in outcomes] == [None, None] and all(made.values())
    said = [record for record in caplog.records if "is not valid UTF-8 (b'\\xffA'...)" in record.getMessage()]
    assert sorted(record.processName for record in said) == ["fieldsync-pack-1", "fieldsync-pack-2"]
    assert all(record.name == "fieldsync.site" and record.levelname == "WARNING" for record in said)
