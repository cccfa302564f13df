"""Publications, subscriptions and the per-subscriber log reader
(agent.site.publications)."""

from __future__ import annotations

import pytest

from agent.site import (
    Article,
    InvalidSetting,
    LogOffsetError,
    PublicationError,
    UnknownPublication,
    UnknownRemote,
)
from codec.ops import OpKind, Operation, Transaction

from .conftest import CUSTOMER, LINE, app_connection, make_site, replicate, table_rows


def read_ops(site, remote, after=0):
    return [op for t in site.read_log(remote, after, site.scan()) for op in t.ops]


@pytest.fixture
def hq(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER, LINE)
    site.create_publication("sales", [Article("customer", columns=["name", "region"], subscribe_by="region"),
                                      Article("line")])
    for remote, region in (("north1", "north"), ("south1", "south"), ("idle", None)):
        site.add_remote(remote)
    site.subscribe("north1", "sales", "north")
    site.subscribe("south1", "sales", "south")
    yield site
    site.close()


def test_definitions_are_listed(hq):
    (publication,) = hq.publications()
    assert publication.name == "sales"
    assert publication.articles == (Article("customer", ("id", "name", "region"), "region"), Article("line"))
    assert [(s.remote, s.publication, s.value) for s in hq.subscriptions()] == [
        ("north1", "sales", "north"), ("south1", "sales", "south")]
    assert [s.remote for s in hq.subscriptions("south1")] == ["south1"]


def test_column_subset_always_carries_the_key(hq):
    app = app_connection(hq)
    app.execute("INSERT INTO customer VALUES (1, 'Ana', 'north', 99.5, x'00', 'secret')")
    app.execute("UPDATE customer SET balance = 1.0, extra = 'hidden' WHERE id = 1")  # unpublished columns only
    app.execute("UPDATE customer SET name = 'Ana B', balance = 2.0 WHERE id = 1")
    assert read_ops(hq, "north1") == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "region": "north"}),
        Operation.update("customer", (1,), {"name": "Ana"}, {"name": "Ana B"}),
    ]


def test_subscribers_get_only_their_rows(hq):
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'n', 'north'), (2, 's', 'south'),"
                " (3, 'nobody', NULL), (4, 'e', 'east')")
    app.execute("INSERT INTO line VALUES (1, 1, 'sku', 1)")
    assert [op.key for op in read_ops(hq, "north1")] == [(1,), (1, 1)]
    assert [op.key for op in read_ops(hq, "south1")] == [(2,), (1, 1)]
    assert read_ops(hq, "idle") == []  # subscribed to nothing
    hq.subscribe("north1", "sales", "east")  # a second value
    app.execute("UPDATE customer SET name = 'e2' WHERE id = 4")
    end = hq.log_end()
    assert [op.key for op in read_ops(hq, "north1", end)] == [(4,)]


def test_a_row_moving_between_subsets(hq):
    app = app_connection(hq)
    app.execute("INSERT INTO customer VALUES (1, 'Ana', 'north', 5.0, NULL, NULL)")
    start = hq.scan()
    app.execute("UPDATE customer SET region = 'south', name = 'Ana M' WHERE id = 1")
    assert read_ops(hq, "north1", start) == [
        Operation.delete("customer", (1,), {"id": 1, "name": "Ana", "region": "north"})]
    # The new subscriber gets the full published row, not just the changes.
    assert read_ops(hq, "south1", start) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana M", "region": "south"})]
    assert read_ops(hq, "idle", start) == []


def test_a_row_moving_with_a_key_change(hq):
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north')")
    start = hq.scan()
    app.execute("UPDATE customer SET id = 10, region = 'south' WHERE id = 1")
    assert [(op.kind, op.key) for op in read_ops(hq, "north1", start)] == [(3, (1,))]
    assert [(op.kind, op.key) for op in read_ops(hq, "south1", start)] == [(1, (10,))]


