"""The protocol end to end: real SQLite files, real folder inboxes, the real
agent, and faults applied to the files between runs.  The World checks the
invariants after every run (see world.py)."""

import dataclasses
import json
import os
import random
import shutil

import pytest

from agent import protocol as protocol_module
from agent.admin import extract_site, site_keys
from agent.runner import agent_directory
from agent.site import SiteDatabase
from codec.keys import SiteKeys
from codec.names import MessageName

from .world import World, data_files, random_rows

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path / "world")
    world.write("hq", *random_rows(random.Random(1), 20, ("f1", "f2")))
    world.extract_all()
    return world


async def test_two_way_replication_of_inserts_updates_deletes(world):
    rng = random.Random(2)
    world.write("hq", *random_rows(rng, 30, ("f1", "f2"), start=100))
    world.write("hq", ("UPDATE customer SET balance = balance + 1 WHERE id % 3 = 0", ()),
                ("DELETE FROM customer WHERE id % 7 = 0", ()))
    world.write("f1", ("INSERT INTO customer VALUES (500, 'f1', 'made in the field', 1.5, x'00ff')", ()))
    world.write("f1", ("UPDATE customer SET name = 'renamed at f1' WHERE id = 500", ()))
    world.write("f2", ("INSERT INTO ledger VALUES ('f2-1', 'f2', 7)", ()))
    await world.settle()
    assert world.rows("hq", "customer", "WHERE id = 500") == [(500, "f1", "renamed at f1", 1.5, b"\x00\xff")]
    world.write("f1", ("DELETE FROM customer WHERE id = 500", ()))
    await world.settle()
    assert world.rows("hq", "customer", "WHERE id = 500") == []
    assert world.rows("f1", "ledger") == [("f2-1", "f2", 7)]


async def test_forwarding_between_remotes_without_echo(world):
    world.write("f1", ("INSERT INTO product VALUES ('tea', 1, 'green tea', 4.5)", ()))
    await world.settle()
    assert world.rows("f2", "product") == [("tea", 1, "green tea", 4.5)]
    # No echo: f1 never received its own insert back (it would be an apply
    # error, "INSERT of an existing key", which the World checks for).
    world.write("f2", ("UPDATE product SET price = 5.0 WHERE sku = 'tea'", ()))
    await world.settle()
    assert world.rows("f1", "product") == [("tea", 1, "green tea", 5.0)]


async def test_subset_subscriptions_and_a_row_moving_between_subsets(world):
    target = world.rows("hq", "customer", "WHERE region = 'f1'")[0][0]
    await world.settle()
    assert world.rows("f1", "customer", "WHERE id = ?", (target,))
    world.write("hq", ("UPDATE customer SET region = 'f2', name = 'moved' WHERE id = ?", (target,)))
    await world.settle()
    assert world.rows("f1", "customer", "WHERE id = ?", (target,)) == []
    assert world.rows("f2", "customer", "WHERE id = ?", (target,))[0][1:3] == ("f2", "moved")


async def test_a_conflict_resolved_at_the_consolidated_reaches_every_site_and_its_origin(world):
    world.write("hq", ("INSERT INTO product VALUES ('jam', 1, 'plum jam', 3.0)", ()))
    await world.settle()
    # Both remotes change the same row before either syncs.
    world.write("f1", ("UPDATE product SET price = 3.5 WHERE sku = 'jam'", ()))
    world.write("f2", ("UPDATE product SET price = 2.5 WHERE sku = 'jam'", ()))
    await world.settle()
    with __import__("agent.site", fromlist=["SiteDatabase"]).SiteDatabase.open(world.db("hq")) as hq:
        assert hq.conflicts(), "the second update should have been recorded as a conflict"
    final = world.rows("hq", "product")
    assert world.rows("f1", "product") == final and world.rows("f2", "product") == final


