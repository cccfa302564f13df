"""Applying a remote's transactions at the consolidated, on both backends:
each message atomic with its log_received, replays skipped, bad batches
refused whole, bad rows recorded without stopping the rest, conflicts
resolved by policy or hook and recorded, the row sent back to its origin,
and the peer's incarnation checked.  Each test runs in both forms decoded
transactions take (tests/site/conftest.py: operations and runs)."""

from __future__ import annotations

import pytest

from agent.site import ApplyRefused, Article, ConflictHookFailed, IncarnationMismatch, Resolution, UnknownRemote
from codec.ops import Operation

from ..applying import ins, txn, upd

CUSTOMER = "id, name, region, balance"


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("sales", [Article("customer", subscribe_by="region"), Article("line")])
    for remote in ("r1", "r2"):
        site.add_remote(remote)
        site.subscribe(remote, "sales", "north")
    return site


def test_a_batch_is_applied_with_its_log_received(backend, hq):
    result = hq.apply("r1", [txn(10, ins(1, name="a", region="north"), ins(2, name="b", region="north")),
                             txn(20, upd(1, {"name": "a"}, {"name": "a2"}))], log_received=25, messages=2)
    assert backend.rows("customer", CUSTOMER) == [(1, "a2", "north", None), (2, "b", "north", None)]
    row = hq.remote("r1")
    assert (row.log_received, row.receive_count) == (25, 2) and row.last_received_at is not None
    assert (result.transactions_applied, result.operations_applied, result.errors, result.conflicts) == (2, 3, 0, 0)


def test_transactions_already_applied_are_skipped(backend, hq):
    hq.apply("r1", [txn(10, ins(1, name="a"))], log_received=10)
    result = hq.apply("r1", [txn(10, ins(1, name="a")), txn(12, ins(2, name="b"))], log_received=12)
    assert (result.transactions_skipped, result.transactions_applied, result.errors) == (1, 1, 0)
    assert backend.rows("customer", "id, name") == [(1, "a"), (2, "b")]


def test_skip_through_replaces_the_recorded_log_received(hq):
    hq.apply("r1", [txn(10, ins(1, name="a"))], log_received=10)
    result = hq.apply("r1", [txn(10, ins(1, name="a")), txn(12, ins(2, name="b"))], log_received=12,
                      skip_through=0)
    assert (result.transactions_skipped, result.transactions_applied, result.errors) == (0, 2, 1)
    assert hq.apply("r1", [txn(12, ins(2, name="b"))], log_received=12, skip_through=12).transactions_skipped == 1
    with pytest.raises(ApplyRefused, match="skip_through"):
        hq.apply("r1", [txn(20, ins(3))], log_received=20, skip_through=13)
    assert hq.remote("r1").log_received == 12


def test_bad_batches_are_refused_whole(backend, hq):
    hq.apply("r1", [txn(10, ins(1))], log_received=10)
    end = hq.scan()
    with pytest.raises(ApplyRefused, match="go back"):
        hq.apply("r1", [], log_received=9)
    with pytest.raises(ApplyRefused, match="out of order"):
        hq.apply("r1", [txn(14, ins(2)), txn(12, ins(3))], log_received=20)
    with pytest.raises(ApplyRefused, match="beyond the new log_received"):
        hq.apply("r1", [txn(14, ins(2)), txn(30, ins(3))], log_received=20)
    with pytest.raises(UnknownRemote):
        hq.apply("ghost", [], log_received=1)
    assert backend.rows("customer", "id, name") == [(1, None)]  # nothing of the refused batches
    assert hq.remote("r1").log_received == 10
    assert hq.scan() == end  # nothing logged either


def test_an_empty_batch_moves_log_received(hq):
    hq.apply("r1", [], log_received=44)
    assert hq.remote("r1").log_received == 44


