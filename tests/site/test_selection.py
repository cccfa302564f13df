"""Selecting each subscriber's operations: the router, and one pass over
the log for many subscribers (agent.site.selection, agent.site.reading)."""

from __future__ import annotations

import pytest

from agent.site import Article, InvalidSetting, LogOffsetError, UnknownRemote
from codec.ops import Operation, Run, Transaction, operations_of

from .conftest import app_connection
from .publishing import hq, read_ops  # noqa: F401  (hq: a fixture)
from tests.sqlfiles import seq_ranges


def test_the_router_offers_each_row_to_the_subscribers_it_can_concern_and_no_fewer(hq):
    """One pass over the log for many subscribers (the Spark batch job)
    offers each capture row only to some readers; every reader that selects
    the row must be among them, and rows of a value go to its subscribers."""
    from agent.site.fanout import Router
    from agent.site.sqlite.selection import subscriber_reader

    hq.subscribe("idle", "sales", "nowhere")
    start = hq.scan()
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'n', 'north'), (2, 's', 'south')")
    app.execute("UPDATE customer SET region = 'south' WHERE id = 1")  # moves north -> south
    app.execute("INSERT INTO line VALUES (1, 1, 'A', 3)")  # every subscriber of sales
    app.execute("DELETE FROM customer WHERE id = 2")
    hq.apply("north1", [Transaction(5, "north1", (
        Operation.insert("customer", (7,), {"id": 7, "name": "from north", "region": "north"}),
        Operation.insert("customer", (8,), {"id": 8, "name": "for south", "region": "south"}),
    ))], log_received=5)
    end = hq.scan()
    names = ["north1", "south1", "idle"]
    readers = [subscriber_reader(hq.connection, hq.identity, hq._shapes, name) for name in names]
    router = Router(readers)
    line_shape = hq.connection.execute("SELECT max(id) FROM fieldsync_shape WHERE table_name = 'line'").fetchone()[0]
    offered: list[set[str]] = []
    for _commit, origin, rows, _returned in hq.read_capture(start, end, value_columns=2 * 6):
        for row in rows:
            candidates = {names[index] for index in router.candidates(origin, row)}
            selecting = {reader.subscriber for reader in readers if reader.operation(origin, row) is not None}
            assert selecting <= candidates, (row, candidates, selecting)
            assert origin not in candidates or row[3]  # no echo, bar rows written back
            offered.append(candidates)
            # Grouped into classes: the same readers, each once, and each
            # reader of a class turns the row into the same operation.
            classes = router.classes(origin, row)
            assert sorted(index for members in classes for index in members) == sorted(
                router.candidates(origin, row))
            for members in classes:
                made = [readers[index].operation(origin, row) for index in members]
                assert made == [made[0]] * len(members), (row, members)
            if row[1] == line_shape:
                assert classes == [(0, 1, 2)]  # all three take every line row, alike: converted once
    assert offered[:4] == [{"north1"}, {"south1"}, {"north1", "south1"}, {"north1", "south1", "idle"}]
    assert offered[4] == {"south1"}
    # north1's own rows: the one in its subset goes to nobody, the row it put
    # outside its subset goes back to north1 alone (a DELETE) and to south1.
    assert {"north1"} in offered[5:] and set() in offered[5:]
    # Every reader alone selects what it reads from the log.
    for name, reader in zip(names, readers):
        routed = [reader.operation(origin, row)
                  for _c, origin, rows, _r in hq.read_capture(start, end, value_columns=12) for row in rows
                  if names.index(name) in router.candidates(origin, row)]
        assert [op for op in routed if op is not None] == read_ops(hq, name, start)


# -- one pass over the log for several subscribers (Fanout, SiteDatabase.read_logs) -----------


