"""A table in several publications (agent/site/union.py, the catalogue,
extraction and subscription changes of agent/site/sqlite/), on real SQLite
files: docs/site-database.md, "A table in several publications"."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from agent.site import Article, PublicationError, SiteDatabase
from agent.site.sqlite.schema import SCHEMA_VERSION

from .conftest import app_connection, make_site, replicate, table_rows

CUSTOMER = "CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, region TEXT, rep TEXT, price REAL NOT NULL)"
ROWS = [(1, "a", "north", "ann", 1.0), (2, "b", "north", "bob", 2.0), (3, "c", "south", "ann", 3.0),
        (4, "d", "south", "bob", 4.0)]


@pytest.fixture
def world(tmp_path):
    """hq with customer in two publications (regions: name and region by
    region; reps: name, rep and price by rep); r1 subscribes to regions
    north and reps ann, r2 to regions south; both extracted."""
    hq = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    app = app_connection(hq)
    app.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?)", ROWS)
    hq.create_publication("regions", [Article("customer", columns=["name", "region"], subscribe_by="region")])
    hq.create_publication("reps", [Article("customer", columns=["name", "rep", "price"], subscribe_by="rep")])
    remotes = {}
    for name, subscriptions in {"r1": [("regions", "north"), ("reps", "ann")], "r2": [("regions", "south")]}.items():
        hq.add_remote(name)
        for publication, value in subscriptions:
            hq.subscribe(name, publication, value)
        hq.extract(name, tmp_path / f"{name}.db")
        remotes[name] = SiteDatabase.open(tmp_path / f"{name}.db")
    yield hq, remotes["r1"], remotes["r2"]
    for site in (hq, *remotes.values()):
        site.close()


def test_extraction_copies_each_row_once_with_the_columns_of_the_articles_that_keep_it(world):
    hq, r1, r2 = world
    # r1's table has every column either article publishes; price, which
    # rows kept by regions alone lack, is not NOT NULL there.
    assert [(row[1], row[3]) for row in r1.connection.execute("PRAGMA table_info(customer)")] == [
        ("id", 0), ("name", 0), ("region", 0), ("rep", 0), ("price", 0)]
    assert table_rows(r1, "customer") == [(1, "a", "north", "ann", 1.0), (2, "b", "north", None, None),
                                          (3, "c", None, "ann", 3.0)]
    assert table_rows(r2, "customer") == [(3, "c", "south"), (4, "d", "south")]
    assert [publication.name for publication in r1.publications()] == ["regions", "reps"]


def test_changes_at_hq_and_at_a_remote_reach_each_subscriber_once(world):
    hq, r1, r2 = world
    app = app_connection(hq)
    app.execute("UPDATE customer SET region = 'south' WHERE id = 1")  # leaves regions for r1; reps keeps it
    app.execute("UPDATE customer SET rep = 'ann' WHERE id = 2")  # enters reps for r1; regions kept it
    app.execute("UPDATE customer SET name = 'cc', price = 30 WHERE id = 3")
    app.execute("INSERT INTO customer VALUES (5, 'e', 'north', 'ann', 5.0)")
    for remote in (r1, r2):
        replicate(hq, remote)
    assert table_rows(r1, "customer") == [(1, "a", None, "ann", 1.0), (2, "b", "north", "ann", 2.0),
                                          (3, "cc", None, "ann", 30.0), (5, "e", "north", "ann", 5.0)]
    assert table_rows(r2, "customer") == [(1, "a", "south"), (3, "cc", "south"), (4, "d", "south")]
    # A row r1 writes reaches r2, which gets it through regions.
    app_connection(r1).execute("UPDATE customer SET name = 'A1' WHERE id = 1")
    replicate(r1, hq)
    for remote in (r2, r1):
        replicate(hq, remote)
    assert table_rows(hq, "customer", "WHERE id = 1") == [(1, "A1", "south", "ann", 1.0)]
    assert table_rows(r2, "customer", "WHERE id = 1") == [(1, "A1", "south")]
    assert table_rows(r1, "customer", "WHERE id = 1") == [(1, "A1", None, "ann", 1.0)]
    for site in (hq, r1, r2):
        assert site.connection.execute("SELECT count(*) FROM fieldsync_apply_error").fetchone()[0] == 0


def test_a_row_a_remote_takes_out_of_one_subset_stays_while_another_keeps_it(world):
    hq, r1, r2 = world
    remote = app_connection(r1)
    remote.execute("UPDATE customer SET region = 'south' WHERE id = 1")  # leaves regions; reps keeps it
    remote.execute("UPDATE customer SET rep = 'carl' WHERE id = 2")  # regions keeps it
    remote.execute("UPDATE customer SET rep = 'bob' WHERE id = 3")  # south and bob: none of r1's keeps it
    replicate(r1, hq)
    for site in (r2, r1):
        replicate(hq, site)
    assert table_rows(hq, "customer", "WHERE id <= 3") == [
        (1, "a", "south", "ann", 1.0), (2, "b", "north", "carl", 2.0), (3, "c", "south", "bob", 3.0)]
    assert [row[0] for row in table_rows(r1, "customer")] == [1, 2]  # row 3 went back as a DELETE
    assert table_rows(r2, "customer") == [(1, "a", "south"), (3, "c", "south"), (4, "d", "south")]


def test_leaving_one_publication_removes_only_the_rows_no_other_subscription_keeps(world):
    hq, r1, _ = world
    ended = hq.unsubscribe("r1", "reps", "ann")
    assert (ended.deletes, ended.inserts) == (1, 0)  # row 3; row 1 stays through regions
    replicate(hq, r1)
    # The rows that stay lose the columns reps published to them.
    assert table_rows(r1, "customer") == [(1, "a", "north", None, None), (2, "b", "north", None, None)]
    added = hq.subscribe("r1", "reps", "bob")
    assert (added.deletes, added.inserts) == (0, 1)  # row 4; row 2 gains its columns
    replicate(hq, r1)
    assert table_rows(r1, "customer") == [(1, "a", "north", None, None), (2, "b", "north", "bob", 2.0),
                                          (4, "d", None, "bob", 4.0)]


def test_a_table_follows_a_parent_in_one_publication_and_is_published_plainly_in_another(tmp_path):
    hq = make_site(tmp_path, "hq", "consolidated", "CREATE TABLE shop (id INTEGER PRIMARY KEY, region TEXT)",
                   "CREATE TABLE orders (id INTEGER PRIMARY KEY, shop INTEGER REFERENCES shop (id), note TEXT)")
    app = app_connection(hq)
    app.execute("INSERT INTO shop VALUES (1, 'n'), (2, 's')")
    app.execute("INSERT INTO orders VALUES (10, 1, 'x'), (20, 2, 'y')")
    hq.create_publication("sales", [Article("shop", subscribe_by="region"), Article("orders", follows="shop")])
    hq.create_publication("notes", [Article("orders", columns=["note"])])  # every order's note
    with pytest.raises(PublicationError, match="follows its parent in 'sales' already"):
        hq.create_publication("other", [Article("shop"), Article("orders", follows="shop")])
    hq.add_remote("north")
    hq.subscribe("north", "sales", "n")
    hq.subscribe("north", "notes")
    hq.extract("north", tmp_path / "north.db")
    north = SiteDatabase.open(tmp_path / "north.db")
    assert table_rows(north, "orders") == [(10, 1, "x"), (20, None, "y")]
    # The shop moves away: its order stays through notes, without its shop.
    app.execute("UPDATE shop SET region = 's' WHERE id = 1")
    app.execute("UPDATE orders SET note = 'z' WHERE id = 20")
    replicate(hq, north)
    assert table_rows(north, "shop") == []
    assert table_rows(north, "orders") == [(10, None, "x"), (20, None, "z")]
    assert north.connection.execute("SELECT count(*) FROM fieldsync_apply_error").fetchone()[0] == 0
    # Without its follow, orders is captured with no route: its parent may go.
    hq.remove_article("orders", "sales")
    hq.drop_publication("sales")
    app.execute("DROP TABLE shop")
    app.execute("UPDATE orders SET note = 'w' WHERE id = 10")
    replicate(hq, north)
    assert table_rows(north, "orders") == [(10, None, "w"), (20, None, "z")]
    hq.close()
    north.close()


def test_removing_one_article_keeps_the_table_captured_for_the_other(world):
    hq, r1, _ = world
    hq.remove_article("customer", "reps")
    assert [(p.name, [a.table for a in p.articles]) for p in hq.publications()] == [
        ("regions", ["customer"]), ("reps", [])]
    app = app_connection(hq)
    app.execute("UPDATE customer SET name = 'a2' WHERE id = 1")
    replicate(hq, r1)
    assert table_rows(r1, "customer", "WHERE id = 1") == [(1, "a2", "north", "ann", 1.0)]


def test_a_site_of_layout_12_keys_its_articles_by_publication_when_opened(tmp_path):
    hq = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    hq.create_publication("regions", [Article("customer", columns=["name", "region"], subscribe_by="region")])
    fresh = hq.connection.execute("SELECT sql FROM sqlite_master WHERE name = 'fieldsync_article'").fetchone()[0]
    hq.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "hq.db")) as conn:  # layout 12: one article a table
        conn.execute("ALTER TABLE fieldsync_article RENAME TO newer")
        conn.execute(fresh.replace("table_name   TEXT NOT NULL COLLATE NOCASE", "table_name   TEXT PRIMARY KEY"
                                   " COLLATE NOCASE").replace(",\n    PRIMARY KEY (table_name, publication)", ""))
        conn.execute("INSERT INTO fieldsync_article SELECT * FROM newer")
        conn.execute("DROP TABLE newer")
        conn.execute("UPDATE fieldsync_site SET schema_version = 12")
        conn.commit()
    with SiteDatabase.open(tmp_path / "hq.db") as site:
        assert site.connection.execute("SELECT sql FROM sqlite_master WHERE name = 'fieldsync_article'"
                                       ).fetchone()[0] == fresh
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
        site.create_publication("reps", [Article("customer", subscribe_by="rep")])
        assert [(p.name, p.articles) for p in site.publications()] == [
            ("regions", (Article("customer", ("id", "name", "region"), "region"),)),
            ("reps", (Article("customer", None, "rep"),))]


def test_a_table_added_to_a_second_publication_reaches_its_subscribers_alone(tmp_path):
    hq = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    app_connection(hq).executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?)", ROWS)
    hq.create_publication("regions", [Article("customer", columns=["name", "region"], subscribe_by="region")])
    hq.create_publication("reps")
    remotes = {}
    for name, (publication, value) in {"r1": ("regions", "north"), "r3": ("reps", "ann")}.items():
        hq.add_remote(name)
        hq.subscribe(name, publication, value)
        hq.extract(name, tmp_path / f"{name}.db")
        remotes[name] = SiteDatabase.open(tmp_path / f"{name}.db")
    start = hq.remote("r1").log_sent
    hq.add_article("reps", "customer", columns=["price"], subscribe_by="rep")
    # r1 holds the table: it gets the change that creates it (and keeps its
    # copy), not its rows again.
    assert [type(op).__name__ for transaction in hq.read_log("r1", start) for op in transaction.ops] == [
        "SchemaChange"]
    for remote in remotes.values():
        replicate(hq, remote)
    assert table_rows(remotes["r3"], "customer") == [(1, 1.0), (3, 3.0)]
    assert table_rows(remotes["r1"], "customer") == [(1, "a", "north"), (2, "b", "north")]
    # A remote of the second publication that gets the table through the first already is refused.
    hq.subscribe("r1", "reps", "bob")
    hq.create_publication("more")
    hq.subscribe("r1", "more")
    with pytest.raises(PublicationError, match="'r1' subscribes to 'more' and gets 'customer' through"):
        hq.add_article("more", "customer")
    for site in (hq, *remotes.values()):
        site.close()
