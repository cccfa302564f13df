"""An article removed at the consolidated reaches the extracted remotes that
hold its table, through their streams, on both backends: each stops
capturing the table and keeps its rows (docs/site-database.md, "Removing an
article")."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.site import Article
from agent.site.sqlite.database import SiteDatabase
from codec.changes import SchemaChange
from codec.ops import Operation, Transaction, change_of

REGIONS = {"north1": "north", "south1": "south", "north2": "north"}


@pytest.fixture
def hq(backend):
    """sales: customer (two columns, by region) and line; catalog: line.
    north1 and south1 subscribe to sales, north1 to catalog too; none is
    extracted yet."""
    site = backend.site
    site.create_publication("sales", [Article("customer", columns=["name", "region"], subscribe_by="region"),
                                      Article("line")])
    site.create_publication("catalog", [Article("line")])
    for remote, region in REGIONS.items():
        site.add_remote(remote, address=f"inbox/{remote}")
        site.subscribe(remote, "sales", region)
    site.subscribe("north1", "catalog")
    backend.app().run(*[("INSERT INTO customer (id, name, region) VALUES (%s, %s, %s)",
                         (row_id, f"c{row_id}", ("north", "south")[row_id % 2])) for row_id in range(1, 7)],
                      "INSERT INTO line VALUES (1, 1, 'sku-1', 2)")
    return site


def changes(hq, remote: str, start: int, end: int) -> list[SchemaChange]:
    return [change_of(t) for t in hq.read_log(remote, start, end) if change_of(t) is not None]


def deliver(hq, remote: SiteDatabase, end: int) -> None:
    """hq's stream to ``remote`` up to ``end``, applied there; no error."""
    name = remote.identity.name
    start = remote.remote("hq").log_received
    remote.apply("hq", list(hq.read_log(name, start, end)), log_received=end)
    assert remote.apply_errors() == ()


def sent_tables(remote: SiteDatabase) -> set[str]:
    """The tables of the operations ``remote`` would send hq now."""
    end = remote.scan()
    return {op.table for t in remote.read_log("hq", remote.remote("hq").log_sent, end) for op in t.ops}


def articles(remote: SiteDatabase) -> list[tuple[str, str]]:
    return sorted((publication.name, article.table) for publication in remote.publications()
                  for article in publication.articles)


def test_a_removed_article_reaches_each_extracted_subscriber_which_stops_capturing_its_table(
        backend, hq, tmp_path: Path):
    paths = {name: hq.extract(name, tmp_path / f"{name}.db").path for name in ("north1", "south1")}
    start = hq.scan()
    assert hq.remove_article("customer") == ("north1", "south1")  # north2 was never extracted
    end = hq.scan()
    for name in ("north1", "south1"):
        assert changes(hq, name, start, end) == [SchemaChange((("drop_article", "customer", "sales"),), ())]
    assert list(hq.read_log("north2", start, end)) == []
    with SiteDatabase.open(paths["north1"]) as north1:
        held = north1.connection.execute("SELECT * FROM customer ORDER BY id").fetchall()
        assert len(held) == 3
        north1.connection.execute("UPDATE customer SET name = 'before' WHERE id = 2")  # captured, not sent yet
        deliver(hq, north1, end)
        assert articles(north1) == [("catalog", "line"), ("sales", "line")]
        assert north1.connection.execute("SELECT id, name FROM customer ORDER BY id").fetchall() == [
            (2, "before"), (4, "c4"), (6, "c6")]
        north1.connection.execute("UPDATE customer SET name = 'after' WHERE id = 4")
        north1.connection.execute("INSERT INTO line VALUES (2, 1, 'sku-2', 1)")
        # Neither write to customer goes to hq: the one captured before the
        # removal is read with the articles of now, like every later one.
        assert sent_tables(north1) == {"line"}
    assert hq.open_apply_errors() == {}


def test_a_dropped_publication_reaches_a_remote_that_reads_its_stream_later(backend, hq, tmp_path: Path):
    path = hq.extract("south1", tmp_path / "south1.db").path
    start = hq.scan()
    assert hq.drop_publication("sales") == ("south1",)
    backend.app().execute("UPDATE line SET qty = 5")  # line is still in catalog, which south1 does not get
    end = hq.scan()
    assert hq.subscriptions("south1") == ()
    assert changes(hq, "south1", start, end) == [SchemaChange(
        (("drop_article", "customer", "sales"), ("drop_article", "line", "sales")), ())]
    with SiteDatabase.open(path) as south1:
        deliver(hq, south1, end)
        assert articles(south1) == []
        south1.connection.execute("UPDATE line SET qty = 9")
        assert sent_tables(south1) == set()
        assert south1.connection.execute("SELECT count(*) FROM customer").fetchone() == (3,)


