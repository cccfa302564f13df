"""Reading the log for subscribers (read_log, read_log_ops, read_logs,
check_log_range, selection_rows, read_capture): a PostgreSQL consolidated
gives each subscriber what a SQLite one gives it, through the same
selection and folding (agent.site.reading over each backend's log).  Most
tests run on both backends (tests/site/postgres/both.py)."""

from __future__ import annotations

import threading
import time

import pytest

from agent.site import Article, LogOffsetError, LogTruncated, UnknownRemote
from agent.site.postgres.connect import connect
from codec.ops import OpKind, Operation, PartialTransaction, Run, Transaction, op_count, operations_of

from .both import REGIONS, WRITERS, consolidated, seed, write_rows  # noqa: F401  (consolidated: a fixture)
from .replay import Copy

def _subset(app, region: str) -> dict:  # type: ignore[no-untyped-def]
    return app.rows("WHERE region = %s", (region,))


def _apply(copy: Copy, transactions) -> None:  # type: ignore[no-untyped-def]
    for transaction in transactions:
        copy.apply(operations_of(transaction.ops))


def _rows(copy: Copy) -> dict:
    return copy.tables.get("customer", {})


def test_each_subscriber_reads_exactly_its_rows_in_commit_order_while_applications_write(consolidated):
    """Four writers change, move and delete rows while the log is cut and
    read after each cut; each subscriber's copy, built from what it read,
    is the consolidated's subset of its region at the end, with no
    operation meeting a row in a state it did not expect."""
    site = consolidated.site
    setup = consolidated.app()
    seed(setup)
    copies = {name: Copy() for name in REGIONS}
    ends = [0]
    stop = threading.Event()
    # Each writer waits before its last transaction until the log was read
    # after one of them got there: a read in the middle of the writing.
    waiting, read_midway = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            write_rows(consolidated.app(), number, stop,
                       before_last=lambda: (waiting.set(), read_midway.wait(120)))
        except BaseException as error:  # noqa: BLE001  (reported below)
            failures.append(error)
            stop.set()

    def read_step() -> None:
        midway = waiting.is_set()
        end = site.scan()
        for name in REGIONS:
            _apply(copies[name], site.read_log(name, ends[-1], end))
        ends.append(end)
        if midway:
            read_midway.set()

    threads = [threading.Thread(target=writer, args=(number,)) for number in range(1, WRITERS + 1)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        read_step()
        time.sleep(0.01)  # SQLite's write lock is not fair: leave the writers room
    read_while_writing = len(set(ends))
    for thread in threads:
        thread.join()
    read_step()
    assert not failures, failures
    # The log was read in steps while the writers wrote.
    assert read_midway.is_set() and read_while_writing >= 2
    for name, region in REGIONS.items():
        assert copies[name].problems == []
        assert _rows(copies[name]) == _subset(setup, region)
        whole = list(site.read_log(name, 0))
        commits = [transaction.commit for transaction in whole]
        assert commits == sorted(set(commits)) and {transaction.origin for transaction in whole} == {"hq"}
        # Read in one go or step by step, the same transactions.
        steps = [transaction for after, until in zip(ends, ends[1:])
                 for transaction in site.read_log(name, after, until)]
        assert steps == whole
        copy = Copy()
        _apply(copy, whole)
        assert copy.problems == [] and _rows(copy) == _subset(setup, region)
        # One operation at a time (nothing folded), the same rows in the end.
        logged = list(site.read_log_ops(name, 0))
        assert {entry.commit for entry in logged} == set(commits)
        copy = Copy()
        copy.apply(entry.operation for entry in logged)
        assert copy.problems == [] and _rows(copy) == _subset(setup, region)
    # One pass for both, whatever it holds at once, gives each what it reads alone.
    alone = {name: list(site.read_log(name, 0)) for name in REGIONS}
    for hold in (50_000, 0):
        together: dict[str, list] = {name: [] for name in REGIONS}
        for index, transaction in site.read_logs([(name, 0, None) for name in REGIONS], hold=hold):
            together[list(REGIONS)[index]].append(transaction)
        assert together == alone


def test_a_row_that_moves_between_regions_is_a_delete_for_one_and_an_insert_for_the_other(consolidated):
    site, app = consolidated.site, consolidated.app()
    app.run(("INSERT INTO customer VALUES (1, 'Ann', 'north', 1.5)", ()))
    start = site.scan()
    app.run(("UPDATE customer SET region = 'south', name = 'Ann S' WHERE id = 1", ()))
    end = site.scan()
    [north] = site.read_log("north1", start, end)
    [south] = site.read_log("south1", start, end)
    assert north.commit == south.commit == end
    assert north.ops == (Operation.delete("customer", (1,), {"id": 1, "name": "Ann", "region": "north",
                                                             "balance": 1.5}),)
    assert south.ops == (Operation.insert("customer", (1,), {"id": 1, "name": "Ann S", "region": "south",
                                                             "balance": 1.5}),)
    # A change within the region goes to its subscriber alone, as an UPDATE of what changed.
    app.run(("UPDATE customer SET balance = 2.5 WHERE id = 1", ()))
    last = site.scan()
    assert list(site.read_log("north1", end, last)) == []
    [update] = site.read_log("south1", end, last)
    assert update.ops == (Operation.update("customer", (1,), {"balance": 1.5}, {"balance": 2.5}),)


@pytest.mark.parametrize("runs", [False, True])
def test_a_large_transaction_comes_in_pieces_and_runs_as_on_sqlite(consolidated, runs):
    from agent.site.folding import FOLD_WINDOW

    site, app = consolidated.site, consolidated.app()
    app.run(("INSERT INTO customer VALUES (1, 'Ann', 'north', 0), (2, 'Bo', 'north', 0)", ()))
    start = site.scan()
    insert = "INSERT INTO customer VALUES (%s, 'bulk', %s, 0)"
    app.run(*[(insert, (row, "north")) for row in range(100, 800)],
            ("DELETE FROM customer WHERE id = 1", ()),
            ("INSERT INTO customer VALUES (1, 'Ann again', 'north', 0)", ()),  # folded into an UPDATE
            ("DELETE FROM customer WHERE id = 2", ()),
            *[(insert, (row, "north" if row % 3 else "south")) for row in range(1000, 1000 + FOLD_WINDOW)],
            ("INSERT INTO customer VALUES (2, 'Bo again', 'north', 0)", ()),  # too far: not folded
            *[(insert, (row, "north")) for row in range(5000, 7500)])
    end = site.scan()
    (whole,) = site.read_log("north1", start, end)
    assert [(op.kind, op.key) for op in whole.ops if op.key in ((1,), (2,))] == [
        (OpKind.UPDATE, (1,)), (OpKind.DELETE, (2,)), (OpKind.INSERT, (2,))]
    pieces = [transaction for _, transaction in site.read_logs([("north1", start, end)], piece=300, runs=runs)]
    assert len(pieces) >= 3 and type(pieces[-1]) is Transaction
    assert all(type(piece) is PartialTransaction and piece.commit == whole.commit for piece in pieces[:-1])
    assert [op for piece in pieces for op in operations_of(piece.ops)] == list(whole.ops)
    assert any(type(op) is Run for piece in pieces for op in piece.ops) is runs
    # Two subscribers, each read on its own (hold 0): each in pieces, each whole.
    both = [(index, transaction) for index, transaction in site.read_logs(
        [("north1", start, end), ("south1", start, end)], hold=0, piece=300, runs=runs)]
    (south,) = site.read_log("south1", start, end)
    assert [op for index, piece in both if index == 0 for op in operations_of(piece.ops)] == list(whole.ops)
    assert [op for index, piece in both if index == 1 for op in operations_of(piece.ops)] == list(south.ops)
    assert op_count(south.ops) == len([row for row in range(1000, 1000 + FOLD_WINDOW) if row % 3 == 0])


def test_ranges_are_refused_as_on_sqlite(consolidated):
    site, app = consolidated.site, consolidated.app()
    app.run(("INSERT INTO customer VALUES (1, 'Ann', 'north', 0)", ()))
    first = site.scan()
    app.run(("INSERT INTO customer VALUES (2, 'Bo', 'north', 0)", ()))
    end = site.scan()
    with pytest.raises(LogOffsetError, match=f"start offset {end + 1} is not a commit offset"):
        site.read_log("north1", end + 1)
    with pytest.raises(LogOffsetError, match=f"end offset {end + 1} lies beyond the log end {end}"):
        site.read_log("north1", 0, end + 1)
    with pytest.raises(LogOffsetError, match="non-negative integer"):
        site.read_log_ops("north1", -1)
    with pytest.raises(LogOffsetError, match=f"end offset {first} lies before start offset {end}"):
        site.check_log_range(end, first)
    with pytest.raises(UnknownRemote, match="no remote named 'nobody' at site 'hq'"):
        site.read_log("nobody", 0)
    with pytest.raises(UnknownRemote, match="no remote named 'nobody'"):
        site.read_logs([("north1", 0, None), ("nobody", 0, None)])
    with pytest.raises(LogOffsetError):  # every range is checked before anything is read
        site.read_logs([("north1", 0, None), ("south1", end + 1, None)])
    assert list(site.read_log("north1", end)) == []
    site.check_log_range(first, end)
    # Confirmed by every remote and truncated: reading from before is LogTruncated.
    for name in REGIONS:
        site.update_remote(name, log_sent=end, confirm_sent=end)
    assert site.truncate_log() == end
    with pytest.raises(LogTruncated, match=f"start offset 0 lies before the log's truncation point {end}"):
        site.read_log("north1", 0)
    with pytest.raises(LogTruncated):
        site.check_log_range(first, end)
    assert list(site.read_log("north1", end)) == []


def test_a_read_leaves_the_site_free_between_chunks(consolidated, monkeypatch):
    """The readers fetch a chunk at a time; between two, the same site
    object serves other calls (the agent records sends while it packs)."""
    import agent.site.sqlite.log as sqlite_log
    import agent.site.postgres.log as postgres_log

    monkeypatch.setattr(sqlite_log, "READ_CHUNK", 5)
    monkeypatch.setattr(postgres_log, "READ_CHUNK", 5)
    site, app = consolidated.site, consolidated.app()
    for row in range(1, 31):
        app.run(("INSERT INTO customer VALUES (%s, 'n', 'north', 0)", (row,)))
    end = site.scan()
    reading = site.read_log("north1", 0, end)
    seen = [next(reading)]
    site.record_send("north1", log_sent=end)
    app.run(("INSERT INTO customer VALUES (99, 'late', 'north', 0)", ()))
    site.scan()
    seen += list(reading)
    assert [op.key for transaction in seen for op in transaction.ops] == [(row,) for row in range(1, 31)]
    assert site.remote("north1").log_sent == end


def test_selection_rows_and_read_capture_are_a_batch_export_s_input_on_both(consolidated):
    site, app = consolidated.site, consolidated.app()
    app.run(("INSERT INTO customer VALUES (1, 'Ann', 'north', 0.5)", ()),
            ("UPDATE customer SET region = 'south' WHERE id = 1", ()))
    end = site.scan()
    shapes, articles, subscriptions = site.selection_rows(["north1", "south1"])
    assert [(shape.table, shape.columns, shape.key_columns) for shape in shapes] == [
        ("customer", ("id", "name", "region", "balance"), ("id",))]
    assert articles == [("customer", "sales", None, "region")]
    assert subscriptions == [("north1", "sales", "north", 0, None), ("south1", "sales", "south", 0, None)]
    with pytest.raises(UnknownRemote):
        site.selection_rows(["nobody"])
    chunks = list(site.read_capture(0, end, value_columns=10))
    assert [(commit, origin, returned) for commit, origin, _, returned in chunks] == [(end, "hq", {})]
    [(_, _, rows, _)] = chunks
    # Flags: NULL on SQLite, 0 on PostgreSQL (no row is written back to its origin).
    assert [(row[2], bool(row[3]), *row[4:]) for row in rows] == [
        (1, False, 1, "Ann", "north", 0.5, None, None, None, None, None, None),
        (2, False, 1, "Ann", "north", 0.5, 1, "Ann", "south", 0.5, None, None)]


def test_values_are_read_as_they_travel(postgres, target, tmp_path):
    """numeric as exact text, times in ISO 8601, bytea as bytes, booleans
    as 1 and 0 (docs/postgres.md, "Types"), in what a subscriber reads."""
    from agent.site.postgres.site import PostgresSite

    with connect(target) as app:
        app.execute("CREATE TABLE reading (id integer PRIMARY KEY, amount numeric(10,2), at timestamptz, day date,"
                    " blob bytea, flag boolean, ratio real)")
        with PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "home") as site:
            site.create_publication("p", [Article("reading")])
            site.add_remote("r1")
            site.subscribe("r1", "p")
            app.execute("SET TIME ZONE 'America/New_York'")
            app.execute("INSERT INTO reading VALUES (1, 12.5, '2024-05-01 08:30:00.5-04', '2024-02-29',"
                        " '\\x00ff', true, 0.1)")
            app.execute("UPDATE reading SET amount = 12.50, flag = false WHERE id = 1")
            end = site.scan()
            insert, update = [op for transaction in site.read_log("r1", 0, end) for op in transaction.ops]
    assert insert.after == {"id": 1, "amount": "12.50", "at": "2024-05-01T12:30:00.500000Z", "day": "2024-02-29",
                            "blob": b"\x00\xff", "flag": 1, "ratio": 0.1}
    assert update.before == {"flag": 1} and update.after == {"flag": 0}  # 12.50 and 12.50: no change
