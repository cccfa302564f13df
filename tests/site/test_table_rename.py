"""``ALTER TABLE ... RENAME TO`` of a published table (docs/site-database.md,
"Renaming a published table"): the change at the consolidated, what each
subscriber reads of the rows logged under the old name, a remote that
applies it, and rows a remote logged under the old name."""

from __future__ import annotations

import pytest

from agent.site import Article, SiteDatabase
from agent.site.errors import PublicationError, SchemaRefused
from codec.changes import SchemaChange
from codec.ops import change_of

from .conftest import app_connection, make_site, replicate

CUSTOMER = "CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, note TEXT)"
ITEM = "CREATE TABLE item (id INTEGER PRIMARY KEY, label TEXT)"


@pytest.fixture
def pair(tmp_path):
    """customer (every column, SUBSCRIBE BY region) and item published at
    hq; r1 extracted with north; r3 subscribed to another publication."""
    hq = make_site(tmp_path, "hq", "consolidated", CUSTOMER, ITEM)
    app = app_connection(hq)
    app.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)", [(1, "north", "Ana", "a"), (2, "south", "Bo", "b")])
    app.close()
    hq.create_publication("sales", [Article("customer", subscribe_by="region")])
    hq.create_publication("other", [Article("item")])
    hq.add_remote("r1")
    hq.subscribe("r1", "sales", "north")
    hq.add_remote("r3")
    hq.subscribe("r3", "other")
    hq.extract("r1", tmp_path / "r1.db")
    r1 = SiteDatabase.open(tmp_path / "r1.db")
    yield hq, r1
    r1.close()
    hq.close()


def rows(site: SiteDatabase, query: str) -> list[tuple]:
    return site.connection.execute(query).fetchall()


def test_rows_before_the_rename_are_read_under_the_old_name_and_after_it_under_the_new(pair):
    hq, _r1 = pair
    hq.set_conflict_policy("customer", "local")
    start = hq.scan()
    app = app_connection(hq)
    app.execute("UPDATE customer SET note = 'before' WHERE id = 1")
    result = hq.apply_schema(["ALTER TABLE customer RENAME TO client"])
    app.close()
    app = app_connection(hq)
    app.execute("UPDATE client SET note = 'after' WHERE id = 1")
    app.close()
    assert result.published == ("client",) and result.subscribers == ("r1",)
    before, change, after = hq.read_log("r1", start, hq.scan())
    assert [op.table for op in before.ops] == ["customer"] and before.ops[0].after == {"note": "before"}
    assert change_of(change) == SchemaChange((("rename_table", "customer", "client"),),
                                             (("client", ("id", "region", "name", "note"), ("id",)),))
    assert [op.table for op in after.ops] == ["client"] and after.ops[0].after == {"note": "after"}
    assert list(hq.read_log("r3", start)) == []  # it holds neither name
    assert rows(hq, "SELECT table_name FROM fieldsync_article WHERE publication = 'sales'") == [("client",)]
    assert rows(hq, "SELECT table_name, policy FROM fieldsync_conflict_policy") == [("client", "local")]
    assert rows(hq, "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE '%customer%'") == []


def test_an_old_shape_wider_than_the_new_one_is_read_whole(pair):
    """Rows logged before a rename and a drop are read as wide as their
    shape, though the table's shape of now is narrower."""
    hq, _r1 = pair
    start = hq.scan()
    app = app_connection(hq)
    app.execute("INSERT INTO customer VALUES (3, 'north', 'Cy', 'wide')")
    app.close()
    hq.apply_schema(["ALTER TABLE customer RENAME TO client", "ALTER TABLE client DROP COLUMN note"])
    [insert, change] = hq.read_log("r1", start, hq.scan())
    assert insert.ops[0].after == {"id": 3, "region": "north", "name": "Cy", "note": "wide"}
    assert change_of(change) == SchemaChange((("rename_table", "customer", "client"), ("drop_column", "client", "note")),
                                             (("client", ("id", "region", "name"), ("id",)),))


def test_a_remote_applies_the_rename_in_order_and_its_own_old_rows_reach_the_table(pair):
    hq, r1 = pair
    r1.connection.execute("UPDATE customer SET note = 'by r1' WHERE id = 1")  # logged under the old name
    r1.connection.execute("INSERT INTO customer VALUES (5, 'north', 'Eve', 'inserted at r1')")
    app = app_connection(hq)
    app.execute("INSERT INTO customer VALUES (3, 'north', 'Cy', 'before')")
    hq.apply_schema(["ALTER TABLE customer RENAME COLUMN note TO remark", "ALTER TABLE customer RENAME TO client"])
    app.close()
    app = app_connection(hq)
    app.execute("INSERT INTO client VALUES (4, 'north', 'Di', 'after')")
    app.close()
    result = replicate(hq, r1)
    assert result.errors == 0 and r1.apply_errors() == ()
    assert rows(r1, "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('customer', 'client')") == [
        ("client",)]
    assert rows(r1, "SELECT table_name FROM fieldsync_article") == [("client",)]
    assert rows(r1, "SELECT id, remark FROM client ORDER BY id") == [
        (1, "by r1"), (3, "before"), (4, "after"), (5, "inserted at r1")]
    result = replicate(r1, hq)  # its changes logged under customer.note, sent after the rename
    assert result.errors == 0 and hq.apply_errors() == ()
    assert rows(hq, "SELECT id, remark FROM client WHERE id IN (1, 5) ORDER BY id") == [
        (1, "by r1"), (5, "inserted at r1")]
    r1.connection.execute("UPDATE client SET remark = 'r1, after' WHERE id = 4")  # it writes under the new name
    replicate(r1, hq)
    assert rows(hq, "SELECT remark FROM client WHERE id = 4") == [("r1, after",)]
    replicate(hq, r1)
    assert rows(r1, "SELECT * FROM client ORDER BY id") == rows(
        hq, "SELECT * FROM client WHERE region = 'north' ORDER BY id")