async def test_a_transaction_larger_than_the_message_size_travels_in_parts(world):
    await world.settle()
    rng = random.Random(5)
    big = [("INSERT INTO customer VALUES (?, 'f1', ?, 0, ?)", (1000 + i, f"scan {i}", rng.randbytes(3000)))
           for i in range(16)]
    world.write("hq", *big)
    await world.run("hq", max_message_size=10_000)
    parts = [MessageName.parse(p.name).header for p in data_files(world, "f1")]
    assert len(parts) >= 4 and all(h.is_part for h in parts)
    assert [h.seq for h in parts] == list(range(len(parts)))
    # Deliver all but the final part: nothing is applied (atomic) ...
    final = data_files(world, "f1")[-1]
    held = final.read_bytes()
    final.unlink()
    await world.run("f1")
    assert not world.rows("f1", "customer", "WHERE id >= 1000")
    final.write_bytes(held)
    await world.run("f1")
    assert len(world.rows("f1", "customer", "WHERE id >= 1000")) == 16
    await world.settle()


async def test_a_lost_message_is_resent_in_a_new_epoch_and_old_copies_are_deleted(world):
    await world.settle()
    with __import__("agent.site", fromlist=["SiteDatabase"]).SiteDatabase.open(world.db("hq")) as hq:
        epoch_before = hq.remote("f1").resend_count
    for batch in range(3):
        world.write("hq", *random_rows(random.Random(batch), 40, ("f1",), start=2000 + 100 * batch))
        await world.run("hq", max_message_size=10_000)
    files = data_files(world, "f1")
    assert len(files) >= 3
    lost = files[1]
    kept = lost.read_bytes()
    lost.unlink()
    await world.settle()
    with __import__("agent.site", fromlist=["SiteDatabase"]).SiteDatabase.open(world.db("hq")) as hq:
        assert hq.remote("f1").resend_count == epoch_before + 1
    # The old-epoch copy arrives late: deleted as stale, never applied.
    lost.write_bytes(kept)
    await world.run("f1")
    assert not lost.exists()
    await world.settle()


async def test_a_lost_confirmation_is_repaired(world):
    await world.settle()
    world.write("hq", *random_rows(random.Random(9), 5, ("f1",), start=3000))
    await world.run("hq")
    await world.run("f1")
    for control in [p for p in world.inbox_files("hq") if ".c." in p.name]:
        control.unlink()
    await world.settle()


async def test_a_lost_last_message_is_detected_and_resent(world):
    await world.settle()
    world.write("hq", *random_rows(random.Random(11), 5, ("f2",), start=4000))
    await world.run("hq")
    for path in data_files(world, "f2"):
        path.unlink()  # the only data message is lost; the control message says what was sent
    await world.settle()
    assert len(world.rows("f2", "customer", "WHERE id >= 4000")) == 5


async def test_duplicated_and_reversed_messages_apply_once(world):
    await world.settle()
    for batch in range(4):
        world.write("hq", *random_rows(random.Random(20 + batch), 30, ("f1",), start=5000 + 100 * batch))
        await world.run("hq", max_message_size=10_000)
    files = data_files(world, "f1")
    contents = [(p.name, p.read_bytes()) for p in files]
    for path in files:
        path.unlink()
    # Arrive in reverse order, one at a time, each twice (with enough
    # patience that the gap is waited out rather than resent).
    for name, data in reversed(contents):
        for _ in range(2):
            (world.inbox("f1") / name).write_bytes(data)
            await world.run("f1", patience=50)
    assert len(world.rows("f1", "customer", "WHERE id >= 5000")) == 120
    await world.settle()


async def test_corrupt_and_forged_messages_are_quarantined_counted_and_resent(world):
    await world.settle()
    world.write("hq", *random_rows(random.Random(30), 20, ("f1",), start=6000))
    await world.run("hq")
    [first] = data_files(world, "f1")
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x10
    first.write_bytes(bytes(data))
    # A forged file: right name and format, signed with a key hq does not hold.
    forger = SiteKeys.generate("hq")
    from codec.packing import pack_messages
    from codec.ops import Operation, Transaction
    header = MessageName.parse(first.name).header
    [forged] = pack_messages([Transaction(header.last, "hq", (Operation.insert("customer", (9999,), {
        "id": 9999, "region": "f1", "name": "forged", "balance": 0.0, "photo": None}),))],
        keys=forger, recipient="f1", incarnation=os.urandom(16), resend_count=header.resend_count + 5,
        start=header.prev)
    (world.inbox("f1") / forged.name).write_bytes(forged.data)
    report = await world.run("f1")
    assert report.quarantined == 2
    quarantine = world.root / "f1.db.agent" / "quarantine"
    reasons = sorted(p.read_text() for p in quarantine.glob("*.reason.json"))
    assert any("signature" in r for r in reasons) and len(reasons) == 2
    await world.settle()
    assert world.rows("f1", "customer", "WHERE id = 9999") == []
    assert len(world.rows("f1", "customer", "WHERE id >= 6000")) == 20


