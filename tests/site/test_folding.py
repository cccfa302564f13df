"""Folding a DELETE and a re-INSERT of one row in one transaction
(agent.site.folding), whole and read in pieces."""

from __future__ import annotations

import pytest

from agent.site import Article
from codec.ops import OpKind, Operation, Run, op_count, operations_of

from .conftest import app_connection, make_site, replicate, table_rows
from .publishing import hq, read_ops  # noqa: F401  (hq: a fixture)


def test_delete_and_reinsert_in_one_transaction_becomes_an_update(hq):
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north'), (2, 'Bo', 'north')")
    start = hq.scan()
    app.execute("BEGIN")
    app.execute("DELETE FROM customer WHERE id = 1")
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana again', 'north')")
    app.execute("UPDATE customer SET region = 'south' WHERE id = 2")
    app.execute("UPDATE customer SET region = 'north' WHERE id = 2")
    app.execute("COMMIT")
    assert read_ops(hq, "north1", start) == [
        Operation.update("customer", (1,), {"name": "Ana"}, {"name": "Ana again"})]
    # In separate transactions the DELETE and the INSERT stay as they are.
    start = hq.log_end()
    app.execute("DELETE FROM customer WHERE id = 1")
    hq.scan()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana 3', 'north')")
    assert [op.kind for op in read_ops(hq, "north1", start)] == [3, 1]



def test_a_reinsert_with_other_changes_to_its_table_between_is_not_folded(tmp_path):
    """DELETE row 1 (code A), give row 2 code A, INSERT row 1 with row 2's
    old code B: one UPDATE of row 1 at either place would break UNIQUE(code)
    at the subscriber, where the transaction as written did not."""
    schema = "CREATE TABLE t (id INTEGER PRIMARY KEY, code TEXT UNIQUE, v TEXT)"
    hq = make_site(tmp_path, "hq", "consolidated", schema)
    hq.create_publication("p", [Article("t")])
    hq.add_remote("n1", address="n1@example.org")
    hq.subscribe("n1", "p")
    n1 = make_site(tmp_path, "n1", "remote", schema)
    n1.add_remote("hq", address="hq@example.org")
    app = app_connection(hq)
    app.execute("INSERT INTO t VALUES (1, 'A', 'one'), (2, 'B', 'two')")
    replicate(hq, n1)
    start = hq.log_end()
    app.executescript("BEGIN; DELETE FROM t WHERE id = 1; UPDATE t SET code = 'A' WHERE id = 2;"
                      " INSERT INTO t VALUES (1, 'B', 'new'); COMMIT")
    hq.scan()
    assert [op.kind for op in read_ops(hq, "n1", start)] == [OpKind.DELETE, OpKind.UPDATE, OpKind.INSERT]
    result = replicate(hq, n1)
    assert n1.apply_errors() == () and result is not None
    assert table_rows(n1, "t") == table_rows(hq, "t") == [(1, "B", "new"), (2, "A", "two")]


@pytest.mark.parametrize("runs", [False, True])
def test_a_transaction_read_in_pieces_folds_as_a_whole_one(hq, runs):
    """A DELETE and the INSERT of its row fold only within FOLD_WINDOW
    operations; read in pieces (the packer's read), the transaction comes
    as PartialTransaction values then a Transaction whose operations
    together are the whole one's."""
    from agent.site.folding import FOLD_WINDOW
    from codec.ops import PartialTransaction, Transaction

    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north'), (2, 'Bo', 'north')")
    start = hq.scan()
    lines = "INSERT INTO line (order_id, line_no, sku, qty) VALUES (?, ?, 'sku', 1)"
    app.execute("BEGIN")
    app.executemany(lines, [(1, n) for n in range(700)])
    app.execute("DELETE FROM customer WHERE id = 1")
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana again', 'north')")  # folded
    app.execute("DELETE FROM customer WHERE id = 2")
    app.executemany(lines, [(2, n) for n in range(FOLD_WINDOW)])
    app.execute("INSERT INTO customer (id, name, region) VALUES (2, 'Bo again', 'north')")  # too far: not folded
    app.executemany(lines, [(3, n) for n in range(2500)])
    app.execute("COMMIT")
    end = hq.scan()
    (whole,) = hq.read_log("north1", start, end)
    assert [(op.kind, op.key) for op in whole.ops if op.table == "customer"] == [
        (OpKind.UPDATE, (1,)), (OpKind.DELETE, (2,)), (OpKind.INSERT, (2,))]
    pieces = [transaction for _, transaction in hq.read_logs([("north1", start, end)], piece=300, runs=runs)]
    assert len(pieces) >= 3 and type(pieces[-1]) is Transaction
    assert all(type(piece) is PartialTransaction and piece.commit == whole.commit for piece in pieces[:-1])
    assert [op for piece in pieces for op in operations_of(piece.ops)] == list(whole.ops)
    # With runs the lines come bundled, and the pieces are cut where they are without.
    assert any(type(op) is Run for piece in pieces for op in piece.ops) is runs
    plain = [transaction for _, transaction in hq.read_logs([("north1", start, end)], piece=300)]
    assert [op_count(piece.ops) for piece in pieces] == [len(piece.ops) for piece in plain]


