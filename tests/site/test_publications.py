"""Publications, subscriptions and what each subscriber reads, where a
SQLite site is its own: a remote's reads, storage classes, wide capture
rows, text that is not UTF-8.  What both backends do (definitions,
routing, rows moving between subsets) is tests/site/both/test_publications.py;
selection and folding have their own files."""

from __future__ import annotations

from agent.site import Article
from codec.ops import Operation, Transaction

from .conftest import CUSTOMER, app_connection, make_site
from .publishing import read_ops


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
    # The remote's own transaction only: one chunk, its rows of one image and the others.
    assert len(capture_reads) == 2
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