async def test_a_site_restored_from_an_old_copy_is_reported_and_nothing_is_misapplied(world, tmp_path):
    await world.settle()
    backup = (world.db("f1")).read_bytes()
    world.write("f1", ("INSERT INTO ledger VALUES ('f1-a', 'f1', 1)", ()))
    world.write("hq", *random_rows(random.Random(40), 5, ("f1",), start=7000))
    await world.settle()
    hq_before = world.rows("hq", "ledger"), world.rows("hq", "customer")
    # f1's disk is replaced by the old copy (its WAL and shared memory too).
    for suffix in ("-wal", "-shm"):
        path = world.db("f1").with_name(world.db("f1").name + suffix)
        if path.exists():
            path.unlink()
    world.db("f1").write_bytes(backup)
    world.write("f1", ("INSERT INTO ledger VALUES ('f1-b', 'f1', 2)", ()))
    report = await world.run("f1")
    assert any("restored" in line for line in report.stopped_streams)
    report = await world.run("hq")
    assert any("incarnation" in line for line in report.stopped_streams)
    for _ in range(3):
        await world.round()
    # Nothing from the restored copy was applied at hq, and hq's data is intact.
    assert world.rows("hq", "ledger") == hq_before[0] and world.rows("hq", "customer") == hq_before[1]


async def test_late_mail_from_a_copy_extracted_again_is_set_aside_as_such(world):
    await world.settle()
    world.write("f1", ("INSERT INTO ledger VALUES ('f1-old', 'f1', 1)", ()))
    await world.run("f1")
    waiting = {path.name for path in world.inbox_files("hq") if path.name.startswith("f1.")}
    assert any(".d." in name for name in waiting)  # f1's data message waits in hq's inbox
    with SiteDatabase.open(world.db("f1")) as f1:
        old = f1.identity.incarnation
    # f1's device is lost; the operator extracts f1 again (new keys, new incarnation).
    for suffix in ("", "-wal", "-shm"):
        world.db("f1").with_name(f"f1.db{suffix}").unlink(missing_ok=True)
    shutil.rmtree(agent_directory(world.db("f1")))
    with SiteDatabase.open(world.db("hq")) as hq:
        extract_site(hq, "f1", world.db("f1"))
    report = await world.run("hq")
    assert report.quarantined == len(waiting) and report.ok, report
    records = [json.loads(path.read_text())
               for path in (agent_directory(world.db("hq")) / "quarantine").glob("*.reason.json")]
    assert {record["name"] for record in records} == waiting
    for record in records:
        assert record["peer"] == "f1"
        assert record["reason"].startswith(f"{record['name']}: signature does not verify with the key of f1")
        assert (f"f1's incarnation {old.hex()[:8]}, a copy that was extracted again since"
                in record["reason"]), record
    assert world.rows("hq", "ledger", "WHERE entry = 'f1-old'") == []
    await world.settle()
    assert world.rows("f1", "ledger", "WHERE entry = 'f1-old'") == []


def extract_again_keeping_keys(world: World, remote: str) -> bytes:
    """The operator replaces ``remote``'s database with a new extraction
    that keeps the device's keys; returns the replaced copy's incarnation."""
    with SiteDatabase.open(world.db(remote)) as old:
        keys = site_keys(old)
        incarnation = old.identity.incarnation
    for suffix in ("", "-wal", "-shm"):
        world.db(remote).with_name(f"{remote}.db{suffix}").unlink(missing_ok=True)
    shutil.rmtree(agent_directory(world.db(remote)))
    with SiteDatabase.open(world.db("hq")) as hq:
        extract_site(hq, remote, world.db(remote), keys=keys)
    return incarnation