def test_a_rename_and_a_rename_back_are_followed_through_every_name(pair):
    hq, r1 = pair
    r1.connection.execute("UPDATE customer SET name = 'Ana R' WHERE id = 1")
    hq.apply_schema(["ALTER TABLE customer RENAME TO client"])
    hq.apply_schema(["ALTER TABLE client RENAME TO account"])
    replicate(hq, r1)
    assert replicate(r1, hq).errors == 0
    assert rows(hq, "SELECT name FROM account WHERE id = 1") == [("Ana R",)]
    assert rows(r1, "SELECT name FROM account WHERE id = 1") == [("Ana R",)]


@pytest.mark.parametrize("statements, problem", [
    (["ALTER TABLE customer RENAME TO client", "ALTER TABLE client RENAME TO customer"],
     "customer was the name of a published table"),
    (["ALTER TABLE customer RENAME TO client", "CREATE TABLE customer (id INTEGER PRIMARY KEY)"],
     "customer was the name of a published table"),
    (["ALTER TABLE customer RENAME TO fieldsync_client"], "fieldsync's and SQLite's own table names: refused"),
])
def test_a_refused_rename_is_one_line_and_changes_nothing(pair, statements, problem):
    hq, _r1 = pair
    before, end = rows(hq, "SELECT type, name, sql FROM sqlite_master ORDER BY name"), hq.scan()
    with pytest.raises(SchemaRefused, match=problem) as refused:
        hq.apply_schema(statements)
    assert "\n" not in str(refused.value)
    assert rows(hq, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == before and hq.log_end() == end
    assert rows(hq, "SELECT table_name FROM fieldsync_article ORDER BY 1") == [("customer",), ("item",)]


def test_a_table_of_a_follow_chain_is_not_renamed_yet(pair):
    hq, _r1 = pair
    hq.apply_schema(["CREATE TABLE visit (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer (id))"])
    hq.add_article("sales", "visit", follows="customer")
    for table in ("customer", "visit"):
        with pytest.raises(SchemaRefused, match="follow chain is not supported yet"):
            hq.apply_schema([f"ALTER TABLE {table} RENAME TO {table}2"])
    assert rows(hq, "SELECT table_name FROM fieldsync_article ORDER BY 1") == [("customer",), ("item",), ("visit",)]


@pytest.mark.parametrize("batches", [1, 2])
def test_a_remote_keeps_its_pending_values_logged_under_the_old_name(pair, batches):
    """r1's own change of a row, logged under customer and not yet
    confirmed, is kept against hq's change of the row under client written
    without it (docs/site-database.md, "Concurrent changes"), whether the
    rename comes in the same batch or an earlier one; hq then applies r1's
    change after its own and both end alike."""
    hq, r1 = pair
    r1.connection.execute("UPDATE customer SET name = 'by r1' WHERE id = 1")
    hq.apply_schema(["ALTER TABLE customer RENAME TO client"])
    if batches == 2:
        replicate(hq, r1)
    app = app_connection(hq)
    app.execute("UPDATE client SET name = 'by hq', note = 'hq' WHERE id = 1")
    app.close()
    replicate(hq, r1)
    assert rows(r1, "SELECT name, note FROM client WHERE id = 1") == [("by r1", "hq")]
    replicate(r1, hq)
    replicate(hq, r1)
    assert rows(hq, "SELECT * FROM client WHERE id = 1") == rows(r1, "SELECT * FROM client WHERE id = 1")
    assert rows(hq, "SELECT name, note FROM client WHERE id = 1") == [("by r1", "hq")]


def test_the_unconfirmed_rule_finds_the_consolidated_s_changes_logged_under_the_old_name(pair):
    """hq changed a row under customer, r1 has not confirmed it, then hq
    renamed the table: r1's change of the row, applied to client, sends the
    row back to r1 (docs/site-database.md, "Concurrent changes"), as it
    would with no rename."""
    hq, r1 = pair
    app = app_connection(hq)
    app.execute("UPDATE customer SET note = 'hq' WHERE id = 1")
    app.close()
    hq.scan()
    hq.apply_schema(["ALTER TABLE customer RENAME TO client"])
    r1.connection.execute("UPDATE customer SET name = 'by r1' WHERE id = 1")
    assert replicate(r1, hq).errors == 0
    assert rows(hq, "SELECT count(*) FROM fieldsync_capture WHERE flags & 1") == [(1,)]  # going back to r1
    replicate(hq, r1)
    assert rows(r1, "SELECT * FROM client WHERE id = 1") == rows(hq, "SELECT * FROM client WHERE id = 1") == [
        (1, "north", "by r1", "hq")]


def test_a_table_made_by_hand_under_a_retired_name_is_not_published(pair):
    hq, _r1 = pair
    hq.apply_schema(["ALTER TABLE customer RENAME TO client"])
    app = app_connection(hq)
    app.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT)")  # by hand, outside agent schema apply
    app.close()
    with pytest.raises(PublicationError, match="'customer' was the name of a published table"):
        hq.add_article("sales", "customer")
    assert rows(hq, "SELECT table_name FROM fieldsync_article ORDER BY 1") == [("client",), ("item",)]
