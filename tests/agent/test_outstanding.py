"""Never silent while something is outstanding (docs/protocol.md, rule 3):
the bounds of a lost confirmation and a lost last message, on real SQLite
files and folder inboxes, with the timers users run (a 24 h heartbeat and
a 1 h confirm timeout), so the heartbeat cannot be what repairs them.

Each site's run advances the agents' clock by a minute (tests/agent/world.py);
a test moves it further where it waits for the confirm timeout."""

from __future__ import annotations

import random

import pytest

from agent.runner import RunOptions
from agent.site import SiteDatabase

from .world import World, data_files, random_rows

HOUR = 3600.0
DAY = 24 * HOUR


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path / "world", options=RunOptions(heartbeat=DAY, confirm_timeout=HOUR))
    world.extract_all()
    return world


def row(world: World, site: str, peer: str):
    rows, _ = world.remote_rows(site)
    return rows[peer]


def controls(world: World, site: str):
    return [path for path in world.inbox_files(site) if ".c." in path.name]


def drop_controls(world: World, site: str) -> int:
    dropped = controls(world, site)
    for path in dropped:
        path.unlink()
    return len(dropped)


async def send_and_lose_the_confirmation(world: World) -> float:
    """hq sends f1 five rows, f1 applies them and confirms, and the
    confirmation is lost; return when hq's data went."""
    await world.settle()
    world.write("hq", *random_rows(random.Random(9), 5, ("f1",), start=3000))
    await world.run("hq")
    sent_at = world.clock
    assert data_files(world, "f1")
    await world.run("f1")
    assert len(world.rows("f1", "customer", "WHERE id >= 3000")) == 5
    assert drop_controls(world, "hq") == 1
    stream = row(world, "hq", "f1")
    assert stream.confirm_sent < stream.log_sent
    return sent_at


async def test_a_lost_confirmation_is_repaired_by_the_next_data_message_back(world):
    await send_and_lose_the_confirmation(world)
    # f1 writes: its data message to hq carries the confirmation along (a
    # control message of the same send phase: hq is not known to hold it).
    world.write("f1", ("INSERT INTO ledger VALUES ('f1-back', 'f1', 7)", ()))
    await world.run("f1")
    assert data_files(world, "hq") and len(controls(world, "hq")) == 1
    await world.run("hq")
    assert world.rows("hq", "ledger", "WHERE entry = 'f1-back'")
    stream = row(world, "hq", "f1")
    assert stream.confirm_sent == stream.log_sent
    # Well within the confirm timeout: no probe was needed.
    assert world.clock - stream.data_sent_at < HOUR and stream.probes == 0


async def test_a_lost_confirmation_with_nothing_flowing_back_is_repaired_within_one_confirm_timeout(world):
    sent_at = await send_and_lose_the_confirmation(world)
    # Quiet runs before the timeout: nothing goes either way.
    for _ in range(3):
        await world.round()
    assert not world.inbox_files("f1") and not world.inbox_files("hq")
    assert row(world, "hq", "f1").confirm_sent < row(world, "hq", "f1").log_sent
    # The confirm timeout passes; then two runs of each side.
    world.clock = sent_at + HOUR
    await world.run("hq")  # the probe, carrying hq's log_sent, asking for an answer
    [probe] = controls(world, "f1")
    assert probe.name.split(".")[3].endswith("-0000000001")  # its header's seq: asks for a confirmation
    await world.run("f1")  # the answer
    await world.run("hq")
    stream = row(world, "hq", "f1")
    assert stream.confirm_sent == stream.log_sent
    assert world.clock - sent_at <= HOUR + 4 * 60  # a minute a run
    # At rest: the answer asked nothing back, and nobody says anything more
    # until the heartbeat.
    await world.run("f1")
    for _ in range(5):
        await world.round()
    assert not world.inbox_files("f1") and not world.inbox_files("hq")
    assert world.quiescent()
    world.check_converged()