def test_rows_logged_before_a_removal_reach_a_remote_that_reads_them_after_it(backend, hq, tmp_path: Path):
    """A removed article holds for the log transactions before its removal:
    a remote that had not read them yet gets them, in order, then the
    removal; what the consolidated writes to the table afterwards is not
    sent (it is not captured any more).  A read of many remotes at once
    (the fan-out of a send phase) selects the same, and a range before the
    removal read again after it (a message sent again) holds what it held."""
    paths = {name: hq.extract(name, tmp_path / f"{name}.db").path for name in ("north1", "south1")}
    start = hq.scan()
    app = backend.app()
    app.run("UPDATE customer SET name = 'late' WHERE id IN (1, 2)",
            ("INSERT INTO customer (id, name, region) VALUES (%s, %s, %s)", (8, "new", "north")))
    middle = hq.scan()
    sent = {name: list(hq.read_log(name, start, middle)) for name in ("north1", "south1")}
    assert hq.remove_article("customer") == ("north1", "south1")
    # Sent again after the removal, a range before it holds what it held.
    assert {name: list(hq.read_log(name, start, middle)) for name in ("north1", "south1")} == sent
    app.run("UPDATE customer SET name = 'after' WHERE id IN (1, 2)")
    end = hq.scan()
    alone = {name: list(hq.read_log(name, start, end)) for name in ("north1", "south1")}
    together = {name: [] for name in ("north1", "south1")}
    for index, transaction in hq.read_logs([("north1", start, end), ("south1", start, end)]):
        together[("north1", "south1")[index]].append(transaction)
    assert together == alone
    for name, wanted in (("north1", [(2, "late"), (4, "c4"), (6, "c6"), (8, "new")]),
                         ("south1", [(1, "late"), (3, "c3"), (5, "c5")])):
        assert [change_of(t) for t in alone[name]][-1] == SchemaChange((("drop_article", "customer", "sales"),), ())
        with SiteDatabase.open(paths[name]) as remote:
            deliver(hq, remote, end)
            assert remote.connection.execute("SELECT id, name FROM customer ORDER BY id").fetchall() == wanted
            assert articles(remote) == ([("catalog", "line")] if name == "north1" else []) + [("sales", "line")]
    assert hq.open_apply_errors() == {}


def test_a_dropped_publication_holds_for_what_was_logged_before_it(backend, hq, tmp_path: Path):
    """Its articles and its subscriptions (ended, not deleted) hold for the
    log transactions before the drop, for a remote that reads them later;
    once every remote confirmed past the drop, truncation forgets them."""
    path = hq.extract("south1", tmp_path / "south1.db").path
    start = hq.scan()
    backend.app().run("UPDATE customer SET name = 'late' WHERE id = 3", "UPDATE line SET qty = 7")
    hq.scan()
    assert hq.drop_publication("sales") == ("south1",)
    assert hq.subscriptions("south1") == ()  # ended (on PostgreSQL, by the next cut)
    end = hq.scan()
    with SiteDatabase.open(path) as south1:
        deliver(hq, south1, end)
        assert south1.connection.execute("SELECT id, name FROM customer ORDER BY id").fetchall() == [
            (1, "c1"), (3, "late"), (5, "c5")]
        assert south1.connection.execute("SELECT qty FROM line").fetchall() == [(7,)]
        assert articles(south1) == []
    assert len(hq.removed_articles()) == 2
    for remote in REGIONS:
        hq.update_remote(remote, log_sent=end, confirm_sent=end)
    assert hq.truncate_log() == end
    assert hq.removed_articles() == []
    assert list(hq.read_log("south1", end)) == []


def test_a_table_the_remote_gets_through_another_publication_stays_captured_there(backend, hq, tmp_path: Path):
    path = hq.extract("north1", tmp_path / "north1.db").path
    start = hq.scan()
    assert hq.remove_article("line", "sales") == ("north1",)  # south1 was never extracted
    end = hq.scan()
    assert changes(hq, "north1", start, end) == [SchemaChange((("drop_article", "line", "sales"),), ())]
    with SiteDatabase.open(path) as north1:
        deliver(hq, north1, end)
        assert articles(north1) == [("catalog", "line"), ("sales", "customer")]
        north1.connection.execute("UPDATE line SET qty = 3")
        assert sent_tables(north1) == {"line"}


def test_an_article_no_extracted_remote_holds_writes_nothing_to_the_log(backend, hq):
    end = hq.scan()
    assert hq.remove_article("customer") == ()
    assert hq.drop_publication("catalog") == ()
    assert hq.scan() == end