def test_bad_rows_are_recorded_and_the_batch_goes_on(backend, hq):
    backend.app().execute("INSERT INTO customer (id, name) VALUES (1, 'local')")
    batch = [txn(5,
                 ins(1, name="duplicate"),                                    # existing key
                 upd(99, {"name": "x"}, {"name": "y"}),                       # missing row
                 Operation.delete("customer", (98,), {"id": 98}),             # missing row
                 Operation.insert("line", (1, 1), {"order_id": 1, "line_no": 1, "sku": None}),  # NOT NULL
                 Operation.insert("nowhere", (1,), {"id": 1}),                # no such table
                 ins(3, colour="red"),                                         # no such column
                 ("customer", 1, (4,), None, {"id": 4, "name": True}),         # bool is no SQL value
                 ("customer", 1, (5,), None, {"id": 5, "name": 2**64}),        # beyond 64 bits
                 ins(2, name="fine")),
             txn(6, ins(6, name="also fine"))]
    result = hq.apply("r1", batch, log_received=6)
    assert (result.errors, result.operations_applied, result.transactions_applied) == (8, 2, 2)
    assert backend.rows("customer", "id, name") == [(1, "local"), (2, "fine"), (6, "also fine")]
    errors = hq.apply_errors()
    # Recorded in the order each backend meets them (PostgreSQL's NOT NULL failure comes from a retry).
    problems = {(error.table, error.key): error.problem.split(":")[0] for error in errors}
    assert len(problems) == len(errors) == 8
    assert problems[("customer", (1,))] == "INSERT of an existing key"
    assert problems[("customer", (99,))] == "UPDATE of a missing row"
    assert problems[("customer", (98,))] == "DELETE of a missing row"
    assert ("line", (1, 1)) in problems
    # SQLite applies to any table with a key, PostgreSQL to published ones (docs/postgres.md, "Apply").
    assert problems[("nowhere", (1,))] in ("no table 'nowhere' with a primary key at this site",
                                           "no published table 'nowhere' at this site")
    assert problems[("customer", (3,))] == "customer has no column 'colour' at this site"
    assert problems[("customer", (4,))] == problems[("customer", (5,))] == "malformed operation"
    assert all(error.peer == "r1" and error.peer_commit == 5 for error in errors)
    assert errors[0].operation == ("customer", 1, (1,), None, {"id": 1, "name": "duplicate"})
    assert hq.remote("r1").log_received == 6
    assert hq.open_apply_errors() == {"r1": 8}


def test_a_failing_run_is_replayed_one_by_one(backend, hq):
    """One bad row in the middle of a long run of similar rows: the rows
    around it are applied, the bad one recorded."""
    ops = [ins(row_id, name=f"n{row_id}") for row_id in range(1, 301)]
    backend.app().execute("INSERT INTO customer (id, name) VALUES (150, 'already here')")
    result = hq.apply("r1", [txn(3, *ops)], log_received=3)
    assert (result.operations_applied, result.errors) == (299, 1)
    assert len(backend.rows("customer", "id, name")) == 300
    assert [error.key for error in hq.apply_errors()] == [(150,)]


def test_applied_rows_are_captured_with_the_peer_as_origin(backend, hq):
    hq.apply("r1", [txn(5, ins(1, name="x", region="north"))], log_received=5)
    hq.scan()
    (transaction,) = hq.read_log("r2", 0)
    assert transaction.origin == "r1"
    assert transaction.ops == (ins(1, name="x", region="north", balance=None, photo=None),)
    assert list(hq.read_log("r1", 0)) == []  # no echo


def test_incarnation_change_stops_the_stream(hq):
    hq.apply("r1", [], log_received=1, peer_incarnation=b"A" * 16)
    assert hq.remote("r1").peer_incarnation == b"A" * 16
    hq.apply("r1", [], log_received=2, peer_incarnation=b"A" * 16)
    with pytest.raises(IncarnationMismatch, match="rebuilt or restored"):
        hq.apply("r1", [], log_received=3, peer_incarnation=b"B" * 16)
    assert hq.remote("r1").log_received == 2


def conflict_setup(backend):
    """Row 1 is 'base' at r1, but the consolidated changed it meanwhile."""
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, 'base', 'north', 10.0)")
    app.execute("UPDATE customer SET name = 'hq edit', balance = 11.0 WHERE id = 1")
    return backend.site.scan()


