"""The local engine's send path (agent.outbound and Agent.send_phase): one
pass over the log packs every due send, and the outbound queue and
``log_sent`` end up exactly as if each send had been packed on its own
(``pack_messages(read_log(...))``), also when one send fails or the agent
dies half-way.

The world is ``benchmarks.spark_world`` (subsets by SUBSCRIBE BY, rows
moving between them, a column-restricted catalog for all, transactions
from remotes written back to their origin), built once; each test runs on
its own copy of ``hq.db`` (a copy without its agent folder has empty
queues).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from agent import crashpoints
from agent.admin import site_keys
from agent.keyfiles import copy_site_keys
from agent.outbound import BatchSend, pack_sends
from agent.queues import MessageQueues, QueueError
from agent.runner import Agent, RunOptions, RunReport, open_queues
from agent.site import SiteDatabase
from agent.spark.engine import SparkOptions
from benchmarks.spark_world import build_world, subscriber_names
from codec.errors import InvalidValue
from codec.keys import SiteKeys
from codec.names import Kind, MessageName
from codec.packing import MIN_MAX_SIZE, pack_messages
from tests.sqlfiles import seq_ranges

SUBSCRIBERS = 6
NAMES = subscriber_names(SUBSCRIBERS)
MAX_SIZE = MIN_MAX_SIZE  # many files per subscriber from a small world


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("outbound-world")
    build_world(folder, 6_000, SUBSCRIBERS).close()
    return folder / "hq.db"


@pytest.fixture
def site(world: Path, tmp_path: Path) -> Path:
    """A copy of the world where the sends have different ranges: field002
    resends from the middle of the log at epoch 1, field004 has only the
    tail to send, field006 has nothing to send."""
    shutil.copy(world, tmp_path / "hq.db")
    copy_site_keys(world, tmp_path / "hq.db")
    with SiteDatabase.open(tmp_path / "hq.db") as db:
        offsets = [row[0] for row in db.connection.execute("SELECT commit_offset FROM fieldsync_log"
                                                           " ORDER BY commit_offset")]
        db.update_remote("field002", resend_count=1, log_sent=offsets[len(offsets) // 2],
                         confirm_sent=offsets[len(offsets) // 2])
        db.update_remote("field004", log_sent=offsets[-3], confirm_sent=offsets[-3])
        db.update_remote("field006", log_sent=offsets[-1], log_send=offsets[-1])
    return tmp_path / "hq.db"


@dataclass(frozen=True)
class Expected:
    """Each subscriber's data files as packing its send alone makes them."""

    files: dict[str, list[tuple[str, bytes]]]
    starts: dict[str, int]
    end: int


def expected(database: Path) -> Expected:
    with SiteDatabase.open(database) as db:
        keys = site_keys(db)
        end = db.log_end()
        files, starts = {}, {}
        for remote in db.remotes():
            starts[remote.name] = remote.log_sent
            files[remote.name] = [(message.name, message.data) for message in pack_messages(
                db.read_log(remote.name, remote.log_sent, end), keys=keys, recipient=remote.name,
                incarnation=db.identity.incarnation, resend_count=remote.resend_count, start=remote.log_sent,
                max_size=MAX_SIZE, end=end)] if remote.log_sent < end else []
        return Expected(files, starts, end)


@dataclass(frozen=True)
class Phase:
    report: RunReport
    outbound: dict[str, list[tuple[str, bytes]]]  # peer -> queued (name, bytes), oldest first
    log_sent: dict[str, int]


def send_phase(database: Path, *, wrap: Any = None, statements: list[str] | None = None) -> Phase:
    """One send phase of a batch run on the local engine; ``wrap(queues)``
    may stand between the agent and its queues; ``statements`` collects the
    SQL the agent's database connection runs."""

    async def run() -> Phase:
        queues = open_queues(database)
        if wrap is not None:
            queues = wrap(queues)
        options = RunOptions(receive=False, max_message_size=MAX_SIZE, spark=SparkOptions(engine="local"))
        async with Agent(database, options, queues=queues) as agent:
            if statements is not None:
                agent.db.connection.set_trace_callback(statements.append)
            try:
                await agent.send_phase(force_controls=True)
            finally:
                phase = Phase(agent.report, queued(agent.queues),
                              {remote.name: remote.log_sent for remote in agent.db.remotes()})
        return phase

    return asyncio.run(run())


def queued(queues: MessageQueues) -> dict[str, list[tuple[str, bytes]]]:
    return {peer: [(name, queues.read_outbound(peer, name)) for name in queues.outbound(peer)] for peer in NAMES}