def test_changes_from_a_remote_are_forwarded_but_not_echoed(hq):
    start = hq.scan()
    batch = [Transaction(5, "north1", (
        Operation.insert("customer", (7,), {"id": 7, "name": "from north", "region": "north"}),
        Operation.insert("customer", (8,), {"id": 8, "name": "for south", "region": "south"}),
        Operation.insert("line", (1, 7), {"order_id": 7, "line_no": 1, "sku": "A", "qty": 2}),
    ))]
    hq.apply("north1", batch, log_received=5)
    # north1 made these: nothing comes back, except a DELETE for the row it
    # put outside its own subset, so it ends up holding exactly its rows.
    assert read_ops(hq, "north1", start) == [
        Operation.delete("customer", (8,), {"id": 8, "name": "for south", "region": "south"})]
    assert [op.key for op in read_ops(hq, "south1", start)] == [(8,), (1, 7)]


def test_a_remote_that_moves_a_row_out_gets_a_delete(hq):
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north')")
    start = hq.scan()
    hq.apply("north1", [Transaction(3, "north1", (
        Operation.update("customer", (1,), {"region": "north"}, {"region": "south"}),))], log_received=3)
    assert read_ops(hq, "north1", start) == [
        Operation.delete("customer", (1,), {"id": 1, "name": "Ana", "region": "south"})]
    assert read_ops(hq, "south1", start) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "region": "south"})]


def test_a_remote_reads_everything_for_its_consolidated(tmp_path):
    remote = make_site(tmp_path, "north1", "remote", CUSTOMER)
    remote.create_publication("sales", [Article("customer", subscribe_by="region")])
    remote.add_remote("hq")
    app = app_connection(remote)
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'a', 'north'), (2, 'b', 'elsewhere')")
    assert [op.key for op in read_ops(remote, "hq")] == [(1,), (2,)]
    # ...but not what the consolidated sent it.
    start = remote.log_end()
    remote.apply("hq", [Transaction(9, "hq", (Operation.insert("customer", (3,), {"id": 3, "region": "north"}),))],
                 log_received=9)
    assert read_ops(remote, "hq", start) == []
    remote.close()


def test_a_table_belongs_to_one_publication(hq):
    hq.create_publication("other")
    with pytest.raises(PublicationError, match="already published in 'sales'"):
        hq.add_article("other", "customer")


def test_bad_definitions_are_refused(hq):
    with pytest.raises(UnknownPublication):
        hq.add_article("nope", "line")
    hq.connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a)")
    hq.create_publication("p2")
    with pytest.raises(PublicationError, match="no column 'zzz'"):
        hq.add_article("p2", "t", columns=["zzz"])
    with pytest.raises(PublicationError, match="SUBSCRIBE BY column 'zzz'"):
        hq.add_article("p2", "t", subscribe_by="zzz")
    with pytest.raises(PublicationError, match="exists already"):
        hq.create_publication("p2")
    with pytest.raises(UnknownRemote):
        hq.subscribe("ghost", "sales", "north")
    with pytest.raises(UnknownPublication):
        hq.subscribe("north1", "nope", "north")
    with pytest.raises(InvalidSetting):
        hq.subscribe("north1", "sales", [1, 2])
    with pytest.raises(UnknownRemote):
        hq.read_log("ghost", 0)


def test_dropping_a_publication_stops_capture_and_subscriptions(hq):
    hq.drop_publication("sales")
    app_connection(hq).execute("INSERT INTO line VALUES (1, 1, 'a', 1)")
    assert hq.connection.execute("SELECT count(*) FROM fieldsync_capture").fetchone()[0] == 0
    assert hq.subscriptions() == ()
    assert hq.publications() == ()


def test_unsubscribe(hq):
    assert hq.unsubscribe("north1", "sales") == 1
    app_connection(hq).execute("INSERT INTO customer (id, region) VALUES (1, 'north')")
    assert read_ops(hq, "north1") == []


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