def test_conflict_incoming_wins_by_default_and_goes_back_to_the_origin(backend, hq):
    start = conflict_setup(backend)
    result = hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert result.conflicts == 1 and result.errors == 0
    assert backend.rows("customer", CUSTOMER) == [(1, "r1 edit", "north", 11.0)]
    (conflict,) = hq.conflicts()
    assert (conflict.peer, conflict.peer_commit, conflict.table, conflict.key) == ("r1", 5, "customer", (1,))
    assert conflict.local_row["name"] == "hq edit"
    assert conflict.incoming_before == {"name": "base"} and conflict.incoming_after == {"name": "r1 edit"}
    assert conflict.resolution == "incoming" and conflict.result_row["name"] == "r1 edit"
    # The origin gets the columns of the conflict back as they ended up, to
    # apply after hq's own (older) change, which reaches it first.
    assert backend.read_ops("r1", start) == [upd(1, {"name": "r1 edit"}, {"name": "r1 edit"})]
    # Everyone else gets the change once, as an ordinary update.
    assert backend.read_ops("r2", start) == [upd(1, {"name": "hq edit"}, {"name": "r1 edit"})]


def test_conflict_policy_local_keeps_the_row_and_sends_it_back(backend, hq):
    start = conflict_setup(backend)
    hq.set_conflict_policy("customer", "local")
    result = hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert result.conflicts == 1
    assert backend.rows("customer", "name") == [("hq edit",)]
    assert hq.conflicts()[0].resolution == "local"
    (back,) = backend.read_ops("r1", start)
    assert back.after["name"] == "hq edit" and back.before["name"] == "r1 edit"
    assert list(hq.read_log("r2", start)) == []  # nothing changed here
    hq.set_conflict_policy("customer", None)
    hq.apply("r1", [txn(6, upd(1, {"name": "r1 edit"}, {"name": "again"}))], log_received=6)
    assert backend.rows("customer", "name") == [("again",)]


def test_conflict_hook_can_merge(backend, hq):
    conflict_setup(backend)
    seen = []

    def merge(conflict):
        seen.append(conflict)
        return {"name": f"{conflict.local_row['name']} + {conflict.incoming.after['name']}"}

    hq.set_conflict_hook("customer", merge)
    hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert backend.rows("customer", "name") == [("hq edit + r1 edit",)]
    assert seen[0].peer == "r1" and seen[0].key == (1,)
    assert hq.conflicts()[0].resolution == "merged"


def test_conflict_hook_choosing_local(backend, hq):
    conflict_setup(backend)
    hq.set_conflict_hook(None, lambda conflict: Resolution.LOCAL)
    hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert backend.rows("customer", "name") == [("hq edit",)]


def test_a_failing_hook_rolls_the_batch_back(backend, hq):
    conflict_setup(backend)

    def broken(conflict):
        raise KeyError("oops")

    hq.set_conflict_hook("customer", broken)
    with pytest.raises(ConflictHookFailed, match="KeyError"):
        hq.apply("r1", [txn(5, ins(2), upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert backend.rows("customer", "id") == [(1,)]
    assert hq.remote("r1").log_received == 0 and hq.conflicts() == ()
    hq.set_conflict_hook("customer", lambda conflict: "whatever")
    with pytest.raises(ConflictHookFailed, match="not a Resolution"):
        hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)


def test_duplicate_insert_at_the_consolidated_sends_its_row_back(backend, hq):
    backend.app().execute("INSERT INTO customer (id, name, region) VALUES (1, 'hq row', 'north')")
    start = hq.scan()
    result = hq.apply("r1", [txn(5, ins(1, name="r1 row", region="north"))], log_received=5)
    assert result.errors == 1
    (back,) = backend.read_ops("r1", start)
    assert back.kind == 2 and back.after["name"] == "hq row"


def test_a_key_moved_at_the_consolidated_reaches_the_origin_as_its_new_key(backend, hq):
    """r1 changes row 1, which the consolidated meanwhile gave key 10: the
    change lands on row 10, and r1 and r2 each end with the row under its
    new key."""
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north')")
    start = hq.scan()
    app.execute("UPDATE customer SET id = 10 WHERE id = 1")
    hq.apply("r1", [txn(5, upd(1, {"name": "Ana"}, {"name": "Ana r1"}))], log_received=5)
    assert backend.rows("customer", "id, name") == [(10, "Ana r1")]
    assert hq.apply_errors() == ()
    to_r2 = backend.read_ops("r2", start)
    assert [(op.kind, op.key) for op in to_r2][0] == (2, (1,)) and to_r2[0].after == {"id": 10}
    assert [op.key for op in backend.read_ops("r1", start)][0] == (1,)