def _busy_log(hq):
    """A log with something for everyone: rows moving between subsets, a
    delete and re-insert in one transaction, a large transaction, and a
    batch from north1 (forwarded to the others, written back to north1 where
    it left its subset).  Returns the commit offsets, first to last."""
    hq.add_remote("all")
    hq.subscribe("all", "sales", "north")
    hq.subscribe("all", "sales", "south")
    hq.subscribe("idle", "sales", "nowhere")
    app = app_connection(hq)
    offsets = [hq.scan()]
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'n', 'north'), (2, 's', 'south'),"
                " (3, 'e', 'east')")
    offsets.append(hq.scan())
    app.execute("BEGIN")
    app.execute("UPDATE customer SET region = 'south' WHERE id = 1")
    app.execute("DELETE FROM customer WHERE id = 2")
    app.execute("INSERT INTO customer (id, name, region) VALUES (2, 's again', 'south')")
    app.execute("INSERT INTO line VALUES (1, 1, 'A', 3)")
    app.execute("COMMIT")
    offsets.append(hq.scan())
    hq.apply("north1", [Transaction(5, "north1", (
        Operation.insert("customer", (7,), {"id": 7, "name": "from north", "region": "north"}),
        Operation.update("customer", (1,), {"region": "south"}, {"region": "north"}),
        Operation.insert("customer", (8,), {"id": 8, "name": "for south", "region": "south"}),
    ))], log_received=5)
    offsets.append(hq.scan())
    app.execute("BEGIN")
    for row_id in range(100, 400):
        app.execute("INSERT INTO customer (id, name, region) VALUES (?, 'bulk', ?)",
                    (row_id, ["north", "south", "east"][row_id % 3]))
        app.execute("INSERT INTO line VALUES (?, 1, 'B', 1)", (row_id,))
    app.execute("COMMIT")
    offsets.append(hq.scan())
    app.execute("UPDATE customer SET name = 'last' WHERE id IN (1, 7, 8)")
    offsets.append(hq.scan())
    return offsets


def _reads(offsets):
    """Subscribers with their own ranges: resends from older offsets, one
    send of nothing but its tail, one of an empty range."""
    return [("north1", offsets[0], offsets[-1]), ("south1", offsets[2], offsets[-1]),
            ("idle", offsets[0], offsets[3]), ("all", offsets[3], offsets[-1]), ("ghostless", 0, 0)]


def expanded(transaction):
    """A transaction read with runs, with the operations its runs stand for."""
    return type(transaction)._trusted(transaction.commit, transaction.origin,
                                      tuple(operations_of(transaction.ops)), transaction.applied)


@pytest.mark.parametrize("runs", [False, True])
@pytest.mark.parametrize("hold", [50_000, 100, 0])
def test_one_pass_reads_for_each_subscriber_what_it_reads_alone(hq, hold, runs):
    hq.add_remote("ghostless")
    reads = _reads(_busy_log(hq))
    alone = {index: list(hq.read_log(*read)) for index, read in enumerate(reads)}
    together: dict[int, list] = {index: [] for index in range(len(reads))}
    bundled = 0
    for index, transaction in hq.read_logs(reads, hold=hold, runs=runs):
        bundled += sum(1 for op in transaction.ops if type(op) is Run)
        together[index].append(expanded(transaction))
    assert together == alone
    assert (bundled > 0) is runs
    assert all(alone[index] for index in range(4)) and alone[4] == []
    # The bulk transaction holds more than 100 selected operations, so with
    # the smaller holds it was read for each subscriber on its own: the same.
    assert min(max(len(t.ops) for t in alone[index]) for index in (0, 1, 3)) > 100
    for index, transactions in together.items():
        commits = [t.commit for t in transactions]
        assert commits == sorted(set(commits))
        start, end = reads[index][1:]
        assert all(start < commit <= end for commit in commits)


