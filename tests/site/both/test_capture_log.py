"""Capture and the log, on both backends: what application writes produce,
exactly; scans grouping committed transactions in commit order; reading
bounds; applied transactions logged with their origin; truncation."""

from __future__ import annotations

import pytest

from agent.site import Article, LogOffsetError, LogTruncated
from codec.ops import OpKind, Operation, Transaction

NO_PHOTO = {"balance": None, "photo": None}


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("all", [Article("customer"), Article("line")])
    site.add_remote("r1")
    site.subscribe("r1", "all")
    return site


def insert(app, *ids):
    app.run(*[("INSERT INTO customer (id, name) VALUES (%s, %s)", (row_id, f"n{row_id}")) for row_id in ids])


def test_plain_application_writes_are_captured(backend, hq):
    app = backend.app()
    app.run("INSERT INTO customer (id, name, region, balance) VALUES (1, 'Ana', 'north', 10.5)",
            "INSERT INTO customer (id, name, region, balance) VALUES (2, 'Bo', 'south', NULL)")
    app.execute("UPDATE customer SET balance = 11.0, name = 'Ana S' WHERE id = 1")
    app.execute("DELETE FROM customer WHERE id = 2")
    ops = backend.read_ops("r1")
    assert ops == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "region": "north", "balance": 10.5,
                                            "photo": None}),
        Operation.insert("customer", (2,), {"id": 2, "name": "Bo", "region": "south", **NO_PHOTO}),
        # UPDATE: key, old values of the changed columns only, new values.
        Operation.update("customer", (1,), {"name": "Ana", "balance": 10.5}, {"name": "Ana S", "balance": 11.0}),
        Operation.delete("customer", (2,), {"id": 2, "name": "Bo", "region": "south", **NO_PHOTO}),
    ]
    assert all(op.kind in (OpKind.INSERT, OpKind.UPDATE, OpKind.DELETE) for op in ops)