def data_files(files: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(name, data) for name, data in files if MessageName.parse(name).kind is Kind.DATA]


def assert_sent_as_alone(phase: Phase, reference: Expected, peers: list[str]) -> None:
    for peer in peers:
        files = phase.outbound[peer]
        assert data_files(files) == reference.files[peer], peer
        # The confirmation comes after the peer's data files.
        kinds = [MessageName.parse(name).kind for name, _ in files]
        assert kinds == [Kind.DATA] * len(reference.files[peer]) + [Kind.CONTROL], peer
        assert phase.log_sent[peer] == reference.end, peer


# -- the send phase ------------------------------------------------------------------------


def test_a_send_phase_queues_what_each_send_alone_would(site: Path) -> None:
    reference = expected(site)
    assert len({start for start in reference.starts.values()}) == 4  # three ranges and one with nothing
    statements: list[str] = []
    phase = send_phase(site, statements=statements)
    assert phase.report.ok, phase.report
    assert_sent_as_alone(phase, reference, NAMES)
    # One pass: capture rows are read in chunks of 1,000 once, not once per send
    # (a chunk's INSERT and DELETE rows, which hold one image, by a narrower
    # statement of the same range of seqs).
    chunks = [statement for statement in statements if "FROM fieldsync_capture WHERE seq > " in statement]
    assert 0 < len(chunks) <= 2 * (reference.end // 1000 + 2)
    assert 0 < len(seq_ranges(chunks)) <= reference.end // 1000 + 2
    assert reference.files["field006"] == [] and len(reference.files["field001"]) >= 3  # several files
    resent = [MessageName.parse(name).header for name, _ in reference.files["field002"]]
    assert resent[0].prev == reference.starts["field002"] > 0 and {h.resend_count for h in resent} == {1}
    # Queued only: a file counts as sent once a transport accepted it (the flush), not before.
    assert sum(len(data_files(phase.outbound[peer])) for peer in NAMES) == sum(
        len(files) for files in reference.files.values())
    assert phase.report.sent == 0


def cancel_then_send_again(site: Path, stick: Callable[[Agent, asyncio.Event], tuple[object, str]]) -> Phase:
    """Start a send phase; once ``stick``'s stand-in (installed on the object
    and under the name it returns) has set the event and hangs, cancel the phase,
    check that every send was given back to the protocol, then run a whole
    send phase on the same agent."""

    async def run() -> Phase:
        options = RunOptions(receive=False, max_message_size=MAX_SIZE, spark=SparkOptions(engine="local"))
        async with Agent(site, options) as agent:
            stuck = asyncio.Event()
            patched = stick(agent, stuck)
            task = asyncio.create_task(agent.send_phase(force_controls=True))
            await stuck.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert all(peer.protocol.sending is None for peer in agent.peers.values())
            delattr(*patched)  # the class's method again
            await agent.send_phase(force_controls=True)
            return Phase(agent.report, queued(agent.queues),
                         {remote.name: remote.log_sent for remote in agent.db.remotes()})

    return asyncio.run(run())


def test_a_cancelled_send_phase_leaves_its_sends_to_the_next_one(site: Path) -> None:
    """An application cancels the task running a send phase after the sends
    were handed out: the same agent's next send phase makes them all."""
    reference = expected(site)
    handed_out: list[int] = []

    def stick(agent: Agent, stuck: asyncio.Event) -> tuple[object, str]:
        async def hang(sends: list) -> tuple[None, bool]:
            handed_out.append(len(sends))  # the SendData were taken from the protocol
            stuck.set()
            await asyncio.Event().wait()
            raise AssertionError("not cancelled")

        agent.sender.preparer._spark_batch = hang  # type: ignore[method-assign]
        return agent.sender.preparer, "_spark_batch"

    phase = cancel_then_send_again(site, stick)
    assert handed_out[0] > 0
    assert phase.report.ok, phase.report
    assert_sent_as_alone(phase, reference, NAMES)


def test_a_send_phase_cancelled_after_it_handed_out_sends_gives_them_all_back(site: Path) -> None:
    """The cancellation comes once every due send was handed out (the hand
    out itself has no await between peers) and before any was prepared:
    every one is given back, and the next send phase makes them all."""
    reference = expected(site)
    handed_out: list[str] = []

    def stick(agent: Agent, stuck: asyncio.Event) -> tuple[object, str]:
        async def hang(sends: list) -> None:
            handed_out.extend(peer.name for peer, send in sends)
            assert all(agent.peers[name].protocol.sending for name in handed_out)
            stuck.set()
            await asyncio.Event().wait()

        agent.sender.preparer.prepare = hang  # type: ignore[method-assign]
        return agent.sender.preparer, "prepare"

    phase = cancel_then_send_again(site, stick)
    assert sorted(handed_out) == sorted(peer for peer, files in reference.files.items() if files)
    assert phase.report.ok, phase.report
    assert_sent_as_alone(phase, reference, NAMES)


def test_pack_sends_makes_each_sends_files_in_order(site: Path) -> None:
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = [BatchSend(remote.name, remote.log_sent, reference.end, remote.resend_count)
                 for remote in db.remotes() if remote.log_sent < reference.end]
        made: dict[str, list[tuple[str, bytes]]] = {send.subscriber: [] for send in sends}
        outcomes = pack_sends(db, site_keys(db), sends,
                              lambda index, message: made[sends[index].subscriber].append((message.name,
                                                                                          message.data)),
                              max_size=MAX_SIZE)
    assert [outcome.error for outcome in outcomes] == [None] * len(sends)
    assert [outcome.messages for outcome in outcomes] == [len(reference.files[send.subscriber]) for send in sends]
    assert made == {send.subscriber: reference.files[send.subscriber] for send in sends}


def test_pack_sends_pauses_the_cyclic_collector_while_it_packs(site: Path) -> None:
    """codec.collector: off while messages are made and put, on again after."""
    import gc

    reference = expected(site)
    enabled: list[bool] = []
    with SiteDatabase.open(site) as db:
        sends = [BatchSend(remote.name, remote.log_sent, reference.end, remote.resend_count)
                 for remote in db.remotes() if remote.log_sent < reference.end]
        assert gc.isenabled()
        pack_sends(db, site_keys(db), sends, lambda index, message: enabled.append(gc.isenabled()),
                   max_size=MAX_SIZE)
        assert gc.isenabled()
    assert enabled and not any(enabled)


def test_a_peer_whose_messages_cannot_be_sealed_fails_alone(site: Path) -> None:
    # field003's row holds another site's public key: sealing to it is refused.
    with SiteDatabase.open(site) as db:
        db.update_remote("field003", public_key=SiteKeys.generate("elsewhere").public.to_line())
    reference = expected(site)
    phase = send_phase(site)
    problem = "sealing key is for elsewhere, not the recipient field003"
    assert phase.report.local_errors == [f"preparing messages for field003: {problem}",
                                         f"preparing a control message for field003: {problem}"]
    assert phase.report.transport_errors == []  # no transport was involved
    assert phase.log_sent["field003"] == reference.starts["field003"] == 0
    assert phase.outbound["field003"] == []
    assert_sent_as_alone(phase, reference, [name for name in NAMES if name != "field003"])


def test_a_peer_whose_range_the_log_cannot_serve_fails_alone(site: Path) -> None:
    """field003's row says it was sent up to offset 1, which is no commit
    offset: its send fails with one line, and the peers packed in the same
    pass are recorded as usual (nothing is left queued without its log_sent)."""
    with SiteDatabase.open(site) as db:
        db.connection.execute("UPDATE fieldsync_remote SET log_sent = 1, confirm_sent = 0 WHERE name = 'field003'")
    reference = expected_without(site, "field003")
    phase = send_phase(site)
    [problem] = phase.report.local_errors
    assert phase.report.transport_errors == []
    assert problem.startswith("preparing messages for field003: ") and "1 is not a commit offset" in problem
    assert phase.log_sent["field003"] == 1 and data_files(phase.outbound["field003"]) == []
    assert_sent_as_alone(phase, reference, [name for name in NAMES if name != "field003"])


def expected_without(database: Path, broken: str) -> Expected:
    """:func:`expected` for the others when ``broken``'s range cannot be read."""
    with SiteDatabase.open(database) as db:
        saved = db.remote(broken).log_sent
        db.connection.execute("UPDATE fieldsync_remote SET log_sent = 0 WHERE name = ?", (broken,))
    try:
        return expected(database)
    finally:
        with SiteDatabase.open(database) as db:
            db.connection.execute("UPDATE fieldsync_remote SET log_sent = ? WHERE name = ?", (saved, broken))


def test_sends_packed_in_groups_make_the_same_files(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for the packers of two sends only, the sends go in passes
    of two; the files are the same."""
    import agent.outbound as outbound

    monkeypatch.setattr(outbound, "PACKING_MEMORY", 2 * outbound.PACKER_MEMORY_FACTOR * MAX_SIZE)
    reference = expected(site)
    statements: list[str] = []
    phase = send_phase(site, statements=statements)
    assert phase.report.ok, phase.report
    assert_sent_as_alone(phase, reference, NAMES)
    passes = [statement for statement in statements if "FROM fieldsync_capture WHERE seq > " in statement]
    assert len(passes) > reference.end // 1000 + 2  # more than one pass over the log


class FailingQueue:
    """The agent's queues, but puts for ``peer`` fail (or the agent dies)
    from the ``after + 1``-th on."""

    def __init__(self, queues: MessageQueues, peer: str, after: int, error: BaseException) -> None:
        self._queues = queues
        self._peer = peer
        self._left = after
        self._error = error

    def put_outbound(self, peer: str, name: str, data: bytes, resend_count: int | None) -> None:
        if peer == self._peer and resend_count is not None:
            if self._left == 0:
                raise self._error
            self._left -= 1
        self._queues.put_outbound(peer, name, data, resend_count)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queues, name)


def test_a_queue_failure_for_one_peer_leaves_the_others_whole(site: Path) -> None:
    reference = expected(site)
    error = QueueError("disk quota of field003 exceeded")
    phase = send_phase(site, wrap=lambda queues: FailingQueue(queues, "field003", 2, error))
    # Packing failed on this site's side: a local error, and no transport error.
    assert phase.report.local_errors == ["preparing messages for field003: disk quota of field003 exceeded"]
    assert phase.report.transport_errors == [] and not phase.report.ok
    assert_sent_as_alone(phase, reference, [name for name in NAMES if name != "field003"])
    # What it queued before failing stays, and log_sent did not move ...
    assert data_files(phase.outbound["field003"]) == reference.files["field003"][:2]
    assert phase.log_sent["field003"] == 0
    # ... so the next send makes the same files again: the queue holds each once.
    again = send_phase(site)
    assert again.report.ok, again.report
    assert data_files(again.outbound["field003"]) == reference.files["field003"]
    assert again.log_sent["field003"] == reference.end


@pytest.mark.parametrize("where", ["send.after-queue", "in the pass"])
def test_an_agent_that_dies_during_the_send_phase_moves_no_log_sent_without_its_files(site: Path,
                                                                                      where: str) -> None:
    reference = expected(site)
    try:
        if where == "send.after-queue":
            # Dies after every file of the phase was queued, before the one
            # transaction that records the sends.
            crashpoints.arm("send.after-queue")
            wrap = None
        else:
            def wrap(queues: MessageQueues) -> FailingQueue:
                return FailingQueue(queues, "field001", 2, crashpoints.Crash("in the pass"))
        with pytest.raises(crashpoints.Crash):
            send_phase(site, wrap=wrap)
    finally:
        crashpoints.disarm()
    with SiteDatabase.open(site) as db:
        log_sent = {remote.name: remote.log_sent for remote in db.remotes()}
    queues = open_queues(site)
    try:
        left = queued(queues)
    finally:
        queues.close()
    for peer in NAMES:
        if log_sent[peer] != reference.starts[peer]:
            # Moved only with every file of the send queued.
            assert data_files(left[peer]) == reference.files[peer] and log_sent[peer] == reference.end, peer
    moved = [peer for peer in NAMES if log_sent[peer] != reference.starts[peer]]
    assert moved == []
    # The next run sends the rest; no file is queued twice.
    again = send_phase(site)
    assert again.report.ok, again.report
    for peer in NAMES:
        assert data_files(again.outbound[peer]) == reference.files[peer], peer
        assert again.log_sent[peer] == reference.end, peer


def test_a_bad_send_fails_alone_in_pack_sends(site: Path) -> None:
    reference = expected(site)
    with SiteDatabase.open(site) as db:
        sends = [BatchSend("field001", 0, reference.end, 0), BatchSend("field005", 1, reference.end, 0),
                 BatchSend("field002", 0, reference.end, 0, SiteKeys.generate("elsewhere").public)]
        made: list[tuple[int, str]] = []
        outcomes = pack_sends(db, site_keys(db), sends, lambda index, message: made.append((index, message.name)),
                              max_size=MAX_SIZE)
    assert outcomes[0].error is None and outcomes[0].messages == len(reference.files["field001"])
    assert "start offset 1 is not a commit offset" in str(outcomes[1].error) and outcomes[1].messages == 0
    assert isinstance(outcomes[2].error, InvalidValue) and outcomes[2].messages == 0
    assert [name for index, name in made if index == 0] == [name for name, _ in reference.files["field001"]]
    assert {index for index, _ in made} == {0}


def test_the_local_engine_does_not_import_the_spark_package():
    code = "import sys, agent.outbound; print(sorted(name for name in sys.modules if name.startswith('agent.spark')))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"