def test_one_pass_hands_each_subscriber_the_runs_its_packer_takes_as_they_are(hq):
    """Rows every subscriber receives (line) between rows of one subset
    (customer) reach each subscriber joined into the runs codec.ops.to_runs
    makes of its operations, moves into and out of a subset too: the packer
    takes them as they are, and they stand for what each reads alone."""
    from codec.ops import runs_counted

    start = hq.scan()
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'n', 'north'), (2, 's', 'south')")
    hq.scan()
    app.execute("BEGIN")
    for number in range(1, 40):
        app.execute("INSERT INTO line VALUES (?, 1, 'A', 1)", (number,))
        app.execute("INSERT INTO customer (id, name, region) VALUES (?, 'c', ?)",
                    (100 + number, ["north", "south", "east"][number % 3]))
        app.execute("UPDATE line SET qty = ? WHERE order_id = ?", (number, number))
    app.execute("UPDATE customer SET region = 'south' WHERE id = 1")  # north1: DELETE, south1: INSERT
    app.execute("UPDATE customer SET region = 'north' WHERE id = 2")
    app.execute("UPDATE customer SET region = 'east' WHERE id = 101")
    app.execute("COMMIT")
    end = hq.scan()
    reads = [("north1", start, end), ("south1", start, end), ("idle", start, end)]
    together: dict[int, list] = {index: [] for index in range(len(reads))}
    for index, transaction in hq.read_logs(reads, runs=True):
        assert all(type(op) is Run for op in transaction.ops)
        runs, _count = runs_counted(transaction.ops)
        assert len(runs) == len(transaction.ops) and all(a is b for a, b in zip(runs, transaction.ops))
        together[index].append(expanded(transaction))
    assert together == {index: list(hq.read_log(*read)) for index, read in enumerate(reads)}
    assert max(len(transaction.ops) for transaction in together[0]) > 40


def test_one_pass_shares_a_class_run_until_its_members_part(hq):
    """UPDATEs every subscriber receives (line) join into one run shared by
    the subscribers whose operations end with it, until a row of one's
    subset (customer: changed, moved in and out) comes between: each still
    gets the runs codec.ops.to_runs makes of what it reads alone, and no
    run handed to one changes another's."""
    from codec.ops import runs_counted

    app = app_connection(hq)
    regions = ["north", "south", "east"]
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'n', 'north'), (2, 's', 'south')")
    app.executemany("INSERT INTO customer (id, name, region) VALUES (?, 'm', ?)",
                    [(10 + number, regions[number % 3]) for number in range(5)])
    app.executemany("INSERT INTO line VALUES (?, 1, 'A', 0)", [(number,) for number in range(1, 30)])
    start = hq.scan()
    app.execute("BEGIN")
    for number in range(1, 30):
        app.execute("UPDATE line SET qty = ? WHERE order_id = ?", (number, number))
        if number % 4 == 0:
            app.execute("UPDATE customer SET name = ? WHERE id = 1", (f"n{number}",))
        if number % 6 == 0:  # out of one subset, into another (each row once: nothing folds)
            moved = number // 6 - 1
            app.execute("UPDATE customer SET region = ? WHERE id = ?", (regions[(moved + 1) % 3], 10 + moved))
        if number % 9 == 0:
            app.execute("UPDATE line SET sku = 'B' WHERE order_id = ?", (number,))  # another head
    app.execute("COMMIT")
    end = hq.scan()
    hq.add_remote("all")
    hq.subscribe("all", "sales", "east")
    reads = [("north1", start, end), ("south1", start, end), ("all", start, end)]
    handed: dict[int, list] = {}
    for index, transaction in hq.read_logs(reads, runs=True):
        runs, _count = runs_counted(transaction.ops)
        assert len(runs) == len(transaction.ops) and all(a is b for a, b in zip(runs, transaction.ops))
        handed[index] = [transaction.ops, expanded(transaction)]
    # Each subscriber's operations, looked at once all were handed over.
    for index, read in enumerate(reads):
        alone = list(hq.read_log(*read))
        assert [handed[index][1]] == alone
        assert [expanded(type(alone[0])._trusted(alone[0].commit, alone[0].origin, handed[index][0]))] == alone
    shared = {id(run) for run in handed[0][0]} & {id(run) for run in handed[1][0]}
    assert shared  # the runs of line both received with nothing of their own between


