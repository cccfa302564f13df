"""Publications, subscriptions and what each subscriber reads
(agent.site.publications; selection and folding have their own files)."""

from __future__ import annotations

import pytest

from agent.site import (
    Article,
    InvalidSetting,
    PublicationError,
    UnknownPublication,
    UnknownRemote,
)
from codec.ops import Operation, Transaction

from .conftest import CUSTOMER, app_connection, make_site
from .publishing import hq, read_ops  # noqa: F401  (hq: a fixture)


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
    assert hq.unsubscribe("north1", "sales", "north").changed
    app_connection(hq).execute("INSERT INTO customer (id, region) VALUES (1, 'north')")
    assert read_ops(hq, "north1") == []


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