def test_what_a_remote_captured_before_it_applied_the_removal_is_dropped_at_the_consolidated(
        backend, hq, tmp_path: Path):
    """As a dropped column's values are (agent.site.apply.reshape): no apply
    error for a remote that could not know; the rest of its transaction
    applies."""
    path = hq.extract("north1", tmp_path / "north1.db").path
    with SiteDatabase.open(path) as north1:
        north1.connection.execute("BEGIN")
        north1.connection.execute("UPDATE customer SET name = 'by north1' WHERE id = 2")
        north1.connection.execute("INSERT INTO line VALUES (3, 1, 'sku-3', 1)")
        north1.connection.execute("COMMIT")
        end = north1.scan()
        sent = list(north1.read_log("hq", north1.remote("hq").log_sent, end))
    assert {op.table for t in sent for op in t.ops} == {"customer", "line"}
    hq.remove_article("customer")
    result = hq.apply("north1", sent, log_received=end)
    assert (result.errors, hq.open_apply_errors()) == (0, {})
    assert backend.rows("customer", "id, name", "WHERE id = 2") == [(2, "c2")]
    assert backend.rows("line", "order_id, line_no, sku") == [(1, 1, "sku-1"), (3, 1, "sku-3")]
    # Published again, the table takes a remote's rows again.
    hq.add_article("sales", "customer", subscribe_by="region")
    result = hq.apply("north1", [Transaction(end + 1, "north1", (
        Operation.update("customer", (2,), {"name": "c2"}, {"name": "again"}),))], log_received=end + 1)
    assert result.errors == 0 and backend.rows("customer", "id, name", "WHERE id = 2") == [(2, "again")]


def test_a_remote_that_had_not_read_a_rename_before_the_removal_applies_it_then_the_removal(
        backend, hq, tmp_path: Path):
    """The rename, logged before the removal and read after it, is read
    with the article as it was then (the removed article holds for the log
    transactions before its removal): the remote renames its table, then
    removes it.  The removal names every name the table had as well
    (change_rows.drop_change); a remote ignores a name it has no article of."""
    path = hq.extract("north1", tmp_path / "north1.db").path
    start = hq.scan()
    hq.apply_schema(["ALTER TABLE line RENAME TO order_line"])
    assert hq.remove_article("order_line") == ("north1",)
    end = hq.scan()
    rename, removal = changes(hq, "north1", start, end)
    assert [step[:3] for step in rename.steps] == [("rename_table", "line", "order_line")]
    assert sorted(removal.steps) == [("drop_article", "line", "catalog"), ("drop_article", "line", "sales"),
                                     ("drop_article", "order_line", "catalog"), ("drop_article", "order_line", "sales")]
    with SiteDatabase.open(path) as north1:
        deliver(hq, north1, end)
        assert articles(north1) == [("sales", "customer")]
        assert north1.connection.execute("SELECT order_id, line_no, sku FROM order_line").fetchall() == \
            backend.rows("order_line", "order_id, line_no, sku")
        north1.connection.execute("UPDATE order_line SET qty = 4")
        assert sent_tables(north1) == set()


def test_a_dropped_follow_chain_is_removed_at_the_remote_children_first(backend, tmp_path: Path):
    """A remote removes an article only once none follows it (as the
    command does): the change lists the chain's children before their
    parents."""
    site = backend.site
    backend.app().run("CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer REFERENCES customer (id))",
                      "CREATE TABLE item (id integer PRIMARY KEY, order_id integer REFERENCES orders (id))",
                      "INSERT INTO customer (id, name, region) VALUES (1, 'c1', 'north')",
                      "INSERT INTO orders VALUES (1, 1)", "INSERT INTO item VALUES (1, 1)")
    site.create_publication("chain", [Article("customer", subscribe_by="region"),
                                      Article("orders", follows="customer"), Article("item", follows="orders")])
    site.add_remote("north1", address="inbox/north1")
    site.subscribe("north1", "chain", "north")
    path = site.extract("north1", tmp_path / "north1.db").path
    start = site.scan()
    assert site.drop_publication("chain") == ("north1",)
    end = site.scan()
    assert changes(site, "north1", start, end) == [SchemaChange(
        (("drop_article", "item", "chain"), ("drop_article", "orders", "chain"), ("drop_article", "customer", "chain")),
        ())]
    with SiteDatabase.open(path) as north1:
        deliver(site, north1, end)
        assert articles(north1) == []
        assert north1.connection.execute("SELECT count(*) FROM item").fetchone() == (1,)
