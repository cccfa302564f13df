"""Consecutive messages applied in one database transaction (a
MessageChain, docs/protocol.md rule 2), on both backends: each message as
an apply of its own would be (its batch, its log_received, its count), all
of it or nothing."""

from __future__ import annotations

import pytest

from agent.site import ApplyRefused, Article, MessageChain
from codec.ops import operations_of

from ..applying import ins, txn, upd

CUSTOMER = "id, name, region, balance"


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("sales", [Article("customer", subscribe_by="region")])
    site.add_remote("r1")
    site.subscribe("r1", "sales", "north")
    return site


def messages() -> list[tuple[list, int]]:
    """Three consecutive messages of r1: (0, 15], (15, 25], (25, 30]."""
    return [([txn(10, ins(1, name="a", region="north")), txn(12, ins(2, name="b", region="north"))], 15),
            ([txn(20, upd(1, {"name": "a"}, {"name": "a2"}))], 25),
            ([txn(30, ins(3, name="c", region="north"))], 30)]


def test_consecutive_messages_go_in_one_apply_as_each_would_alone(backend, hq):
    taken = []

    def lazily(index, transactions):  # each message read in turn (on SQLite, as the apply reaches it)
        taken.append(index)
        yield from transactions

    chain = MessageChain((lazily(index, transactions), last) for index, (transactions, last) in enumerate(messages()))
    result = hq.apply("r1", chain, log_received=30)
    assert taken == [0, 1, 2]
    assert backend.rows("customer", CUSTOMER) == [(1, "a2", "north", None), (2, "b", "north", None),
                                                  (3, "c", "north", None)]
    row = hq.remote("r1")
    assert (row.log_received, row.receive_count) == (30, 3)  # three messages, as three applies count them
    assert (result.log_received, result.transactions_applied, result.operations_applied) == (30, 4, 4)


def test_a_chain_after_a_lost_confirmation_skips_what_was_applied(backend, hq):
    first, *rest = messages()
    hq.apply("r1", first[0], log_received=first[1])
    chain = MessageChain([first, *rest])  # the first message again (its confirmation was lost)
    result = hq.apply("r1", chain, log_received=30, skip_through=15)
    assert (result.transactions_skipped, result.transactions_applied) == (2, 2)
    assert backend.rows("customer", "id, name") == [(1, "a2"), (2, "b"), (3, "c")]
    assert hq.remote("r1").receive_count == 4


def test_a_chain_whose_last_message_is_refused_applies_nothing(backend, hq):
    broken = messages()
    broken[2] = ([txn(40, ins(3, name="c", region="north"))], 30)  # a transaction beyond its log_received
    with pytest.raises(ApplyRefused):
        hq.apply("r1", MessageChain(broken), log_received=30)
    assert backend.rows("customer", CUSTOMER) == []
    assert (hq.remote("r1").log_received, hq.remote("r1").receive_count) == (0, 0)


def _name_r1_takes(hq, start: int, end: int) -> str:
    """Customer 1's name once r1 has taken hq's log in ``(start, end]`` in order ("a" before)."""
    taken = "a"
    for transaction in hq.read_log("r1", start, end):
        for op in operations_of(transaction.ops):
            if op.table == "customer" and op.key == (1,) and op.after is not None and "name" in op.after:
                taken = op.after["name"]
    return taken


def _conflicting_chain() -> MessageChain:
    """Two messages of r1 that change customer 1 ("a" to "a2", then to
    "a3"), the first written without hq's change of it: a conflict."""
    return MessageChain([([txn(20, upd(1, {"name": "a"}, {"name": "a2"}))], 25),
                         ([txn(30, upd(1, {"name": "a2"}, {"name": "a3"}))], 30)])


@pytest.mark.parametrize("hq_change", ["unconfirmed by r1", "confirmed by r1"])
def test_a_row_written_back_by_one_message_and_changed_by_the_next_goes_back_as_it_ends(backend, hq, hq_change):
    """A chain of two messages of r1 that change customer 1, the first
    written without hq's change of it (a conflict, whose result goes back to
    r1), the second after the first.  Each message then writes the row back
    as it leaves it (the unconfirmed rule: the second finds the first's row
    written back, which r1 has not confirmed, and hq's own change when r1 has
    not confirmed it either), and r1, which takes hq's log in order, ends
    with hq's row.  In one database transaction the second message must see
    the first's row written back all the same (on PostgreSQL it is in no log
    transaction yet), and two messages that write rows back record what the
    apply had applied once (the first's, the least)."""
    app = backend.app()
    app.run("INSERT INTO customer (id, name, region) VALUES (1, 'a', 'north')")
    hq.scan()
    app.run("UPDATE customer SET name = 'changed at hq' WHERE id = 1")
    start = hq.remote("r1").log_sent
    if hq_change == "confirmed by r1":  # r1 took hq's change already: only the first message's row is unconfirmed
        start = hq.scan()
        hq.update_remote("r1", log_sent=start, confirm_sent=start)
    result = hq.apply("r1", _conflicting_chain(), log_received=30)
    assert result.conflicts == 1
    end = hq.scan()
    [(name,)] = backend.rows("customer", "name")
    assert name == "a3"
    assert _name_r1_takes(hq, start, end) == name