def test_updates_carry_exactly_the_columns_that_changed(tmp_path):
    """Changed means another value or another storage class: 1 -> 1.0,
    0.0 -> -0.0 and '' -> NULL are changes; writing the same values is none."""
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    site.create_publication("sales", ["customer"])
    site.add_remote("r1")
    site.subscribe("r1", "sales")
    app = app_connection(site)
    app.execute("INSERT INTO customer (id, name, balance, extra) VALUES (1, '', 2.5, 1)")
    app.execute("INSERT INTO customer (id, name, balance, extra) VALUES (2, 'b', 0.0, 0.0)")
    start = site.scan()
    app.execute("UPDATE customer SET name = NULL, extra = 1.0 WHERE id = 1")
    app.execute("UPDATE customer SET extra = -0.0 WHERE id = 2")
    app.execute("UPDATE customer SET name = 'b', balance = 0.0 WHERE id = 2")
    ops = read_ops(site, "r1", start)
    assert [(op.key, op.before, op.after) for op in ops] == [
        ((1,), {"name": "", "extra": 1}, {"name": None, "extra": 1.0}),
        ((2,), {"extra": 0.0}, {"extra": -0.0})]
    assert str(ops[1].after["extra"]) == "-0.0"
    site.close()


def test_a_subscriber_reads_none_of_its_own_log_transactions(tmp_path):
    """A remote's log is mostly what the consolidated sent it: reading for
    the consolidated does not fetch those capture rows at all."""
    remote = make_site(tmp_path, "north1", "remote", CUSTOMER)
    remote.create_publication("sales", [Article("customer")])
    remote.add_remote("hq")
    start = remote.log_end()
    remote.apply("hq", [Transaction(9, "hq", tuple(
        Operation.insert("customer", (i,), {"id": i, "region": "north"}) for i in range(1, 101)))], log_received=9)
    app_connection(remote).execute("UPDATE customer SET name = 'mine' WHERE id = 50")
    statements: list[str] = []
    remote.connection.set_trace_callback(statements.append)
    ops = read_ops(remote, "hq", start)
    remote.connection.set_trace_callback(None)
    assert [op.key for op in ops] == [(50,)]
    capture_reads = [s for s in statements if "FROM fieldsync_capture WHERE seq" in s]
    assert len(capture_reads) == 1  # the remote's own transaction only
    remote.close()


def test_rows_of_a_wider_table_no_longer_published_are_skipped(tmp_path):
    """Capture rows are fetched only as wide as the subscriber's tables need;
    rows of a wider table unpublished since stay in the log and are skipped."""
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER,
                     "CREATE TABLE wide (id INTEGER PRIMARY KEY, " + ", ".join(f"c{i}" for i in range(20)) + ")")
    site.create_publication("sales", ["customer", "wide"])
    site.add_remote("r1")
    site.subscribe("r1", "sales")
    start = site.scan()
    app = app_connection(site)
    app.execute("INSERT INTO wide (id, c19) VALUES (1, 'last')")
    app.execute("INSERT INTO customer (id, name) VALUES (1, 'a')")
    assert [op.table for op in read_ops(site, "r1", start)] == ["wide", "customer"]
    site.remove_article("wide")
    app.execute("INSERT INTO customer (id, name) VALUES (2, 'b')")
    assert [(op.table, op.key) for op in read_ops(site, "r1", start)] == [("customer", (1,)), ("customer", (2,))]
    site.close()


def test_the_router_offers_each_row_to_the_subscribers_it_can_concern_and_no_fewer(hq):
    """One pass over the log for many subscribers (the Spark batch job)
    offers each capture row only to some readers; every reader that selects
    the row must be among them, and rows of a value go to its subscribers."""
    from agent.site.publications import Router, SubscriberReader

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
    readers = [SubscriberReader.from_database(hq.connection, hq.identity, hq._shapes, name) for name in names]
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