def test_a_class_of_two_hands_a_row_its_other_member_sent_to_the_one_left(hq):
    """Two subscribers of one subset are one class; the rows one of them
    sent (applied here, then forwarded) go to the other alone, joined into
    its runs as they come, and never back to the sender (no echo)."""
    hq.add_remote("north2")
    hq.subscribe("north2", "sales", "north")
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'n', 'north'), (2, 's', 'south')")
    start = hq.scan()
    hq.apply("north1", [Transaction(5, "north1", (
        Operation.insert("customer", (7,), {"id": 7, "name": "from north", "region": "north"}),
        Operation.insert("customer", (8,), {"id": 8, "name": "also", "region": "north"}),
        Operation.update("customer", (1,), {"name": "n"}, {"name": "n2"}),
    ))], log_received=5)
    end = hq.scan()
    reads = [("north1", start, end), ("north2", start, end), ("south1", start, end)]
    handed: dict[int, list] = {0: [], 1: [], 2: []}
    for index, transaction in hq.read_logs(reads, runs=True):
        handed[index].append(transaction)
    for index, read in enumerate(reads):
        assert [expanded(transaction) for transaction in handed[index]] == list(hq.read_log(*read))
    # north1 is sent back only what it wrote and the consolidated returns to it.
    assert not [op for t in handed[0] for op in operations_of(t.ops) if op.key != (1,)] and handed[2] == []
    (transaction,) = handed[1]
    assert [(run.kind, len(run.rows)) for run in transaction.ops] == [(1, 2), (2, 1)]


def test_a_class_run_is_joined_once_for_the_members_that_end_with_it_whatever_their_order():
    """Members of a class that end with one run (a, c: the class's last;
    b, d: an earlier one, taken as it was after a row of their own) get one
    joined run per run they end with, not one each, though the two kinds
    of members alternate; a member's own run ends in a run of its own, and
    no run handed before changes."""
    from agent.site.fanout import _hand_runs

    head = ("line", 2, 1, ("qty",), ("qty",))
    last = Run(*head, [(1, 0, 1)])
    earlier = Run(*head, [(2, 0, 2)])
    own = Run("customer", 1, 1, (), ("id", "name"), [(7, 7, "c")])
    ops = [[last], [earlier], [last], [earlier], [own]]
    handed = Run(*head, [(3, 0, 3)])
    _hand_runs([handed], (0, 1, 2, 3, 4), ops, {})
    assert ops[0][-1] is ops[2][-1] and ops[1][-1] is ops[3][-1] and ops[0][-1] is not ops[1][-1]
    assert ops[0] == [Run(*head, [(1, 0, 1), (3, 0, 3)])] and ops[1] == [Run(*head, [(2, 0, 2), (3, 0, 3)])]
    assert ops[4] == [own, handed] and ops[4][-1] is handed
    assert last.rows == [(1, 0, 1)] and earlier.rows == [(2, 0, 2)] and handed.rows == [(3, 0, 3)]


