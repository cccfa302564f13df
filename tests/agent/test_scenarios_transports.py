"""The fault scenarios of test_scenarios.py over folder, sftp and email.

The same consolidated and two remotes on real SQLite files, the real agent,
and the real transports: folder inboxes, directories on an OpenSSH server
read and written over SFTP, and Dovecot mailboxes fed through an SMTP
server.  Faults are applied between runs where each transport keeps its
files (see transport_worlds.py); the World checks the invariants after
every run and convergence at quiescence, as in test_scenarios.py.
"""

import os
import random

import pytest

from agent.site import SiteDatabase
from codec.keys import SiteKeys
from codec.names import MessageName
from codec.ops import Operation, Transaction
from codec.packing import pack_messages

from .transport_worlds import (TRANSPORTS, TransportWorld, mail_servers, make_medium,  # noqa: F401 (fixtures)
                               quarantine_reasons, sshd)
from .world import random_rows

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=TRANSPORTS)
def world(request, tmp_path) -> TransportWorld:
    root = tmp_path / "world"
    world = TransportWorld(root, make_medium(request.param, root, request))
    world.write("hq", *random_rows(random.Random(1), 20, ("f1", "f2")))
    world.extract_all()
    return world


def remote_row(world: TransportWorld, site: str, peer: str):
    with SiteDatabase.open(world.db(site)) as db:
        return db.remote(peer)


async def send_batches(world: TransportWorld, batches: int, rows: int, start: int, seed: int) -> None:
    """``batches`` transactions of ``rows`` customers of f1, each sent by its own run of hq."""
    for batch in range(batches):
        world.write("hq", *random_rows(random.Random(seed + batch), rows, ("f1",), start=start + 100 * batch))
        await world.run("hq", max_message_size=10_000)


async def test_two_way_replication(world):
    world.write("hq", *random_rows(random.Random(2), 10, ("f1", "f2"), start=100))
    world.write("f1", ("INSERT INTO customer VALUES (500, 'f1', 'made in the field', 1.5, x'00ff')", ()))
    world.write("f2", ("INSERT INTO ledger VALUES ('f2-1', 'f2', 7)", ()))
    await world.settle()
    assert world.rows("hq", "customer", "WHERE id = 500") == [(500, "f1", "made in the field", 1.5, b"\x00\xff")]
    assert world.rows("f1", "ledger") == [("f2-1", "f2", 7)]


async def test_a_lost_message_is_resent_in_a_new_epoch_and_applied_once(world):
    await world.settle()
    epoch = remote_row(world, "hq", "f1").resend_count  # extraction starts the streams in epoch 1
    await send_batches(world, 3, 40, start=2000, seed=0)
    files = world.waiting("f1", "d")
    assert len(files) >= 3
    lost = files[1]
    world.lose(lost)
    await world.settle()
    assert remote_row(world, "hq", "f1").resend_count > epoch
    assert remote_row(world, "f1", "hq").rereceive_count > epoch
    assert len(world.rows("f1", "customer", "WHERE id >= 2000")) == 120
    # The old-epoch copy arrives late: deleted as stale, never applied.
    world.deliver("f1", lost.name, lost.data)
    report = await world.run("f1")
    assert report.received >= 1 and report.applied_messages == 0
    assert lost.name not in world.waiting_names("f1")
    await world.settle()
    assert len(world.rows("f1", "customer", "WHERE id >= 2000")) == 120


async def test_a_duplicated_message_is_applied_once(world):
    await world.settle()
    await send_batches(world, 4, 30, start=5000, seed=20)
    files = world.waiting("f1", "d")
    for item in files:
        world.lose(item)
    # One at a time, in order, each twice (with enough patience that the
    # slow delivery is waited out rather than taken for a loss).
    applied = 0
    for item in files:
        for _ in range(2):  # the copy arrives again after the first was applied
            world.deliver("f1", item.name, item.data)
            applied += (await world.run("f1", patience=50)).applied_messages
    assert applied == len(files)
    # Two copies waiting at once (a send retried after a lost reply): applied before, so never again,
    # and both removed, each once it was read (email reads one copy of a name a receive).
    world.deliver("f1", files[-1].name, files[-1].data)
    world.deliver("f1", files[-1].name, files[-1].data)
    report = await world.run("f1", patience=50)
    assert report.received >= 1 and report.applied_messages == 0
    if world.waiting("f1", "d"):
        report = await world.run("f1", patience=50)
        assert report.received == 1 and report.applied_messages == 0
    assert not world.waiting("f1", "d")
    assert len(world.rows("f1", "customer", "WHERE id >= 5000")) == 120
    await world.settle()