@pytest.mark.parametrize("hold", [50_000, 100, 0])
def test_one_pass_reads_for_each_subscriber_what_it_reads_alone(hq, hold):
    hq.add_remote("ghostless")
    reads = _reads(_busy_log(hq))
    alone = {index: list(hq.read_log(*read)) for index, read in enumerate(reads)}
    together: dict[int, list] = {index: [] for index in range(len(reads))}
    for index, transaction in hq.read_logs(reads, hold=hold):
        together[index].append(transaction)
    assert together == alone
    assert all(alone[index] for index in range(4)) and alone[4] == []
    # The bulk transaction holds more than 100 selected operations, so with
    # the smaller holds it was read for each subscriber on its own: the same.
    assert min(max(len(t.ops) for t in alone[index]) for index in (0, 1, 3)) > 100
    for index, transactions in together.items():
        commits = [t.commit for t in transactions]
        assert commits == sorted(set(commits))
        start, end = reads[index][1:]
        assert all(start < commit <= end for commit in commits)


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
    # The log is under one chunk: one statement reads it for all four; alone,
    # each subscriber reads it again.
    assert len(together) == 1 and len(alone) >= 4


def test_the_router_leaves_each_reader_its_own_transactions(hq):
    """Fanout alone: fed the capture rows of the whole log, each reader gets
    exactly the transactions of its range, as read_transactions makes them."""
    from agent.site.publications import Fanout, SubscriberReader

    reads = _reads(_busy_log(hq))[:4]
    readers = [SubscriberReader.from_database(hq.connection, hq.identity, hq._shapes, name) for name, _, _ in reads]
    fanout = Fanout(readers, [(after, until) for _, after, until in reads])
    got: dict[int, list] = {index: [] for index in range(len(reads))}
    low, high = min(read[1] for read in reads), max(read[2] for read in reads)
    for commit, origin, rows, _returned in hq.read_capture(low, high, value_columns=12):
        for index, transaction in fanout.add(commit, origin, rows):
            assert transaction.commit < commit  # given out once its log transaction is complete
            got[index].append(transaction)
    for index, transaction in fanout.finish():
        got[index].append(transaction)
    assert got == {index: list(hq.read_log(*read)) for index, read in enumerate(reads)}


def test_one_pass_checks_every_range_before_reading(hq):
    offsets = _busy_log(hq)
    with pytest.raises(InvalidSetting, match="at most once"):
        hq.read_logs([("north1", 0, offsets[-1]), ("north1", offsets[2], offsets[-1])])
    with pytest.raises(LogOffsetError, match="not a commit offset"):
        hq.read_logs([("north1", 0, offsets[-1]), ("south1", offsets[2] - 1, offsets[-1])])
    with pytest.raises(UnknownRemote):
        hq.read_logs([("north1", 0, offsets[-1]), ("ghost", 0, offsets[-1])])
    assert list(hq.read_logs([])) == []


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


def test_text_that_is_not_utf8_is_sent_with_replacement_characters(tmp_path, caplog):
    """An application that stores bytes as TEXT must not stop every read of
    the log for good: the value goes out with U+FFFD, and a warning says so."""
    hq = make_site(tmp_path, "hq", "consolidated", "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    hq.create_publication("p", [Article("t")])
    hq.add_remote("n1", address="n1@example.org")
    hq.subscribe("n1", "p")
    app = app_connection(hq)
    app.execute("INSERT INTO t VALUES (1, CAST(x'ff41' AS TEXT)), (2, 'ok')")
    app.execute("INSERT INTO t VALUES (3, 'later')")
    with caplog.at_level("WARNING", logger="fieldsync.site"):
        ops = read_ops(hq, "n1")
    assert [(op.key, op.after) for op in ops] == [((1,), {"id": 1, "v": "\ufffdA"}), ((2,), {"id": 2, "v": "ok"}),
                                                  ((3,), {"id": 3, "v": "later"})]
    assert "not valid UTF-8 (b'\\xffA'...)" in caplog.text
    assert app.execute("SELECT 'é'").fetchone() == ("é",)  # the connection reads strictly again
    assert hq.connection.text_factory is str