def test_one_pass_folds_a_delete_and_the_insert_right_after_it_as_it_hands_them_over(hq):
    """A row deleted and inserted again with nothing for its subscriber
    between folds as the fan-out hands the INSERT over (into nothing, or an
    UPDATE of what changed; the DELETE taken off the end of its run):
    each subscriber gets what it reads alone."""
    app = app_connection(hq)
    app.executemany("INSERT INTO customer (id, name, region) VALUES (?, ?, ?)",
                    [(number, f"c{number}", ["north", "south"][number % 2]) for number in range(1, 9)])
    app.execute("INSERT INTO line VALUES (1, 1, 'A', 0)")
    start = hq.scan()
    app.execute("BEGIN")
    for number, name in ((2, "c2"), (1, "renamed")):  # the same row again: nothing; a new name: an UPDATE
        app.execute("DELETE FROM customer WHERE id = ?", (number,))
        app.execute("INSERT INTO customer (id, name, region) VALUES (?, ?, ?)",
                    (number, name, ["north", "south"][number % 2]))
    app.execute("UPDATE line SET qty = 1")
    app.execute("DELETE FROM customer WHERE id IN (4, 6)")  # one run of two DELETEs; 6 comes back
    app.execute("INSERT INTO customer (id, name, region) VALUES (6, 'c6 again', 'north')")
    app.execute("UPDATE customer SET region = 'south' WHERE id = 8")  # north1: DELETE; then back: INSERT
    app.execute("UPDATE customer SET region = 'north' WHERE id = 8")
    app.execute("UPDATE line SET qty = 2")
    app.execute("COMMIT")
    end = hq.scan()
    reads = [("north1", start, end), ("south1", start, end)]
    handed: dict[int, list] = {0: [], 1: []}
    for index, transaction in hq.read_logs(reads, runs=True):
        handed[index].append(transaction)
    for index, read in enumerate(reads):
        assert [expanded(transaction) for transaction in handed[index]] == list(hq.read_log(*read))
    # north1: 2 and 8 (out of north and back) as they were, 4 deleted, 6 renamed.
    north = [op[1:3] for op in operations_of(handed[0][0].ops) if op[0] == "customer"]
    assert north == [(3, (4,)), (2, (6,))]
    # south1: 1 renamed, 8 in and out again (an INSERT then a DELETE do not fold).
    south = [op[1:3] for op in operations_of(handed[1][0].ops) if op[0] == "customer"]
    assert south == [(2, (1,)), (1, (8,)), (3, (8,))]
    # Fed one capture row at a time (an INSERT in another chunk than its
    # DELETE), the fan-out hands over the same.
    from agent.site.fanout import Fanout
    from agent.site.sqlite.selection import subscriber_reader

    readers = [subscriber_reader(hq.connection, hq.identity, hq._shapes, name) for name, _, _ in reads]
    for reader in readers:
        reader.runs = True
    fanout = Fanout(readers, [(after, until) for _, after, until in reads])
    given = []
    for commit, origin, rows, _returned in hq.read_capture(start, end, value_columns=12):
        for row in rows:
            given += fanout.add(commit, origin, [row])
    given += fanout.finish()
    assert sorted((index, expanded(transaction)) for index, transaction in given) == \
        [(index, expanded(transaction)) for index in (0, 1) for transaction in handed[index]]


def test_one_pass_reads_each_capture_row_once(hq):
    reads = _reads(_busy_log(hq))[:4]
    statements: list[str] = []
    hq.connection.set_trace_callback(statements.append)
    try:
        for _ in hq.read_logs(reads):
            pass
        together = [s for s in statements if "FROM fieldsync_capture" in s]
        statements.clear()
        for read in reads:
            for _ in hq.read_log(*read):
                pass
        alone = [s for s in statements if "FROM fieldsync_capture" in s]
    finally:
        hq.connection.set_trace_callback(None)
    # The log is under one chunk: one range of seqs read once for all four
    # (INSERT and DELETE rows, which hold one image, by a narrower statement
    # of the same range); alone, each subscriber reads it again.
    assert len(seq_ranges(together)) == 1 and len(together) <= 2 and len(alone) >= 4


def test_the_router_leaves_each_reader_its_own_transactions(hq):
    """Fanout alone: fed the capture rows of the whole log, each reader gets
    exactly the transactions of its range, as read_transactions makes them
    (with what with_applied adds to the rows written back to a reader, as
    the Spark job adds it too)."""
    from agent.site.fanout import Fanout, with_applied
    from agent.site.sqlite.selection import subscriber_reader

    reads = _reads(_busy_log(hq))[:4]
    readers = [subscriber_reader(hq.connection, hq.identity, hq._shapes, name) for name, _, _ in reads]
    fanout = Fanout(readers, [(after, until) for _, after, until in reads])
    given: list = []
    low, high = min(read[1] for read in reads), max(read[2] for read in reads)
    for commit, origin, rows, _returned in hq.read_capture(low, high, value_columns=12):
        for index, transaction in fanout.add(commit, origin, rows):
            assert transaction.commit < commit  # given out once its log transaction is complete
            given.append((index, transaction))
    given += fanout.finish()
    got: dict[int, list] = {index: [] for index in range(len(reads))}
    for index, transaction in with_applied(given, [name for name, _, _ in reads], hq.log_applied):
        got[index].append(transaction)
    assert got == {index: list(hq.read_log(*read)) for index, read in enumerate(reads)}
    assert [t.applied for t in got[0] if t.origin == "north1"] == [5]


