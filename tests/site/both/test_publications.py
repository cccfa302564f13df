"""Publications and subscriptions, and what each remote reads of the log,
on both backends: definitions, column subsets, SUBSCRIBE BY routing, rows
moving between subsets (a DELETE of the old row for the one it leaves),
key moves, a remote's own changes not echoed."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from agent.site import Article, InvalidSetting, PublicationError, UnknownPublication, UnknownRemote
from agent.site.extraction import Extraction
from codec.ops import OpKind, Operation, Transaction


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("sales", [Article("customer", columns=["name", "region"], subscribe_by="region"),
                                      Article("line")])
    for remote in ("north1", "south1", "idle"):
        site.add_remote(remote)
    site.subscribe("north1", "sales", "north")
    site.subscribe("south1", "sales", "south")
    return site


def test_definitions_are_listed(hq):
    (publication,) = hq.publications()
    assert publication.name == "sales"
    assert publication.articles == (Article("customer", ("id", "name", "region"), "region"), Article("line"))
    assert [(s.remote, s.publication, s.value) for s in hq.subscriptions()] == [
        ("north1", "sales", "north"), ("south1", "sales", "south")]
    assert [s.remote for s in hq.subscriptions("south1")] == ["south1"]


def test_an_article_added_later_is_listed_and_captured(backend, hq):
    app = backend.app()
    app.execute("CREATE TABLE note (id integer PRIMARY KEY, body text, region text)")
    hq.create_publication("notes")
    article = hq.add_article("notes", "note", subscribe_by="region")
    assert article == Article("note", None, "region")
    assert sorted(p.name for p in hq.publications()) == ["notes", "sales"]
    hq.subscribe("north1", "notes", "north")
    app.execute("INSERT INTO note VALUES (1, 'hello', 'north'), (2, 'other', 'south')")
    assert backend.read_ops("north1") == [Operation.insert("note", (1,), {"id": 1, "body": "hello",
                                                                           "region": "north"})]


def test_column_subset_always_carries_the_key(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO customer VALUES (1, 'Ana', 'north', 99.5, NULL)")
    app.execute("UPDATE customer SET balance = 1.0 WHERE id = 1")  # unpublished columns only
    app.execute("UPDATE customer SET name = 'Ana B', balance = 2.0 WHERE id = 1")
    assert backend.read_ops("north1") == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "region": "north"}),
        Operation.update("customer", (1,), {"name": "Ana"}, {"name": "Ana B"}),
    ]


def test_subscribers_get_only_their_rows(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'n', 'north'), (2, 's', 'south'),"
                " (3, 'nobody', NULL), (4, 'e', 'east')")
    app.execute("INSERT INTO line VALUES (1, 1, 'sku', 1)")
    assert [op.key for op in backend.read_ops("north1")] == [(1,), (1, 1)]
    assert [op.key for op in backend.read_ops("south1")] == [(2,), (1, 1)]
    assert backend.read_ops("idle") == []  # subscribed to nothing
    hq.subscribe("north1", "sales", "east")  # a second value
    end = hq.log_end()
    app.execute("UPDATE customer SET name = 'e2' WHERE id = 4")
    assert [op.key for op in backend.read_ops("north1", end)] == [(4,)]


def test_a_row_moving_between_subsets(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO customer VALUES (1, 'Ana', 'north', 5.0, NULL)")
    start = hq.scan()
    app.execute("UPDATE customer SET region = 'south', name = 'Ana M' WHERE id = 1")
    # The remote it leaves gets a DELETE of the row it holds (the old values).
    assert backend.read_ops("north1", start) == [
        Operation.delete("customer", (1,), {"id": 1, "name": "Ana", "region": "north"})]
    # The new subscriber gets the full published row, not just the changes.
    assert backend.read_ops("south1", start) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana M", "region": "south"})]
    assert backend.read_ops("idle", start) == []


def test_a_row_moving_with_a_key_change(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north')")
    start = hq.scan()
    app.execute("UPDATE customer SET id = 10, region = 'south' WHERE id = 1")
    assert [(op.kind, op.key) for op in backend.read_ops("north1", start)] == [(3, (1,))]
    assert [(op.kind, op.key) for op in backend.read_ops("south1", start)] == [(1, (10,))]


def test_changes_from_a_remote_are_forwarded_but_not_echoed(backend, hq):
    start = hq.scan()
    batch = [Transaction(5, "north1", (
        Operation.insert("customer", (7,), {"id": 7, "name": "from north", "region": "north"}),
        Operation.insert("customer", (8,), {"id": 8, "name": "for south", "region": "south"}),
        Operation.insert("line", (1, 7), {"order_id": 7, "line_no": 1, "sku": "A", "qty": 2}),
    ))]
    hq.apply("north1", batch, log_received=5)
    # north1 made these: nothing comes back, except a DELETE for the row it
    # put outside its own subset, so it ends up holding exactly its rows.
    assert backend.read_ops("north1", start) == [
        Operation.delete("customer", (8,), {"id": 8, "name": "for south", "region": "south"})]
    assert [op.key for op in backend.read_ops("south1", start)] == [(8,), (1, 7)]


def test_a_remote_that_moves_a_row_out_gets_a_delete(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north')")
    start = hq.scan()
    hq.apply("north1", [Transaction(3, "north1", (
        Operation.update("customer", (1,), {"region": "north"}, {"region": "south"}),))], log_received=3)
    assert backend.read_ops("north1", start) == [
        Operation.delete("customer", (1,), {"id": 1, "name": "Ana", "region": "south"})]
    assert backend.read_ops("south1", start) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "region": "south"})]


def test_a_table_in_two_publications_reaches_a_subscriber_of_both_once_with_the_columns_that_keep_each_row(
        backend, hq):
    hq.create_publication("ledger", [Article("customer", columns=["balance"])])  # every row, its balance
    assert [article.columns for item in hq.publications() for article in item.articles if article.table == "customer"] \
        == [("id", "balance"), ("id", "name", "region")]
    hq.subscribe("north1", "ledger")
    app = backend.app()
    start = hq.scan()
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, 'Ana', 'north', 10.0)")
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (2, 'Bo', 'south', 20.0)")
    assert backend.read_ops("north1", start) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "region": "north", "balance": 10.0}),
        Operation.insert("customer", (2,), {"id": 2, "name": None, "region": None, "balance": 20.0})]
    assert backend.read_ops("south1", start) == [
        Operation.insert("customer", (2,), {"id": 2, "name": "Bo", "region": "south"})]
    start = hq.scan()
    app.execute("UPDATE customer SET region = 'south' WHERE id = 1")  # leaves sales for north1; ledger keeps it
    app.execute("UPDATE customer SET region = 'north' WHERE id = 2")  # enters sales for north1, which holds it
    app.execute("UPDATE customer SET balance = 11.0 WHERE id = 1")
    assert backend.read_ops("north1", start) == [
        Operation.update("customer", (1,), {"name": "Ana", "region": "north"}, {"name": None, "region": None}),
        Operation.update("customer", (2,), {"name": None, "region": None}, {"name": "Bo", "region": "north"}),
        Operation.update("customer", (1,), {"balance": 10.0}, {"balance": 11.0})]
    assert backend.read_ops("south1", start) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "region": "south"}),
        Operation.delete("customer", (2,), {"id": 2, "name": "Bo", "region": "south"})]
    # One pass for both reads for each what it reads alone.
    end = hq.scan()
    fanned: dict[int, list] = {0: [], 1: []}
    for index, transaction in hq.read_logs([("north1", 0, end), ("south1", 0, end)]):
        fanned[index] += transaction.ops
    assert fanned == {0: backend.read_ops("north1"), 1: backend.read_ops("south1")}


def test_a_row_a_remote_takes_out_of_one_subset_stays_while_another_keeps_it(backend, hq):
    hq.create_publication("ledger", [Article("customer", columns=["balance"], subscribe_by="balance")])
    hq.subscribe("north1", "ledger", 20.0)
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, 'Ana', 'north', 20.0)")
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (3, 'Cy', 'south', 20.0)")
    start = hq.scan()
    hq.apply("north1", [Transaction(3, "north1", (
        Operation.update("customer", (1,), {"balance": 20.0}, {"balance": 10.0}),  # leaves ledger; sales keeps it
        Operation.update("customer", (3,), {"balance": 20.0}, {"balance": 10.0})))], log_received=3)  # kept by none
    assert backend.rows("customer", "id, balance") == [(1, 10.0), (3, 10.0)]
    assert [(op.kind, op.key) for op in backend.read_ops("north1", start) if op.kind != OpKind.UPDATE] == [
        (OpKind.DELETE, (3,))]


def test_a_remote_of_two_publications_of_a_table_is_extracted_with_each_row_once(backend, hq, tmp_path):
    """The copy holds what the stream would have sent: each row any of its
    articles keeps, once, with the columns of those that keep it (NULL in
    the others); alone and with others at one point."""
    hq.create_publication("ledger", [Article("customer", columns=["balance"], subscribe_by="balance")])
    hq.subscribe("north1", "ledger", 20.0)
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, 'Ana', 'north', 10.0)")
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (2, 'Bo', 'south', 20.0)")
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (3, 'Cy', 'north', 20.0)")
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (4, 'Di', 'south', 30.0)")
    owed = [(1, "Ana", "north", None), (2, None, None, 20.0), (3, "Cy", "north", 20.0)]
    single = hq.extract("north1", tmp_path / "north1.db")
    many = {result.remote: result for result in hq.extract_many(
        [Extraction("north1", tmp_path / "again-north1.db"), Extraction("south1", tmp_path / "south1.db")])}
    for result in (single, many["north1"]):
        with closing(sqlite3.connect(result.path)) as copy:
            assert copy.execute("SELECT id, name, region, balance FROM customer ORDER BY id").fetchall() == owed
            assert copy.execute("SELECT publication, table_name FROM fieldsync_article WHERE table_name = 'customer'"
                                " ORDER BY publication").fetchall() == [("ledger", "customer"), ("sales", "customer")]
    with closing(sqlite3.connect(many["south1"].path)) as copy:
        assert copy.execute("SELECT * FROM customer ORDER BY id").fetchall() == [(2, "Bo", "south"), (4, "Di", "south")]


def test_a_table_is_published_once_in_a_publication(backend, hq):
    with pytest.raises(PublicationError, match="already published in 'sales'"):
        hq.add_article("sales", "customer")


def test_bad_definitions_are_refused(backend, hq):
    with pytest.raises(UnknownPublication):
        hq.add_article("nope", "line")
    backend.app().execute("CREATE TABLE t (id integer PRIMARY KEY, a text)")
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
        list(hq.read_log("ghost", 0))
    assert sorted(p.name for p in hq.publications()) == ["p2", "sales"]


def test_dropping_a_publication_stops_capture_and_subscriptions(backend, hq):
    hq.drop_publication("sales")
    backend.app().execute("INSERT INTO line VALUES (1, 1, 'a', 1)")
    assert hq.scan() == 0
    assert hq.subscriptions() == ()
    assert hq.publications() == ()


def test_what_a_remote_still_sends_of_a_removed_table(backend, hq):
    """A table the consolidated stopped publishing where no extracted
    remote held it (nothing went to the remotes; docs/cli.md, "agent
    publication"): a SQLite consolidated applies what a remote sends to the
    table, which captures it for no one; a PostgreSQL one records each
    operation as an apply error.  (Where the removal went to the remotes,
    tests/site/both/test_article_removal.py.)"""
    hq.apply("north1", [Transaction(5, "north1", (
        Operation.insert("customer", (1,), {"id": 1, "name": "a", "region": "north"}),))], log_received=5)
    hq.remove_article("customer")
    start = hq.scan()
    result = hq.apply("north1", [Transaction(9, "north1", (
        Operation.insert("customer", (2,), {"id": 2, "name": "b", "region": "north"}),
        Operation.update("customer", (1,), {"name": "a"}, {"name": "a2"})))], log_received=9)
    assert hq.remote("north1").log_received == 9
    if backend.name == "sqlite":
        assert (result.operations_applied, result.errors) == (2, 0)
        assert backend.rows("customer", "id, name") == [(1, "a2"), (2, "b")]
        assert hq.apply_errors() == ()
    else:
        assert (result.operations_applied, result.errors) == (0, 2)
        assert backend.rows("customer", "id, name") == [(1, "a")]
        assert [error.problem for error in hq.apply_errors()] == ["no published table 'customer' at this site"] * 2
    assert backend.read_ops("south1", start) == []


def test_unsubscribe(backend, hq):
    assert hq.unsubscribe("north1", "sales", "north").changed
    backend.app().execute("INSERT INTO customer (id, region) VALUES (1, 'north')")
    assert backend.read_ops("north1") == []
    assert [op.key for op in backend.read_ops("south1")] == []
    with pytest.raises(InvalidSetting):
        hq.unsubscribe("north1", "sales", "north")


def test_a_row_moving_between_two_values_of_one_remote_stays_an_update(backend, hq):
    hq.subscribe("north1", "sales", "east")
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north'), (2, 'Bo', NULL)")
    start = hq.scan()
    app.execute("UPDATE customer SET region = 'east' WHERE id = 1")
    app.execute("UPDATE customer SET region = 'north', name = 'Bo N' WHERE id = 2")  # from no subset into one
    assert backend.read_ops("north1", start) == [
        Operation.update("customer", (1,), {"region": "north"}, {"region": "east"}),
        Operation.insert("customer", (2,), {"id": 2, "name": "Bo N", "region": "north"})]
    assert backend.read_ops("south1", start) == []


def test_updates_carry_exactly_the_columns_whose_values_changed(backend, hq):
    """'' -> NULL and NULL -> '' are changes; writing the same values is none."""
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, '', 'north', 2.5), (2, NULL, 'north', 0)")
    start = hq.scan()
    app.execute("UPDATE customer SET name = NULL, balance = 2.5 WHERE id = 1")
    app.execute("UPDATE customer SET name = '' WHERE id = 2")
    app.execute("UPDATE customer SET name = '', region = 'north' WHERE id = 2")  # nothing changes
    assert [(op.key, op.before, op.after) for op in backend.read_ops("north1", start)] == [
        ((1,), {"name": ""}, {"name": None}), ((2,), {"name": None}, {"name": ""})]


def test_a_subscribe_by_column_not_published_still_routes_rows(backend, hq, tmp_path):
    app = backend.app()
    app.execute("CREATE TABLE note (id integer PRIMARY KEY, body text, region text)")
    hq.create_publication("notes", [Article("note", columns=["body"], subscribe_by="region")])
    hq.subscribe("north1", "notes", "north")
    hq.subscribe("south1", "notes", "south")
    app.execute("INSERT INTO note VALUES (1, 'a', 'north'), (2, 'b', 'south'), (3, 'c', 'north')")
    result = hq.extract("north1", tmp_path / "north1.db")
    import sqlite3

    with sqlite3.connect(result.path) as remote:
        assert remote.execute("SELECT * FROM note ORDER BY id").fetchall() == [(1, "a"), (3, "c")]
    start = hq.scan()
    app.execute("UPDATE note SET region = 'south', body = 'a2' WHERE id = 1")
    app.execute("UPDATE note SET body = 'c2' WHERE id = 3")
    assert backend.read_ops("north1", start) == [Operation.delete("note", (1,), {"id": 1, "body": "a"}),
                                                 Operation.update("note", (3,), {"body": "c"}, {"body": "c2"})]
    assert backend.read_ops("south1", start) == [Operation.insert("note", (1,), {"id": 1, "body": "a2"})]


def test_a_key_change_applied_from_a_remote_reaches_the_others_as_one(backend, hq):
    app = backend.app()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'north')")
    hq.subscribe("south1", "sales", "north")
    start = hq.scan()
    hq.update_remote("north1", log_sent=start, confirm_sent=start)  # north1 holds row 1 (no unconfirmed change)
    hq.apply("north1", [Transaction(4, "north1", (
        Operation.update("customer", (1,), {"id": 1, "name": "Ana"}, {"id": 5, "name": "Ana K"}),))], log_received=4)
    assert backend.rows("customer", "id, name") == [(5, "Ana K")]
    assert backend.read_ops("south1", start) == [
        Operation.update("customer", (1,), {"id": 1, "name": "Ana"}, {"id": 5, "name": "Ana K"})]
    assert backend.read_ops("north1", start) == []