async def test_late_mail_of_a_copy_the_consolidated_agent_never_saw_is_set_aside(world):
    """Extraction records the copy it replaces in the database.  So the files
    of a copy that was extracted and replaced again while the consolidated's
    agent did not run are late mail, deleted as stale (they verify: the keys
    were kept), not taken for a restored site's, which would stop the stream."""
    await world.settle()
    extract_again_keeping_keys(world, "f1")
    world.write("f1", ("INSERT INTO ledger VALUES ('f1-b', 'f1', 1)", ()))
    await world.run("f1")  # the short-lived copy sends; hq's agent does not run meanwhile
    waiting = {name for name in world.waiting_names("hq") if name.startswith("f1.hq.d.")}
    assert waiting
    short_lived = extract_again_keeping_keys(world, "f1")
    with SiteDatabase.open(world.db("hq")) as hq:
        assert short_lived in hq.replaced_incarnations("f1")
    report = await world.run("hq")
    assert report.ok and not report.stopped_streams and report.quarantined == 0, report
    assert waiting.isdisjoint(world.waiting_names("hq"))
    assert world.rows("hq", "ledger", "WHERE entry = 'f1-b'") == []
    await world.settle()
    assert world.rows("f1", "ledger", "WHERE entry = 'f1-b'") == []


async def test_a_confirmation_meant_for_the_replaced_copy_confirms_nothing_of_the_new_one(world):
    """The consolidated's confirmation of the old copy's log arrives late at
    the new copy (it opens there: the keys were kept).  It counts offsets of
    another log, so it must not confirm the new copy's own messages: if it
    did, a resend would start after them, and the lost ones never arrive."""
    await world.settle()
    for number in range(3):
        world.write("f1", (f"INSERT INTO ledger VALUES ('f1-a{number}', 'f1', 1)", ()))
    await world.run("f1")
    await world.run("hq")  # applies the old copy's entries and confirms them
    held = {path.name: path.read_bytes() for path in world.inbox_files("f1") if path.name.startswith("hq.f1.c.")}
    assert held
    for name in held:
        (world.inbox("f1") / name).unlink()
    extract_again_keeping_keys(world, "f1")
    for number in range(3):
        world.write("f1", (f"INSERT INTO ledger VALUES ('f1-b{number}', 'f1', 1)", ()))
    await world.run("f1")
    lost = [path for path in world.inbox_files("hq") if path.name.startswith("f1.hq.d.")]
    assert lost
    for path in lost:
        path.unlink()
    for name, data in held.items():
        (world.inbox("f1") / name).write_bytes(data)
    await world.run("f1")
    with SiteDatabase.open(world.db("f1")) as f1:
        assert f1.remote("hq").confirm_sent == 0
    await world.settle()
    assert [row[0] for row in world.rows("hq", "ledger", "WHERE entry LIKE 'f1-b%'")] == ["f1-b0", "f1-b1", "f1-b2"]


async def test_keep_leaves_every_file_in_the_inbox_and_takes_each_in_once(world, monkeypatch):
    from agent.spool import SpoolQueues

    queued: list[str] = []
    put_inbound = SpoolQueues.put_inbound

    def counting(self, peer, name, data):
        queued.append(name)
        return put_inbound(self, peer, name, data)

    monkeypatch.setattr(SpoolQueues, "put_inbound", counting)
    await world.settle()
    world.write("hq", *random_rows(random.Random(50), 5, ("f1",), start=8000))
    await world.run("hq")
    (world.inbox("f1") / "not-a-message.txt").write_bytes(b"junk")  # not for f1: left alone
    waiting = world.waiting_names("f1")
    data = [name for name in waiting if ".d." in name]
    assert data, waiting
    # For f1 by its name, and no message: set aside.
    last_data = MessageName.parse(data[-1])
    broken = str(MessageName("hq", "f1", last_data.kind, dataclasses.replace(last_data.header, seq=last_data.header.seq + 7)))
    (world.inbox("f1") / broken).write_bytes(b"junk")
    waiting = world.waiting_names("f1")
    queued.clear()
    report = await world.run("f1", keep=True)
    assert report.applied_messages == len(data) and report.quarantined == 1, report
    assert report.left_in_inbox == 1, report
    assert world.waiting_names("f1") == waiting  # nothing was deleted
    assert len(world.rows("f1", "customer", "WHERE id >= 8000")) == 5
    assert queued == data
    quarantine = agent_directory(world.db("f1")) / "quarantine"
    assert [json.loads(path.read_text())["name"] for path in quarantine.glob("*.reason.json")] == [broken]
    # Read again at the next poll: nothing queued, applied or set aside twice.
    queued.clear()
    again = await world.run("f1", keep=True)
    assert again.applied_messages == 0 and again.quarantined == 0 and queued == [], (again, queued)
    assert world.waiting_names("f1") == waiting
    assert len(list(quarantine.glob("*.reason.json"))) == 1
    # Without --keep the files go: the data ones as duplicates; the broken one
    # is read afresh (as a file an operator put back would be) and set aside;
    # the file that is not for f1 stays.
    last = await world.run("f1")
    assert last.applied_messages == 0 and last.quarantined == 1, last
    assert not any(".d." in name for name in world.waiting_names("f1"))
    assert "not-a-message.txt" in world.waiting_names("f1")
    await world.settle()