def test_one_pass_checks_every_range_before_reading(hq):
    offsets = _busy_log(hq)
    with pytest.raises(InvalidSetting, match="at most once"):
        hq.read_logs([("north1", 0, offsets[-1]), ("north1", offsets[2], offsets[-1])])
    with pytest.raises(LogOffsetError, match="not a commit offset"):
        hq.read_logs([("north1", 0, offsets[-1]), ("south1", offsets[2] - 1, offsets[-1])])
    with pytest.raises(UnknownRemote):
        hq.read_logs([("north1", 0, offsets[-1]), ("ghost", 0, offsets[-1])])
    assert list(hq.read_logs([])) == []


def test_a_table_in_several_publications_is_one_plan_entry():
    """A subscriber's articles of one table make one entry: joined when they
    select alike, the whole table when one article gives every row and
    column, else a union the reader resolves row by row (agent.site.union)."""
    from agent.site.identity import Role
    from agent.site.selection import plan_from_rows
    from agent.site.union import UNION

    articles = [("t", "a", '["id", "x"]', "region"), ("t", "b", '["id", "x"]', "region"),
                ("t", "c", '["id", "y"]', None), ("t", "d", None, None)]

    def entry(*subscriptions: tuple) -> tuple:
        return plan_from_rows("r", Role.CONSOLIDATED, articles, subscriptions).articles["t"]

    assert entry(("a", "n"), ("b", "s")) == (("id", "x"), "region", frozenset({"n", "s"}))
    assert entry(("a", "n"), ("d", None)) == (None, None, None)
    assert entry(("a", "n"), ("c", None)) == (("id", "x", "y"), UNION, (
        (("id", "x"), "region", frozenset({"n"})), (("id", "y"), None, None)))
    # At a remote the consolidated gets every row, with every column any article publishes.
    assert plan_from_rows("hq", Role.REMOTE, articles[:3], ()).articles == {"t": (("id", "x", "y"), None, None)}


def test_a_removed_article_holds_for_the_log_transactions_before_its_removal():
    """plan_from_rows' ``removed``: each removed article is in the plan's
    history up to its removal, in place of the article its table has in
    that publication now (published again with other columns), the earlier
    of two removals first; one not cut yet (None) holds now; none is
    anything to a subscriber that was not subscribed then."""
    from agent.site.identity import Role
    from agent.site.selection import plan_from_rows

    articles = [("t", "a", '["id", "y"]', None)]  # published again, with y
    removed = [("u", "a", None, "region", 40), ("t", "a", '["id", "x"]', None, 30),
               ("t", "a", '["id", "z"]', None, 20)]
    plan = plan_from_rows("r", Role.CONSOLIDATED, articles, [("a", "n", 0, None)], removed=removed)
    assert plan.articles == {"t": (("id", "y"), None, None)}
    assert plan.history == (
        (20, {"t": (("id", "z"), None, None), "u": (None, "region", frozenset({"n"}))}),
        (30, {"t": (("id", "x"), None, None), "u": (None, "region", frozenset({"n"}))}),
        (40, {"t": (("id", "y"), None, None), "u": (None, "region", frozenset({"n"}))}))
    uncut = plan_from_rows("r", Role.CONSOLIDATED, articles, [("a", "n", 0, None)],
                           removed=[("u", "a", None, "region", None)])
    assert (uncut.articles, uncut.history) == ({"t": (("id", "y"), None, None),
                                                "u": (None, "region", frozenset({"n"}))}, ())
    # Subscribed from 35 on: the removals before it are nothing to it.
    late = plan_from_rows("r", Role.CONSOLIDATED, articles, [("a", "n", 35, None)], removed=removed)
    assert late.history == ((35, {}), (40, {"t": (("id", "y"), None, None), "u": (None, "region", frozenset({"n"}))}))