async def test_reversed_messages_wait_for_the_gap_and_apply_in_order_once(world):
    await world.settle()
    await send_batches(world, 4, 30, start=5000, seed=20)
    files = world.waiting("f1", "d")
    assert len(files) >= 4
    for item in files:
        world.lose(item)
    # Arrive in reverse order, one at a time, each twice (with enough
    # patience that the gap is waited out rather than resent).
    for number, item in enumerate(reversed(files)):
        for _ in range(2):
            world.deliver("f1", item.name, item.data)
            await world.run("f1", patience=50)
        expected = 120 if number == len(files) - 1 else 0
        assert len(world.rows("f1", "customer", "WHERE id >= 5000")) == expected
    assert world.counted("f1", "resend_requests") == 0
    assert world.counted("f1", "applied_messages") == len(files)
    await world.settle()


async def test_corrupt_and_forged_messages_are_quarantined_counted_and_resent(world):
    await world.settle()
    epoch = remote_row(world, "hq", "f1").resend_count
    world.write("hq", *random_rows(random.Random(30), 20, ("f1",), start=6000))
    await world.run("hq")
    [first] = world.waiting("f1", "d")
    damaged = bytearray(first.data)
    damaged[len(damaged) // 2] ^= 0x10
    world.replace("f1", first, bytes(damaged))
    # A forged file: right name and format, signed with a key hq does not hold.
    header = MessageName.parse(first.name).header
    [forged] = pack_messages([Transaction(header.last, "hq", (Operation.insert("customer", (9999,), {
        "id": 9999, "region": "f1", "name": "forged", "balance": 0.0, "photo": None}),))],
        keys=SiteKeys.generate("hq"), recipient="f1", incarnation=os.urandom(16),
        resend_count=header.resend_count + 5, start=header.prev)
    world.deliver("f1", forged.name, forged.data)
    report = await world.run("f1")
    assert report.quarantined == 2
    reasons = quarantine_reasons(world, "f1")
    assert any("signature" in reason for reason in reasons) and len(reasons) == 2
    await world.settle()
    assert remote_row(world, "hq", "f1").resend_count > epoch  # corrupt counts as missing: resent
    assert world.rows("f1", "customer", "WHERE id = 9999") == []
    assert len(world.rows("f1", "customer", "WHERE id >= 6000")) == 20


async def test_a_lost_confirmation_is_repaired_without_a_resend(world):
    await world.settle()
    epoch = remote_row(world, "hq", "f1").resend_count
    world.write("hq", *random_rows(random.Random(9), 5, ("f1",), start=3000))
    await world.run("hq")
    await world.run("f1")
    controls = [item for item in world.waiting("hq", "c") if item.name.startswith("f1.")]
    assert controls
    for item in controls:
        world.lose(item)
    await world.run("hq")
    row = remote_row(world, "hq", "f1")
    assert row.confirm_sent < row.log_sent  # hq never heard that f1 has it all
    await world.settle()  # confirm_sent == log_sent at every site again
    assert remote_row(world, "hq", "f1").resend_count == epoch
    assert len(world.rows("f1", "customer", "WHERE id >= 3000")) == 5


async def test_a_lost_last_message_is_detected_and_resent(world):
    await world.settle()
    epoch = remote_row(world, "hq", "f2").resend_count
    world.write("hq", *random_rows(random.Random(11), 5, ("f2",), start=4000))
    await world.run("hq")
    lost = world.waiting("f2", "d")
    assert len(lost) == 1
    world.lose(lost[0])  # the only data message is lost; the control message says what was sent
    await world.settle()
    assert remote_row(world, "hq", "f2").resend_count > epoch
    assert len(world.rows("f2", "customer", "WHERE id >= 4000")) == 5


async def test_another_sites_message_is_left_unread_and_named_once(world, monkeypatch, caplog):
    """A file for another site (a shared folder or mailbox, a wrong address)
    stays where it is; the transport does not even hand it over, so a
    mailbox shared by several sites costs a listing, not a download, at
    each poll."""
    from agent.receiving import Receiver

    await world.settle()
    world.write("hq", *random_rows(random.Random(70), 3, ("f2",), start=7000))
    await world.run("hq")
    [item, *_] = world.waiting("f2", "d")
    name, data = item.name, item.data
    world.deliver("f1", name, data)  # addressed to f2, in f1's inbox
    handed: list[str] = []
    receive_file = Receiver.receive_file

    async def recording(self, transport, incoming):
        handed.append(incoming.name)
        return await receive_file(self, transport, incoming)

    monkeypatch.setattr(Receiver, "receive_file", recording)
    caplog.set_level("WARNING", logger="fieldsync")
    for run in range(2):
        caplog.clear()
        report = await world.run("f1")
        assert report.left_in_inbox == 1, report
        # Warned about at the first run only, not at every one.
        assert [record.getMessage() for record in caplog.records if name in record.getMessage()] == ([
            f"left {name!r} in the inbox {world.medium.inbox_address('f1')}: addressed to f2, not f1 (is that "
            "this site's inbox?); it is not read or removed (warned once; `agent inbox` lists it)"] if run == 0 else [])
    assert name not in handed
    assert name in world.waiting_names("f1")