async def test_an_apply_the_database_refuses_is_a_local_error_not_a_transport_error(world, monkeypatch):
    """The site database refuses an apply (locked, say): the run reports a
    local error, never a transport error (no transport failed), and the
    messages stay queued for the next run to apply."""
    from agent.site.errors import SiteError

    await world.settle()
    world.write("hq", *random_rows(random.Random(70), 4, ("f1",), start=7000))
    await world.run("hq")
    apply = SiteDatabase.apply

    def refused(self, *args, **kwargs):
        raise SiteError("database is locked")

    monkeypatch.setattr(SiteDatabase, "apply", refused)
    report = await world.run("f1")
    assert report.local_errors == ["applying from hq: database is locked"], report
    assert report.transport_errors == [] and not report.ok and report.applied_messages == 0
    assert world.rows("f1", "customer", "WHERE id >= 7000") == []
    monkeypatch.setattr(SiteDatabase, "apply", apply)
    again = await world.run("f1")
    assert again.ok and again.applied_messages == 1, again
    assert len(world.rows("f1", "customer", "WHERE id >= 7000")) == 4
    await world.settle()


async def test_a_receive_phase_cancelled_during_an_apply_finishes_that_apply_first(world, monkeypatch):
    """An application cancels the task running a receive phase while the
    database applies a message: the apply, the spool's dequeue and the
    protocol go together (I4), and the same agent applies the rest later."""
    import asyncio
    import threading

    from agent.runner import Agent

    await world.settle()
    for batch in range(3):  # three messages for f1, applied one after the other
        world.write("hq", *random_rows(random.Random(80 + batch), 4, ("f1",), start=9000 + 10 * batch))
        await world.run("hq")
    entered, release = threading.Event(), threading.Event()
    apply = SiteDatabase.apply
    calls = 0

    def held_apply(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 1:
            entered.set()
            assert release.wait(30)
        return apply(self, *args, **kwargs)

    monkeypatch.setattr(SiteDatabase, "apply", held_apply)
    monkeypatch.setattr(protocol_module, "CHAIN_MESSAGES", 1)  # one message an apply (rule 2 would take all three)
    async with Agent(world.db("f1"), dataclasses.replace(world.run_options("f1"), send=False)) as agent:
        task = asyncio.create_task(agent.receive_phase())
        await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        await asyncio.sleep(0.1)
        assert not task.done()  # the apply under way is finished first
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        peer = agent.peers["hq"]
        assert peer.protocol.applying is None
        assert peer.protocol.state.log_received == agent.db.remote("hq").log_received > 0
        assert agent.report.applied_messages == 1
        await agent.receive_phase()  # the same agent goes on with the rest
        assert agent.report.applied_messages == 3 and calls == 3
    world.check_invariants()
    assert len(world.rows("f1", "customer", "WHERE id >= 9000")) == 12
    await world.settle()


def test_a_site_database_the_agent_cannot_write_is_one_clear_line(tmp_path):
    from agent.errors import AgentError
    from agent.restore import check_restored

    world = World(tmp_path / "w", remotes=("f1",))
    with SiteDatabase.open(world.db("hq")) as site:
        site.connection.execute("PRAGMA query_only = ON")  # as a read-only file or folder would
        with pytest.raises(AgentError) as caught:
            check_restored(site, tmp_path)
    assert str(caught.value) == (f"{world.db('hq')}: the agent cannot write to the site database (attempt to write "
                                 "a readonly database); it needs the file and its folder writable")
    assert not (tmp_path / "state").exists()