@pytest.mark.parametrize("columns, subscribe_by", [(None, None), (("id", "b", "c"), None), (None, "a")])
def test_update_runs_stand_for_the_operations_update_makes_of_each_row(columns, subscribe_by):
    """View.update_runs compares the columns of most rows in C and picks
    each run's row in one step (view._pick); a zero, -0.0, or a value of
    another type that compares equal, changes exactly as View.update says."""
    import random

    from agent.site.capture import Shape
    from agent.site.view import View

    shape = Shape(1, "t", ("id", "a", "b", "c"), ("id",))
    view = View(shape, columns, subscribe_by, None if subscribe_by is None else frozenset({0, 1.0, "x", None}))
    values = [0, 0.0, -0.0, 1, 1.0, None, "", "x", b"", b"x", 2.5]
    rng = random.Random(7)
    rows = []
    for seq in range(1, 3001):
        old = [seq, *(rng.choice(values) for _ in range(3))]
        new = [seq, *(value if rng.random() < 0.5 else rng.choice(values) for value in old[1:])]
        rows.append((seq, 1, 2, None, *old, *new))
    expected = [op for op in map(view.update, rows) if op is not None]
    made = list(operations_of(view.update_runs(rows)))
    assert made == expected
    assert repr(made) == repr(expected)  # -0.0 and 0.0, 1 and 1.0 included
    # Row by row (what one pass over the log for many subscribers makes of
    # the rows of a subset): the same operations.
    one_by_one = [Run(*head, [made_row]) for head, made_row in filter(None, map(view.update_row, rows))]
    assert repr(list(operations_of(one_by_one))) == repr(expected)


@pytest.mark.parametrize("seed", range(8))
def test_one_pass_reads_random_changes_of_tricky_values_as_each_reads_alone(tmp_path, seed):
    """Random INSERTs, UPDATEs (moves between subsets, values equal by ==
    but not the same: 0, 0.0, -0.0, 1, 1.0) and DELETEs with re-inserts,
    some applied from a remote that shares its subset with another (a class
    of two): one pass with runs gives each subscriber what it reads alone."""
    import random

    from .conftest import CUSTOMER, make_site

    rng = random.Random(seed)
    hq = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    try:
        hq.create_publication("sales", [Article("customer", subscribe_by="region")])
        regions = {"north1": "north", "north2": "north", "south1": "south", "both": "south"}
        for name, region in regions.items():
            hq.add_remote(name)
            hq.subscribe(name, "sales", region)
        hq.subscribe("both", "sales", "north")
        start = hq.scan()
        app = app_connection(hq)
        tricky = [0, 0.0, -0.0, 1, 1.0, None, "x", b"x"]
        live: dict[int, tuple] = {}
        for round_number in range(6):
            app.execute("BEGIN")
            for _ in range(rng.randrange(5, 40)):
                choice = rng.random()
                if not live or choice < 0.3:
                    key = rng.randrange(1, 30)
                    if key in live:
                        continue
                    live[key] = (rng.choice(["north", "south", "east"]), rng.choice(tricky))
                    app.execute("INSERT INTO customer (id, name, region, extra) VALUES (?, 'c', ?, ?)",
                                (key, *live[key]))
                elif choice < 0.8:
                    key = rng.choice(sorted(live))
                    region = rng.choice([live[key][0], live[key][0], "north", "south", "east"])
                    live[key] = (region, rng.choice(tricky))
                    app.execute("UPDATE customer SET region = ?, extra = ? WHERE id = ?", (*live[key], key))
                else:
                    key = rng.choice(sorted(live))
                    del live[key]
                    app.execute("DELETE FROM customer WHERE id = ?", (key,))
            app.execute("COMMIT")
            hq.scan()
            if round_number % 2:
                key = 100 + round_number
                hq.apply("north1", [Transaction(round_number, "north1", (
                    Operation.insert("customer", (key,), {"id": key, "name": "n", "region": "north",
                                                          "extra": rng.choice(tricky)}),
                ))], log_received=round_number)
                hq.scan()
        end = hq.scan()
        reads = [(name, start, end) for name in regions]
        together: dict[int, list] = {index: [] for index in range(len(reads))}
        for index, transaction in hq.read_logs(reads, runs=True):
            together[index].append(expanded(transaction))
        for index, read in enumerate(reads):
            assert together[index] == list(hq.read_log(*read)), read[0]
    finally:
        hq.close()