def test_composite_key_is_in_key_order(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO line VALUES (77, 3, 'SKU-1', 5)")
    app.execute("UPDATE line SET qty = 6 WHERE order_id = 77 AND line_no = 3")
    app.execute("UPDATE line SET line_no = 4 WHERE order_id = 77")  # a key change
    ops = backend.read_ops("r1")
    assert [op.key for op in ops] == [(3, 77), (3, 77), (3, 77)]
    assert ops[1].before == {"qty": 5} and ops[1].after == {"qty": 6}
    assert ops[2].before == {"line_no": 3} and ops[2].after == {"line_no": 4}


def test_update_that_changes_nothing_produces_no_operation(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO customer (id, name) VALUES (1, 'Ana')")
    end = hq.scan()
    app.execute("UPDATE customer SET name = name")
    assert backend.read_ops("r1", end) == []


def test_unpublished_tables_and_removed_articles_are_not_captured(backend, hq):
    app = backend.app()
    app.execute("CREATE TABLE scratch (id integer PRIMARY KEY, x text)")
    app.execute("INSERT INTO scratch VALUES (1, 'x')")
    assert hq.scan() == 0
    hq.remove_article("line")
    app.execute("INSERT INTO line VALUES (1, 1, 'a', 1)")
    assert hq.scan() == 0 and backend.read_ops("r1") == []
    app.execute("INSERT INTO customer (id) VALUES (1)")
    assert [op.table for op in backend.read_ops("r1")] == ["customer"]


def test_scan_groups_everything_committed_since_the_last_scan(backend, hq):
    app = backend.app()
    assert hq.scan() == 0  # nothing captured, no transaction
    insert(app, 1, 2)
    insert(app, 3)
    first = hq.scan()
    insert(app, 4)
    second = hq.scan()
    assert hq.scan() == second  # an empty scan adds nothing
    log = list(hq.read_log("r1", 0))
    assert [t.commit for t in log] == [first, second]
    assert 0 < first < second
    assert [[op.key for op in t.ops] for t in log] == [[(1,), (2,), (3,)], [(4,)]]
    assert all(t.origin == "hq" for t in log)
    assert hq.log_end() == second


def test_a_multi_row_transaction_keeps_its_order_and_transactions_their_commit_order(backend, hq):
    """Two sessions interleave: each transaction's operations stay in the
    order they were written, and transactions in the order they committed
    (the later-begun one committing first comes first)."""
    first, second = backend.app(), backend.app()
    start = hq.scan()
    hq.add_remote("r2")
    hq.subscribe("r2", "all")
    for row_id in (1, 2):
        insert(first, row_id)
        hq.scan()
    first.run(("INSERT INTO customer (id, name) VALUES (%s, 'c')", (10,)),
              "UPDATE customer SET name = 'c2' WHERE id = 10",
              "DELETE FROM customer WHERE id = 1")
    second.run("UPDATE customer SET name = 'late' WHERE id = 2", "INSERT INTO line VALUES (5, 1, 's', 1)")
    hq.scan()
    ops = [(op.kind, op.table, op.key) for t in hq.read_log("r1", start) for op in t.ops]
    assert ops == [(OpKind.INSERT, "customer", (1,)), (OpKind.INSERT, "customer", (2,)),
                   (OpKind.INSERT, "customer", (10,)), (OpKind.UPDATE, "customer", (10,)),
                   (OpKind.DELETE, "customer", (1,)),
                   (OpKind.UPDATE, "customer", (2,)), (OpKind.INSERT, "line", (1, 5))]


def test_offsets_strictly_increase_even_after_rolled_back_writes(backend, hq):
    app = backend.app()
    offsets = []
    for row_id in range(1, 6):
        with pytest.raises(backend.error):  # the insert is rolled back with its transaction
            app.run(("INSERT INTO customer (id) VALUES (%s)", (row_id + 100,)), "INSERT INTO nowhere VALUES (1)")
        insert(app, row_id)
        offsets.append(hq.scan())
    assert offsets == sorted(set(offsets)) and offsets[0] > 0
    assert [t.commit for t in hq.read_log("r1", 0)] == offsets
    assert [op.key for op in backend.read_ops("r1")] == [(row_id,) for row_id in range(1, 6)]


def test_read_bounds_must_be_commit_boundaries(backend, hq):
    insert(backend.app(), 1, 2, 3)
    end = hq.scan()
    if backend.name == "sqlite":  # offsets are capture rows' seq: end - 1 falls inside the transaction
        with pytest.raises(LogOffsetError, match="not a commit offset"):
            list(hq.read_log("r1", end - 1))
    else:  # offsets number the log transactions (docs/postgres.md, "Reading the log"): each is a boundary
        assert [t.commit for t in hq.read_log("r1", end - 1)] == [end]
    with pytest.raises(LogOffsetError, match="beyond the log end"):
        list(hq.read_log("r1", 0, end + 5))
    with pytest.raises(LogOffsetError):
        list(hq.read_log("r1", -1))
    assert list(hq.read_log("r1", end)) == []


def test_read_log_ops_streams_single_operations(backend, hq):
    insert(backend.app(), 1, 2)
    end = hq.scan()
    logged = list(hq.read_log_ops("r1", 0))
    assert [(entry.commit, entry.origin, entry.operation.key) for entry in logged] == [
        (end, "hq", (1,)), (end, "hq", (2,))]


def test_applies_write_their_own_log_transactions_with_the_peer_as_origin(backend, hq):
    app = backend.app()
    insert(app, 1)  # committed locally, not scanned yet
    batch = [Transaction(10, "r1", (Operation.insert("customer", (50,), {"id": 50, "name": "from r1"}),)),
             Transaction(12, "r1", (Operation.insert("customer", (51,), {"id": 51, "name": "from r1"}),))]
    result = hq.apply("r1", batch, log_received=12)
    insert(app, 2)
    hq.scan()
    hq.add_remote("r2")
    hq.subscribe("r2", "all")
    log = list(hq.read_log("r2", 0))
    from_r1 = [t for t in log if t.origin == "r1"]
    assert [(t.origin, [op.key for op in t.ops]) for t in (log[0], log[-1])] == [("hq", [(1,)]), ("hq", [(2,)])]
    assert log[1:-1] == from_r1 and [op.key for t in from_r1 for op in t.ops] == [(50,), (51,)]
    if backend.name == "sqlite":  # one log transaction per applied transaction, made by the apply
        assert list(result.log_commits) == [t.commit for t in from_r1] and len(from_r1) == 2
    else:  # the message is one writing transaction, given its offset by the next scan (docs/postgres.md, "Apply")
        assert result.log_commits == () and len(from_r1) == 1
    assert list(hq.read_log("r1", 0)) == [log[0], log[-1]]  # no echo of its own


def test_truncation_stops_at_the_smallest_confirm_sent(backend, hq):
    app = backend.app()
    offsets = []
    for row_id in range(1, 6):
        insert(app, row_id)
        offsets.append(hq.scan())
    hq.add_remote("r2", start=0)
    assert hq.truncate_log() == 0  # r1 and r2 confirmed nothing: nothing goes
    hq.update_remote("r1", log_sent=offsets[4], confirm_sent=offsets[4])
    hq.update_remote("r2", log_sent=offsets[3], confirm_sent=offsets[1])
    assert hq.truncate_log() == offsets[1]
    assert hq.log_start() == offsets[1]
    with pytest.raises(LogTruncated, match="truncation point"):
        list(hq.read_log("r1", 0))
    assert [t.commit for t in hq.read_log("r1", offsets[1])] == offsets[2:]
    # confirm_sent of r2 moves: truncation follows, never past it.
    hq.update_remote("r2", confirm_sent=offsets[3])
    assert hq.truncate_log() == offsets[3]
    assert [t.commit for t in hq.read_log("r1", offsets[3])] == [offsets[4]]


def test_truncating_everything_never_reuses_offsets(backend, hq):
    app = backend.app()
    insert(app, 1, 2)
    end = hq.scan()
    hq.update_remote("r1", log_sent=end, confirm_sent=end)
    assert hq.truncate_log() == end
    assert hq.log_end() == end
    insert(app, 3)
    later = hq.scan()
    assert later > end
    assert [[op.key for op in t.ops] for t in hq.read_log("r1", end)] == [[(3,)]]
