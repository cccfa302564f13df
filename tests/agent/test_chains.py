"""Rule 2's consecutive messages in one apply, end to end through folder
inboxes (docs/protocol.md): the files a receive poll finds are queued
first, then applied several to a database transaction; a message of them
that cannot be decoded is set aside alone, and the rest arrive in order."""

from __future__ import annotations

import random

import pytest

from agent.site import MessageChain, SiteDatabase

from .test_scenarios import world  # noqa: F401  (the scenarios' world: hq, f1 and f2 extracted)
from .world import data_files, random_rows


def applies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The messages of each database apply, as they happen (a chain's read
    to count them, then handed over as read)."""
    made: list[int] = []
    apply = SiteDatabase.apply

    def counted_reading(self, peer, transactions, **kwargs):
        if isinstance(transactions, MessageChain):
            messages = [(list(message), last) for message, last in transactions.messages]
            made.append(len(messages))
            transactions = MessageChain(messages)
        else:
            made.append(1)
        return apply(self, peer, transactions, **kwargs)

    monkeypatch.setattr(SiteDatabase, "apply", counted_reading)
    return made


async def test_a_backlog_received_together_is_applied_in_few_transactions(world, monkeypatch):
    await world.settle()
    for batch in range(5):  # five messages for f1, waiting in its inbox together
        world.write("hq", *random_rows(random.Random(90 + batch), 4, ("f1",), start=7000 + 10 * batch))
        await world.run("hq")
    assert len(data_files(world, "f1")) == 5
    made = applies(monkeypatch)
    report = await world.run("f1")
    assert made == [5] and report.applied_messages == 5
    assert len(world.rows("f1", "customer", "WHERE id >= 7000")) == 20
    world.check_invariants()
    await world.settle()
    world.check_converged()


async def test_a_message_that_cannot_be_decoded_is_set_aside_alone(world, monkeypatch):
    """The third of five is signed but holds a payload that does not decode
    (a faulty peer): the two before it are applied, it is set aside, the
    two after it wait; its resend fills the gap and all arrive in order."""
    import agent.inbound as inbound

    await world.settle()
    for batch in range(5):
        world.write("hq", *random_rows(random.Random(95 + batch), 3, ("f1",), start=8000 + 10 * batch))
        await world.run("hq")
    names = sorted(path.name for path in data_files(world, "f1"))
    bad = names[2]
    decode = inbound.decode_message

    def faulty(data, *, source, **kwargs):
        if source == bad:
            from codec.errors import CorruptMessage

            raise CorruptMessage(source, "payload is not valid msgpack (injected)")
        return decode(data, source=source, **kwargs)

    monkeypatch.setattr(inbound, "decode_message", faulty)
    report = await world.run("f1")
    assert report.quarantined == 1 and report.applied_messages == 2
    assert len(world.rows("f1", "customer", "WHERE id >= 8000")) == 6  # the first two messages' rows
    monkeypatch.undo()
    await world.settle()
    world.check_invariants()
    world.check_converged()
    assert len(world.rows("f1", "customer", "WHERE id >= 8000")) == 15
