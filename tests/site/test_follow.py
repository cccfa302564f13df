"""Rows that follow their parent at the site level (agent/site/sqlite/route.py):
routes through composite keys and chains, NULL foreign keys, table
changes, rows written by hand, and the layout that records follows."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from agent.site import Article, SiteDatabase
from agent.site.capture import KIND_UPDATE
from agent.site.sqlite.capture import ShapeCache, _moves_out_of_date, write_capture_row
from agent.site.sqlite.schema import SCHEMA_VERSION
from codec.ops import OpKind

from .conftest import app_connection, make_site

SHOPS = "CREATE TABLE shop (id INTEGER PRIMARY KEY, region TEXT)"
ORDERS = ("CREATE TABLE orders (id INTEGER, shop INTEGER REFERENCES shop (id), note TEXT,"
          " PRIMARY KEY (id, shop))")
LINES = ("CREATE TABLE line (id INTEGER PRIMARY KEY, order_id INTEGER, order_shop INTEGER, qty INTEGER,"
         " FOREIGN KEY (order_id, order_shop) REFERENCES orders (id, shop))")


def world(tmp_path) -> SiteDatabase:
    hq = make_site(tmp_path, "hq", "consolidated", SHOPS, ORDERS, LINES)
    hq.create_publication("sales", [Article("shop", subscribe_by="region"), Article("orders", follows="shop"),
                                    Article("line", follows="orders", follow_columns=("order_id", "order_shop"))])
    for name, region in (("north", "n"), ("south", "s")):
        hq.add_remote(name)
        hq.subscribe(name, "sales", region)
    return hq


def keys(hq: SiteDatabase, remote: str, after: int) -> list[tuple]:
    return [(op.table, op.kind, op.key) for transaction in hq.read_log(remote, after) for op in transaction.ops]


def test_a_composite_key_chain_routes_each_row_and_a_null_key_goes_nowhere(tmp_path):
    hq = world(tmp_path)
    start = hq.scan()
    app = app_connection(hq)
    app.execute("INSERT INTO shop VALUES (1, 'n'), (2, 's')")
    app.execute("INSERT INTO orders VALUES (10, 1, 'a'), (10, 2, 'b'), (11, NULL, 'nowhere')")
    app.execute("INSERT INTO line VALUES (100, 10, 1, 1), (101, 10, 2, 2), (102, NULL, NULL, 3)")
    hq.scan()
    assert keys(hq, "north", start) == [("shop", OpKind.INSERT, (1,)), ("orders", OpKind.INSERT, (10, 1)),
                                        ("line", OpKind.INSERT, (100,))]
    assert keys(hq, "south", start) == [("shop", OpKind.INSERT, (2,)), ("orders", OpKind.INSERT, (10, 2)),
                                        ("line", OpKind.INSERT, (101,))]
    # A shop that changes region takes its orders and their lines, in the same transaction.
    end = hq.scan()
    app.execute("UPDATE shop SET region = 's' WHERE id = 1")
    hq.scan()
    moved = [transaction for transaction in hq.read_log("north", end)]
    assert len(moved) == 1 and {(op.table, op.kind) for op in moved[0].ops} == {
        ("shop", OpKind.DELETE), ("orders", OpKind.DELETE), ("line", OpKind.DELETE)}
    assert sorted((op.table, op.key) for op in next(hq.read_log("south", end)).ops) == [
        ("line", (100,)), ("orders", (10, 1)), ("shop", (1,))]
    hq.close()


def test_a_changed_child_table_keeps_its_moves(tmp_path):
    hq = world(tmp_path)
    app = app_connection(hq)
    app.execute("INSERT INTO shop VALUES (1, 'n')")
    app.execute("INSERT INTO orders VALUES (10, 1, 'a')")
    app.execute("INSERT INTO line VALUES (100, 10, 1, 1)")
    app.execute("ALTER TABLE line ADD COLUMN price REAL")
    end = hq.scan()  # capture of line is made again, with a new shape: the shop's move trigger names it
    app.execute("UPDATE shop SET region = 's' WHERE id = 1")
    hq.scan()
    assert [(op.table, op.key) for op in next(hq.read_log("south", end)).ops if op.table == "line"] == [("line", (100,))]
    hq.close()


def test_a_dropped_child_table_leaves_the_moves_of_the_tables_above_it(tmp_path):
    """An application drops a table that follows its parent (line): an
    UPDATE of a table above it fails until the next scan (SQLite looks a
    trigger's tables up as it prepares a statement that fires it), which
    makes the move triggers again without it; then a shop's move takes its
    orders along, and the dropped table is reported missing."""
    hq = world(tmp_path)
    app = app_connection(hq)
    app.execute("INSERT INTO shop VALUES (1, 'n')")
    app.execute("INSERT INTO orders VALUES (10, 1, 'a')")
    app.execute("INSERT INTO line VALUES (100, 10, 1, 1)")
    assert not _moves_out_of_date(hq.connection)  # a scan makes them again only when they are out of date
    app.execute("DROP TABLE line")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        app.execute("UPDATE shop SET region = 's' WHERE id = 1")
    end = hq.scan()
    app.execute("SELECT count(*) FROM shop").fetchall()  # reads the schema the scan changed
    app.execute("UPDATE shop SET region = 's' WHERE id = 1")
    app.execute("UPDATE orders SET note = 'b' WHERE id = 10")
    hq.scan()
    assert keys(hq, "south", end) == [("orders", OpKind.INSERT, (10, 1)), ("shop", OpKind.INSERT, (1,)),
                                      ("orders", OpKind.UPDATE, (10, 1))]
    assert keys(hq, "north", end) == [("orders", OpKind.DELETE, (10, 1)), ("shop", OpKind.DELETE, (1,))]
    assert hq.missing_tables() == ("line",)
    triggers = [sql for (sql,) in hq.connection.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'")]
    assert not [sql for sql in triggers if '"line"' in sql]
    hq.close()


def test_a_dropped_table_in_the_middle_of_a_chain_leaves_no_trigger_naming_it(tmp_path):
    """Dropped in the middle of a chain (orders), a table leaves the moves
    of the table above it, and a scan that makes the move triggers again
    (another table altered) neither names it nor fails on it."""
    hq = world(tmp_path)
    app = app_connection(hq)
    app.execute("INSERT INTO shop VALUES (1, 'n')")
    hq.scan()
    app.execute("DROP TABLE orders")
    app.execute("ALTER TABLE shop ADD COLUMN phone TEXT")
    hq.scan()
    app.execute("SELECT count(*) FROM shop").fetchall()
    app.execute("UPDATE shop SET region = 's', phone = '1' WHERE id = 1")
    end = hq.scan()
    assert end > 0 and hq.missing_tables() == ("orders",)
    moves = [sql for (sql,) in hq.connection.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'"
                                                     " AND name LIKE 'fieldsync_move_%'")]
    assert moves == []
    hq.close()


def test_a_row_written_back_by_hand_carries_its_route(tmp_path):
    hq = world(tmp_path)
    app = app_connection(hq)
    app.execute("INSERT INTO shop VALUES (1, 'n')")
    app.execute("INSERT INTO orders VALUES (10, 1, 'a')")
    end = hq.scan()
    shape = ShapeCache(hq.connection).get(hq.connection.execute(
        "SELECT shape FROM fieldsync_article WHERE table_name = 'orders'").fetchone()[0])
    with hq.connection:
        seq = write_capture_row(hq.connection, shape, KIND_UPDATE, None, [10, 1, "a", 10, 1, "b"])
    width = len(shape.columns)
    routes = hq.connection.execute(f"SELECT v{2 * width}, v{2 * width + 1} FROM fieldsync_capture WHERE seq = ?",
                                   (seq,)).fetchone()
    assert routes == ("n", "n")
    assert end < seq
    hq.close()


def test_a_site_of_layout_9_gains_the_follow_columns_when_opened(tmp_path):
    path = tmp_path / "hq.db"
    SiteDatabase.init(path, name="hq", role="consolidated").close()
    fresh = tmp_path / "fresh.db"
    SiteDatabase.init(fresh, name="hq", role="consolidated").close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for column in ("follows", "follow_columns", "parent_columns", "route_sql"):
            conn.execute(f"ALTER TABLE fieldsync_article DROP COLUMN {column}")
        conn.execute("UPDATE fieldsync_site SET schema_version = 9")
        conn.commit()
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
    with contextlib.closing(sqlite3.connect(path)) as upgraded, contextlib.closing(sqlite3.connect(fresh)) as new:
        assert (upgraded.execute("PRAGMA table_info(fieldsync_article)").fetchall()
                == new.execute("PRAGMA table_info(fieldsync_article)").fetchall())
