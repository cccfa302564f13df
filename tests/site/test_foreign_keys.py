"""The foreign keys a remote's copy keeps (agent/site/sqlite/foreign_keys.py, and
the choice in agent/site/sqlite/extract.py): read from the table's definition as
SQLite reads it, kept when the remote gets their columns, their parent
and the parent's key, always checked at once there."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent.site import Article, SiteDatabase
from agent.site.sqlite.foreign_keys import foreign_keys, remote_definition

from .conftest import make_site

AWKWARD = ('CREATE TABLE "odd(name" ("a,b" INTEGER CONSTRAINT up REFERENCES [p q] ON DELETE SET NULL ON UPDATE'
           " CASCADE DEFERRABLE INITIALLY DEFERRED, note TEXT DEFAULT 'REFERENCES x', -- REFERENCES y\n"
           ' c /* REFERENCES z */ REFERENCES "p" MATCH simple, CHECK (c > 0), CONSTRAINT k FOREIGN KEY'
           ' (c COLLATE nocase, "a,b") REFERENCES z (x, y) NOT DEFERRABLE, PRIMARY KEY ("a,b")) WITHOUT ROWID')


def test_the_clauses_are_read_as_sqlite_reads_the_statement() -> None:
    keys = foreign_keys(AWKWARD)
    assert [(key.columns, key.parent, key.parent_columns, key.clause) for key in keys] == [
        (("a,b",), "p q", None, "REFERENCES [p q] ON DELETE SET NULL ON UPDATE CASCADE"),
        (("c",), "p", None, 'REFERENCES "p" MATCH simple'),
        (("c", "a,b"), "z", ("x", "y"), "REFERENCES z (x, y)")]
    assert [AWKWARD[slice(*key.span)] for key in keys] == [
        "CONSTRAINT up REFERENCES [p q] ON DELETE SET NULL ON UPDATE CASCADE DEFERRABLE INITIALLY DEFERRED",
        'REFERENCES "p" MATCH simple',
        ', CONSTRAINT k FOREIGN KEY (c COLLATE nocase, "a,b") REFERENCES z (x, y) NOT DEFERRABLE']


def test_a_kept_clause_loses_its_deferral_and_a_dropped_one_goes_whole() -> None:
    kept = remote_definition(AWKWARD, lambda key: key.parent != "z")
    assert kept == ('CREATE TABLE "odd(name" ("a,b" INTEGER CONSTRAINT up REFERENCES [p q] ON DELETE SET NULL ON UPDATE'
                    " CASCADE, note TEXT DEFAULT 'REFERENCES x', -- REFERENCES y\n"
                    ' c /* REFERENCES z */ REFERENCES "p" MATCH simple, CHECK (c > 0), PRIMARY KEY ("a,b"))'
                    " WITHOUT ROWID")
    bare = remote_definition(AWKWARD, lambda key: False)
    assert foreign_keys(bare) == []
    conn = sqlite3.connect(":memory:")
    for statement in (kept, bare):  # both are still statements SQLite takes
        conn.execute(statement)
        conn.execute('DROP TABLE "odd(name"')


SCHEMA = (
    "CREATE TABLE region (id INTEGER PRIMARY KEY, name TEXT)",
    "CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, region_id INTEGER REFERENCES region (id),"
    " email TEXT UNIQUE, code TEXT, rep INTEGER)",
    "CREATE UNIQUE INDEX customer_code ON customer (code)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer (id) ON DELETE CASCADE"
    " DEFERRABLE INITIALLY DEFERRED, by_email TEXT REFERENCES customer (email), by_code TEXT REFERENCES customer"
    " (code), product TEXT REFERENCES product (code), note TEXT)",
    "CREATE TABLE product (code TEXT PRIMARY KEY, label TEXT)",
    "CREATE TABLE line (id INTEGER PRIMARY KEY, order_id INTEGER, customer_id INTEGER, qty INTEGER, secret TEXT,"
    " FOREIGN KEY (order_id) REFERENCES orders ON UPDATE CASCADE, FOREIGN KEY (customer_id) REFERENCES customer)",
)


def remote_keys(remote: SiteDatabase, table: str) -> list[tuple]:
    return sorted((row[2], row[3], row[4], row[5], row[6]) for row in remote.connection.execute(
        f"PRAGMA foreign_key_list({table})"))


@pytest.fixture
def remote(tmp_path: Path):
    hq = make_site(tmp_path, "hq", "consolidated", *SCHEMA)
    hq.connection.execute("INSERT INTO customer VALUES (1, 'one', NULL, 'one@x', 'C1', 1)")
    hq.connection.execute("INSERT INTO orders VALUES (10, 1, 'one@x', 'C1', NULL, 'n')")
    hq.create_publication("sales", [Article("customer", columns=["name", "code", "rep"], subscribe_by="rep"),
                                    Article("orders", follows="customer", follow_columns=["customer_id"]),
                                    Article("line", columns=["order_id", "qty"])])
    hq.add_remote("r1")
    hq.subscribe("r1", "sales", 1)
    hq.extract("r1", tmp_path / "r1.db")
    site = SiteDatabase.open(tmp_path / "r1.db")
    yield site
    site.close()
    hq.close()


def test_a_remote_keeps_the_foreign_keys_it_can_check(remote: SiteDatabase) -> None:
    # customer: region is not published.  orders: customer is, with id and code (a unique
    # index the copy gets); email's UNIQUE constraint is not carried by the column subset,
    # product is not published.  line: a subset with order_id but not customer_id.
    assert remote_keys(remote, "customer") == []
    assert remote_keys(remote, "orders") == [("customer", "by_code", "code", "NO ACTION", "NO ACTION"),
                                             ("customer", "customer_id", "id", "NO ACTION", "CASCADE")]
    assert remote_keys(remote, "line") == [("orders", "order_id", None, "CASCADE", "NO ACTION")]
    orders_sql = remote.connection.execute("SELECT sql FROM sqlite_master WHERE name = 'orders'").fetchone()[0]
    assert "DEFERRABLE" not in orders_sql.upper()
    assert remote.connection.execute("PRAGMA foreign_key_check").fetchall() == []


def test_a_remote_application_with_foreign_keys_on_is_held_to_them(remote: SiteDatabase) -> None:
    app = sqlite3.connect(remote.path, isolation_level=None)
    app.execute("PRAGMA foreign_keys = ON")
    with pytest.raises(sqlite3.IntegrityError):
        app.execute("INSERT INTO orders (id, customer_id) VALUES (11, 2)")
    app.execute("INSERT INTO line (id, order_id, qty) VALUES (100, 10, 1)")
    with pytest.raises(sqlite3.IntegrityError):
        app.execute("DELETE FROM customer WHERE id = 1")  # its order's line holds the order
    app.execute("DELETE FROM line")
    app.execute("DELETE FROM customer WHERE id = 1")  # ON DELETE CASCADE takes its order
    assert app.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    app.close()
    # and the follow is recorded at the remote, without a route
    assert remote.connection.execute("SELECT follows, follow_columns, route_sql FROM fieldsync_article"
                                     " WHERE table_name = 'orders'").fetchone() == ("customer", '["customer_id"]', None)