@pytest.mark.parametrize("seed", range(40))
def test_runs_fold_as_the_operations_they_stand_for(seed):
    """Folding a transaction whose operations come bundled in runs (the
    sender's reader) gives the operations folding gives one by one, whole
    and in pieces of any size."""
    import random

    from agent.site.folding import FOLD_WINDOW, _Folder, _fold_reinserts
    from codec.ops import operations_of, to_runs

    rng = random.Random(seed)
    ops = []
    for _ in range(rng.randrange(1, 400)):
        table, key = rng.choice(["a", "b"]), rng.randrange(6)
        kind = rng.choice([OpKind.INSERT, OpKind.UPDATE, OpKind.UPDATE, OpKind.DELETE])
        value = rng.choice([1, 2, "x", None])
        if kind == OpKind.INSERT:
            ops.append(Operation.insert(table, (key,), {"id": key, "v": value}))
        elif kind == OpKind.DELETE:
            ops.append(Operation.delete(table, (key,), {"id": key, "v": rng.choice([1, 2, "x", None])}))
        else:
            ops.append(Operation.update(table, (key,), {"v": 0}, {"v": value}))
    # Runs cut at random places, as the reader's chunks and buckets cut them.
    bundled, start = [], 0
    while start < len(ops):
        stop = start + rng.randrange(1, 40)
        bundled += to_runs(ops[start:stop])
        start = stop
    expected = _fold_reinserts(list(ops))
    # What comes before the first DELETE is left out of the folding: the same.
    whole = _Folder()
    whole.add(list(ops))
    assert expected == whole.take(0)
    folded = _fold_reinserts(bundled)
    assert list(operations_of(folded)) == expected
    # Folded on the runs' rows: what folds becomes a run of one UPDATE, the
    # rest stays in runs (cut around a row folded away), none taken apart.
    assert all(type(op) is Run for op in folded)
    for piece in (1, 7, 50):
        # In pieces: the same adds and takes (in operations) give the same,
        # a run cut in two where a take falls inside it.
        with_runs, one_by_one, taken, expected_taken = _Folder(), _Folder(), [], []
        for start in range(0, len(bundled), piece):
            chunk = bundled[start:start + piece]
            with_runs.add(chunk)
            one_by_one.add(list(operations_of(chunk)))
            keep = rng.choice([0, 3, 25, FOLD_WINDOW])
            taken += with_runs.take(keep)
            expected_taken += one_by_one.take(keep)
        taken += with_runs.take(0)
        expected_taken += one_by_one.take(0)
        assert list(operations_of(taken)) == expected_taken, piece
        assert all(type(op) is Run for op in taken)


def test_a_reinsert_with_a_delete_of_another_table_between_is_not_folded():
    """An order deleted and inserted again around its customer's DELETE: at a
    remote the customer's DELETE takes the order along (rows that follow
    their parent), so one UPDATE after it would find no row."""
    from agent.site.folding import make_transaction

    order = {"id": 20, "customer_id": 2}
    ops = [Operation.delete("orders", (20,), order), Operation.delete("customer", (2,), {"id": 2, "rep": 2}),
           Operation.insert("orders", (20,), {**order, "customer_id": 4})]
    assert [op.kind for op in make_transaction(1, "hq", ops).ops] == [OpKind.DELETE, OpKind.DELETE, OpKind.INSERT]
    assert [op.kind for op in make_transaction(1, "hq", [ops[1], ops[0], ops[2]]).ops] == [
        OpKind.DELETE, OpKind.UPDATE]


# Values whose == does not tell them apart: zeros of both signs and types,
# an int and the float equal to it, and NaN (never equal to itself).
_TRICKY = [0, 0.0, -0.0, 1, 1.0, None, "a", b"a", float("nan")]


@pytest.mark.parametrize("seed", range(20))
def test_a_delete_and_insert_of_the_same_columns_fold_place_by_place_as_by_name(seed):
    """folded_alike (the fan-out's fold, place by place) gives what
    folded_row gives of the same rows by column name: every value
    compared exactly, zeros, types and NaN included."""
    import random

    from agent.site.folding import folded_alike, folded_row

    rng = random.Random(seed)
    columns = ("id", "a", "b", "c")
    for _ in range(200):
        deleted = (7, *(rng.choice(_TRICKY) for _ in columns))
        row = (7, *(rng.choice([*_TRICKY, deleted[place + 1]]) for place in range(len(columns))))
        alike = folded_alike("t", 1, columns, deleted, row)
        assert alike == folded_row("t", 1, dict(zip(columns, deleted[1:])), columns, row), (deleted, row)
        if alike is not None:
            assert alike[3] is alike[4] and list(alike[3]) == [
                column for column, old, new in zip(columns, deleted[1:], row[1:])
                if not (type(old) is type(new) and (old == new and str(old) == str(new)))]