async def test_a_lost_last_message_is_applied_within_one_confirm_timeout(world):
    await world.settle()
    world.write("hq", *random_rows(random.Random(11), 5, ("f2",), start=4000))
    await world.run("hq")
    sent_at = world.clock
    lost = world.inbox_files("f2")
    assert any(".d." in path.name for path in lost)
    for path in lost:
        path.unlink()  # everything the run sent f2 is lost
    for _ in range(3):
        await world.round()
    assert not world.rows("f2", "customer", "WHERE id >= 4000")
    world.clock = sent_at + HOUR
    runs = 0
    # One confirm timeout, then --patience polls (1), the resend urgency (0
    # in batch runs) and two runs of each side.
    for site in ("hq", "f2") * (1 + world.options.patience + 2):
        await world.run(site)
        runs += 1
        if len(world.rows("f2", "customer", "WHERE id >= 4000")) == 5:
            break
    assert len(world.rows("f2", "customer", "WHERE id >= 4000")) == 5, world.describe()
    assert runs <= 2 * (1 + world.options.patience + 1), runs
    assert world.counted("f2", "resend_requests") == 1
    await world.settle()


async def test_an_idle_fleet_with_everything_confirmed_gets_only_its_heartbeats(world):
    await world.settle()
    for _ in range(3):
        await world.round()
    files = sum(len(world.inbox_files(site)) for site in ("hq", "f1", "f2"))
    sent = sum(report.sent for _, report in world.reports[-9:])
    assert files == 0 and sent == 0


async def test_files_read_again_under_keep_are_no_duplicates_and_get_no_answer(world):
    """--keep leaves every file in the inbox and each poll reads them again:
    that is no resend by the peer, so it asks for no confirmation."""
    await world.settle()
    world.write("hq", *random_rows(random.Random(13), 3, ("f1",), start=6000))
    await world.run("hq")
    await world.run("f1", keep=True)  # applies and confirms; the data file stays in the inbox
    assert len(world.rows("f1", "customer", "WHERE id >= 6000")) == 3 and data_files(world, "f1")
    assert len(controls(world, "hq")) == 1
    await world.run("hq")
    assert row(world, "hq", "f1").confirm_sent == row(world, "hq", "f1").log_sent
    for _ in range(3):
        await world.run("f1", keep=True)  # reads the kept file again, each time
    assert not controls(world, "hq") and not row(world, "f1", "hq").confirm_owed
    # A real duplicate (the file arriving again without --keep) is answered.
    copy = data_files(world, "f1")[0]
    await world.run("f1")  # takes it in once more: a duplicate of applied data
    assert len(controls(world, "hq")) == 1, copy


async def test_a_message_waiting_in_the_queue_from_an_earlier_run_is_no_news_from_the_peer(world):
    """At each batch run the core is told what is still queued: that does
    not move heard_at (nor reset the probe backoff), only an arrival does."""
    await world.settle()
    for batch in range(2):
        world.write("hq", *random_rows(random.Random(70 + batch), 2, ("f1",), start=7000 + 10 * batch))
        await world.run("hq")
    first, second = sorted(data_files(world, "f1"))
    first.unlink()  # lost: the second waits behind the gap
    await world.run("f1", patience=5)
    heard = row(world, "f1", "hq").heard_at
    await world.run("f1", patience=5)  # the inbox is empty; the second message is still queued
    assert row(world, "f1", "hq").heard_at == heard
    assert second.name and not data_files(world, "f1")


async def test_a_resend_acted_on_at_a_runs_start_reads_no_truncated_log(world):
    """A protocol built at a run's start knows where the log was truncated:
    a resend request acted on before the send phase reads from there, not
    from confirm_sent below it (which would fail as 'needs a new extraction')."""
    from agent.pairs import PairStore
    from agent.protocol import SendData
    from codec.keys import Keyring
    from codec.message import ControlState

    for batch in range(4):
        world.write("hq", *random_rows(random.Random(80 + batch), 1, ("f1",), start=8000 + batch))
    db = SiteDatabase.open(world.db("hq"))
    try:
        end = db.scan()  # the captured rows into the log: one transaction, one offset each
        assert end >= 4
        commits = list(range(1, end + 1))
        cut = commits[-3]  # truncated through here: (cut, end] is what the log holds
        db.connection.execute("UPDATE fieldsync_site SET truncated_through = ?", (cut,))
        db.update_remote("f1", log_send=end, log_sent=end, log_read=end, confirm_sent=commits[0])
        peers = {}
        (world.root / "state").mkdir()
        PairStore(db, world.root / "state", Keyring()).load(peers, RunOptions(resend_urgency=0.0).settings(True))
        protocol = peers["f1"].protocol
        actions = protocol.control_received(0.0, ControlState(commits[0], protocol.state.resend_count + 1, 0, 0),
                                            protocol.state.peer_incarnation or b"\0" * 16)
    finally:
        db.close()
    [send] = [action for action in actions if isinstance(action, SendData)]
    assert send.start == commits[0] and send.read_start == cut
