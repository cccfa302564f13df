"""Schema changes at the consolidated (agent/site/sqlite/changes.py, agent/site/sqlite/ddl.py;
docs/site-database.md, "Schema changes"): what ``apply_schema`` takes, logs
and sends to whom, and what it refuses with nothing changed."""

from __future__ import annotations

import sqlite3

import pytest

from agent.site import Article, SiteDatabase
from agent.site.sqlite.ddl import added_definition, differences, read_schema, split_statements
from agent.site.errors import ApplyRefused, SchemaConflict, SchemaRefused, WrongRole
from codec.changes import SchemaChange
from codec.ops import Transaction, change_of
from tests.old_layouts import back_to_layout

from .conftest import LINE, app_connection, make_site, replicate

CUSTOMER = "CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, note TEXT)"
ITEM = "CREATE TABLE item (id INTEGER PRIMARY KEY, label TEXT, secret TEXT)"


@pytest.fixture
def hq(tmp_path):
    """customer (every column, SUBSCRIBE BY region) and item (a column
    subset) published; r1 extracted with north, r2 added but never extracted."""
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER, ITEM, "CREATE INDEX customer_name ON customer (name)")
    app = app_connection(site)
    app.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)", [(1, "north", "Ana", "a"), (2, "south", "Bo", "b")])
    app.execute("INSERT INTO item VALUES (1, 'pump', 'x')")
    app.close()
    site.create_publication("sales", [Article("customer", subscribe_by="region"),
                                      Article("item", columns=["label"])])
    site.create_publication("other", [])
    for name, value in (("r1", "north"), ("r2", "north")):
        site.add_remote(name)
        site.subscribe(name, "sales", value)
    site.add_remote("r3")
    site.subscribe("r3", "other")
    site.extract("r1", tmp_path / "r1.db")
    yield site
    site.close()


def changes_read(site: SiteDatabase, subscriber: str, after: int = 0) -> list[SchemaChange]:
    return [change_of(t) for t in site.read_log(subscriber, after) if change_of(t) is not None]


def schema_of(site: SiteDatabase) -> list[tuple]:
    return site.connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_statements_make_one_change_at_its_own_offset_for_the_remotes_that_hold_the_tables(hq):
    app = app_connection(hq)
    app.execute("UPDATE customer SET name = 'Ana Maria' WHERE id = 1")  # before: logged in the old shape
    app.close()
    result = hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT '-';"
                              " ALTER TABLE customer RENAME COLUMN note TO remark;"
                              " CREATE INDEX customer_phone ON customer (phone); DROP INDEX customer_name",
                              "CREATE TABLE visit (id INTEGER PRIMARY KEY, customer INTEGER, at TEXT)"])
    [offset] = result.offsets
    assert offset == hq.log_end()
    assert result.published == ("customer",) and result.subscribers == ("r1",) and result.statements == 5
    assert [step[0] for step in result.steps] == ["add_column", "rename_column", "create_index", "drop_index",
                                                  "create_table"]
    transactions = list(hq.read_log("r1", 0))
    assert [change_of(t) is not None for t in transactions] == [False, True]  # the UPDATE, then the change
    assert transactions[-1].commit == offset
    assert change_of(transactions[-1]) == SchemaChange(
        (("add_column", "customer", "phone", "phone TEXT DEFAULT '-'"),
         ("rename_column", "customer", "note", "remark"),
         ("create_index", "customer", "customer_phone", "CREATE INDEX customer_phone ON customer (phone)"),
         ("drop_index", "customer", "customer_name")),
        (("customer", ("id", "region", "name", "remark", "phone"), ("id",)),))
    assert changes_read(hq, "r3") == []  # it holds no table the change concerns
    [(steps, made)] = hq.connection.execute("SELECT steps, commit_offset FROM fieldsync_schema_change").fetchall()
    assert made == offset and "visit" in steps


def test_rows_written_after_the_change_are_captured_in_the_new_shape(hq):
    start = hq.scan()
    hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT"])
    app = app_connection(hq)
    app.execute("INSERT INTO customer VALUES (3, 'north', 'Cy', 'c', '555')")
    app.close()
    [_change, insert] = hq.read_log("r1", start, hq.scan())
    assert insert.ops[0].after == {"id": 3, "region": "north", "name": "Cy", "note": "c", "phone": "555"}


def test_a_column_subset_keeps_what_it_does_not_publish(hq):
    """item publishes label only: a column added to it, a rename or a drop
    of an unpublished column and an index on one stay at the consolidated;
    an index on a published column is sent."""
    result = hq.apply_schema(["ALTER TABLE item ADD COLUMN cost REAL",
                              "ALTER TABLE item RENAME COLUMN secret TO hidden",
                              "CREATE INDEX item_cost ON item (cost)", "CREATE INDEX item_label ON item (label)",
                              "ALTER TABLE item DROP COLUMN hidden"])
    assert result.published == ("item",)
    [change] = changes_read(hq, "r1")
    assert change == SchemaChange((("create_index", "item", "item_label", "CREATE INDEX item_label ON item (label)"),),
                                  (("item", ("id", "label"), ("id",)),))


REFUSED = [
    ("DROP TABLE customer", "dropping a published table is refused"),
    ("ALTER TABLE customer DROP COLUMN region", "needed by its article"),
    ("ALTER TABLE customer DROP COLUMN id", "PRIMARY KEY"),
    ("ALTER TABLE item DROP COLUMN label", "needed by its article"),
    ("ALTER TABLE customer RENAME COLUMN region TO area", "not supported yet"),
    ("ALTER TABLE item RENAME COLUMN label TO title", "not supported yet"),
    ("ALTER TABLE customer RENAME TO fieldsync_client", "fieldsync's and SQLite's own table names: refused"),
    ("UPDATE customer SET name = 'x'", "add --unchecked"),
    ("DROP TABLE item2", "add --unchecked"),
    ("PRAGMA user_version = 7", "add --unchecked"),
    ("CREATE VIEW names AS SELECT name FROM customer", "add --unchecked"),
    ("BEGIN", "cannot run inside the change's own transaction"),
    ("COMMIT", "cannot run inside the change's own transaction"),
    ("SAVEPOINT s", "cannot run inside the change's own transaction"),
    ("VACUUM", "cannot VACUUM"),
    ("ALTER TABLE fieldsync_capture ADD COLUMN v99", "fieldsync's and SQLite's own tables"),
    ("DROP INDEX fieldsync_capture_key_1", "fieldsync's and SQLite's own tables"),
    ("ALTER TABLE customer ADD COLUMN nonsense", None),  # the second statement fails: the first is rolled back
]


@pytest.mark.parametrize("statement, problem", REFUSED)
def test_a_refused_statement_is_one_line_and_changes_nothing(hq, statement, problem):
    app = app_connection(hq)
    app.execute("CREATE TABLE item2 (id INTEGER PRIMARY KEY)")
    app.close()
    before, end = schema_of(hq), hq.scan()
    script = statement if problem is not None else statement + "; ALTER TABLE nowhere ADD COLUMN x"
    with pytest.raises(SchemaRefused) as refused:
        hq.apply_schema([script])
    assert "\n" not in str(refused.value)
    assert problem is None or problem in str(refused.value)
    assert schema_of(hq) == before and hq.log_end() == end
    assert hq.connection.execute("SELECT count(*) FROM fieldsync_schema_change").fetchone() == (0,)


def test_a_retired_column_name_is_not_given_again(hq):
    hq.apply_schema(["ALTER TABLE customer RENAME COLUMN note TO remark"])
    with pytest.raises(SchemaRefused, match="customer.note was a column of the published table before"):
        hq.apply_schema(["ALTER TABLE customer ADD COLUMN note TEXT"])
    hq.apply_schema(["ALTER TABLE customer DROP COLUMN remark"])
    with pytest.raises(SchemaRefused, match="customer.remark was a column"):
        hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT",
                         "ALTER TABLE customer RENAME COLUMN phone TO remark"])


def test_unchecked_runs_data_statements_in_order_around_the_change(hq):
    start = hq.scan()
    result = hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT; UPDATE customer SET phone = '1';"
                              " ALTER TABLE customer ADD COLUMN fax TEXT"], unchecked=True)
    assert len(result.offsets) == 2
    kinds = [("change" if change_of(t) else "data", t.commit) for t in hq.read_log("r1", start)]
    first, data, second = kinds
    assert (first[0], data[0], second[0]) == ("change", "data", "change")
    assert first[1] < data[1] < second[1] and (first[1], second[1]) == result.offsets
    [update] = [t for t in hq.read_log("r1", start) if not change_of(t)]
    assert update.ops[0].after == {"phone": "1"}  # captured in the shape of its time


def test_statements_that_change_no_schema_log_nothing(hq):
    end = hq.scan()
    result = hq.apply_schema(["DROP INDEX IF EXISTS nothing_here", "-- a comment only\n;"])
    assert result.offsets == () and hq.log_end() == end


def test_a_change_too_large_for_one_message_is_refused(hq):
    definition = "'" + "x" * 9_000 + "'"
    with pytest.raises(SchemaRefused, match="over the 8192-byte limit"):
        hq.apply_schema([f"ALTER TABLE customer ADD COLUMN big TEXT DEFAULT {definition}"])
    assert "big" not in [row[1] for row in hq.connection.execute("PRAGMA table_info(customer)")]


def test_a_remote_makes_no_schema_change(hq, tmp_path):
    with SiteDatabase.open(tmp_path / "r1.db") as r1, pytest.raises(WrongRole, match="made at the consolidated"):
        r1.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT"])


def test_scripts_are_cut_where_sqlite_says_a_statement_ends():
    assert split_statements("CREATE TABLE a (x TEXT DEFAULT ';');\n-- done; not a statement\n CREATE INDEX i ON a (x)"
                            ";;  /* end */") == ["CREATE TABLE a (x TEXT DEFAULT ';')",
                                                 "-- done; not a statement\n CREATE INDEX i ON a (x)"]


@pytest.mark.parametrize("before, after, definition", [
    ("CREATE TABLE t (id INTEGER PRIMARY KEY, a)", "CREATE TABLE t (id INTEGER PRIMARY KEY, a, b TEXT)", "b TEXT"),
    ("CREATE TABLE t (id, a, PRIMARY KEY (id)) WITHOUT ROWID",
     "CREATE TABLE t (id, a, PRIMARY KEY (id), xa CHECK (xa > 0)) WITHOUT ROWID", "xa CHECK (xa > 0)"),
    ("CREATE TABLE t (id, a, PRIMARY KEY (id)) WITHOUT ROWID",
     "CREATE TABLE t (id, a, b TEXT, PRIMARY KEY (id)) WITHOUT ROWID", "b TEXT"),
    ("CREATE TABLE t (id INTEGER PRIMARY KEY, a)", "CREATE TABLE t (id INTEGER PRIMARY KEY, b)", None),
])
def test_the_added_column_definition_is_what_sqlite_inserted(before, after, definition):
    assert added_definition(before, after) == definition


def test_a_column_added_to_a_without_rowid_table_is_an_added_column():
    """SQLite writes the new column of a table with a table constraint (a
    WITHOUT ROWID table's PRIMARY KEY) before the constraint; it was taken
    for a redefinition, and a published such table refused as re-keyed."""
    conn = sqlite3.connect(":memory:")
    conn.execute(LINE)
    before = read_schema(conn)
    conn.execute("ALTER TABLE line ADD COLUMN note TEXT DEFAULT 'none'")
    assert differences(before, read_schema(conn)) == [("add_column", "line", "note", "note TEXT DEFAULT 'none'")]


def test_a_site_of_layout_10_gains_the_record_of_schema_changes_when_opened(tmp_path):
    path = tmp_path / "hq.db"
    SiteDatabase.init(path, name="hq", role="consolidated").close()
    back_to_layout(path, 10, "DROP TABLE fieldsync_schema_change",
                   "ALTER TABLE fieldsync_remote DROP COLUMN peer_schema_version")
    with SiteDatabase.open(path) as site:
        site.connection.execute(CUSTOMER)
        assert site.schema_version() is None
        assert site.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT"]).offsets == (1,)
        assert site.schema_version() == 1


# -- at a remote, in order with the data ---------------------------------------------------------------------


@pytest.fixture
def pair(hq, tmp_path):
    remote = SiteDatabase.open(tmp_path / "r1.db")
    yield hq, remote
    remote.close()


def rows(site: SiteDatabase, query: str = "SELECT * FROM customer ORDER BY id") -> list[tuple]:
    return site.connection.execute(query).fetchall()


def columns_of(site: SiteDatabase, table: str = "customer") -> list[str]:
    return [row[1] for row in site.connection.execute(f"PRAGMA table_info({table})")]


def test_a_remote_offline_through_several_changes_applies_each_in_order_with_the_data(pair):
    hq, r1 = pair
    app = app_connection(hq)
    app.execute("INSERT INTO customer VALUES (3, 'north', 'Cy', 'old shape')")
    hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT '-'"])
    app.execute("UPDATE customer SET phone = '555' WHERE id = 3")
    hq.apply_schema(["ALTER TABLE customer RENAME COLUMN note TO remark"])
    app.execute("UPDATE customer SET remark = 'renamed' WHERE id = 1")
    hq.apply_schema(["ALTER TABLE customer DROP COLUMN phone; CREATE INDEX customer_remark ON customer (remark)"])
    app.close()
    app = app_connection(hq)  # SQLite compiles a statement against the schema its connection read last
    app.execute("INSERT INTO customer VALUES (4, 'north', 'Di', 'new shape')")
    app.close()
    result = replicate(hq, r1)
    assert result.errors == 0 and r1.apply_errors() == ()
    assert columns_of(r1) == ["id", "region", "name", "remark"]
    assert rows(r1) == [(1, "north", "Ana", "renamed"), (3, "north", "Cy", "old shape"),
                        (4, "north", "Di", "new shape")]
    assert [row[0] for row in rows(r1, "SELECT commit_offset FROM fieldsync_schema_change ORDER BY 1")] == [
        row[0] for row in rows(hq, "SELECT commit_offset FROM fieldsync_schema_change ORDER BY 1")]
    assert "customer_remark" in [row[1] for row in r1.connection.execute("PRAGMA index_list(customer)")]
    # It captures its own changes in the new shape, and the consolidated takes them.
    r1.connection.execute("UPDATE customer SET remark = 'from r1' WHERE id = 4")
    replicate(r1, hq)
    assert rows(hq, "SELECT remark FROM customer WHERE id = 4") == [("from r1",)]


def test_rows_a_remote_changed_in_the_old_shape_are_applied_in_the_new_one(pair):
    hq, r1 = pair
    r1.connection.execute("UPDATE customer SET note = 'by r1', name = 'Ana R' WHERE id = 1")
    r1.connection.execute("INSERT INTO customer VALUES (5, 'north', 'Eve', 'inserted at r1')")
    r1.connection.execute("UPDATE customer SET region = region WHERE id = 1")
    hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT 'none'",
                     "ALTER TABLE customer RENAME COLUMN note TO remark", "DROP INDEX customer_name",
                     "ALTER TABLE customer DROP COLUMN name",
                     "ALTER TABLE customer ADD COLUMN name2 TEXT"])
    app = app_connection(hq)
    app.execute("UPDATE customer SET phone = '111' WHERE id = 1")  # hq's own change beside r1's
    app.close()
    result = replicate(r1, hq)  # sent after the change was made at hq, in the shape r1 had
    assert result.errors == 0 and hq.apply_errors() == ()
    assert rows(hq, "SELECT id, remark, phone, name2 FROM customer WHERE id IN (1, 5) ORDER BY id") == [
        (1, "by r1", "111", None), (5, "inserted at r1", "none", None)]
    replicate(hq, r1)
    assert rows(r1, "SELECT id, remark, phone FROM customer WHERE id IN (1, 5) ORDER BY id") == [
        (1, "by r1", "111"), (5, "inserted at r1", "none")]


def test_a_remote_whose_table_was_changed_by_hand_records_the_conflict_and_waits_before_the_change(pair):
    hq, r1 = pair
    app = app_connection(hq)
    app.execute("UPDATE customer SET name = 'before the change' WHERE id = 1")
    hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT"])
    app.execute("UPDATE customer SET phone = '1' WHERE id = 1")
    app.close()
    r1.connection.execute("ALTER TABLE customer ADD COLUMN phone INTEGER")  # its own, made by hand
    received = r1.remote("hq").log_received
    for _ in range(2):  # each poll tries the message again
        with pytest.raises(SchemaConflict, match="does not apply here: add column customer.phone"):
            replicate(hq, r1)
    assert r1.remote("hq").log_received == received
    assert rows(r1, "SELECT name FROM customer WHERE id = 1") == [("Ana",)]  # the whole message rolled back
    [error] = r1.apply_errors()
    assert error.table == "customer" and "duplicate column name: phone" in error.problem
    r1.connection.execute("ALTER TABLE customer DROP COLUMN phone")  # mended: the stream goes on
    replicate(hq, r1)
    assert rows(r1, "SELECT name, phone FROM customer WHERE id = 1") == [("before the change", "1")]


def test_the_consolidated_takes_no_schema_change_from_a_remote(pair):
    hq, _ = pair
    change = SchemaChange((("drop_index", "customer", "x"),), (("customer", ("id", "region", "name", "note"),
                                                                 ("id",)),))
    with pytest.raises(ApplyRefused, match="a remote makes none"):
        hq.apply("r1", [Transaction(5, "r1", (change,))], log_received=5)


# -- a new table through the stream ---------------------------------------------------------------------------


def test_a_table_published_after_extraction_reaches_the_remotes_with_their_rows(pair, tmp_path):
    hq, r1 = pair
    hq.apply_schema(["CREATE TABLE visit (id INTEGER PRIMARY KEY, region TEXT NOT NULL, at TEXT, cost REAL);"
                     " CREATE INDEX visit_at ON visit (at); CREATE INDEX visit_cost ON visit (cost)"])
    app = app_connection(hq)
    app.executemany("INSERT INTO visit VALUES (?, ?, ?, ?)", [(1, "north", "mon", 1.5), (2, "south", "tue", 2.0),
                                                              (3, "north", "wed", None)])
    app.close()
    hq.add_article("sales", "visit", columns=["region", "at"], subscribe_by="region")
    app = app_connection(hq)
    app.execute("INSERT INTO visit VALUES (4, 'north', 'thu', 9.0)")
    app.close()
    replicate(hq, r1)
    assert r1.apply_errors() == ()
    assert columns_of(r1, "visit") == ["id", "region", "at"]
    assert rows(r1, "SELECT * FROM visit ORDER BY id") == [(1, "north", "mon"), (3, "north", "wed"),
                                                           (4, "north", "thu")]
    assert [row[1] for row in r1.connection.execute("PRAGMA index_list(visit)")] == ["visit_at"]
    # r1 captures its own changes to it, and hq takes them.
    r1.connection.execute("INSERT INTO visit VALUES (5, 'north', 'fri')")
    replicate(r1, hq)
    assert rows(hq, "SELECT * FROM visit WHERE id = 5") == [(5, "north", "fri", None)]


def test_a_new_table_goes_nowhere_when_no_extracted_remote_subscribes(hq):
    end = hq.scan()
    hq.apply_schema(["CREATE TABLE visit (id INTEGER PRIMARY KEY, at TEXT)"])
    hq.add_article("other", "visit")  # r3 subscribes to it, but was never extracted
    assert hq.log_end() == end + 1  # the CREATE TABLE's own entry, no more


def test_a_remote_that_holds_the_table_already_keeps_it(pair):
    hq, r1 = pair
    for site in (hq, r1):
        site.connection.execute("CREATE TABLE tag (id INTEGER PRIMARY KEY, label TEXT)")
    hq.connection.execute("INSERT INTO tag VALUES (1, 'red')")
    hq.add_article("sales", "tag")
    replicate(hq, r1)
    assert rows(r1, "SELECT * FROM tag") == [(1, "red")] and r1.apply_errors() == ()


def test_a_new_table_that_follows_its_parent_reaches_the_subscribers_of_the_parents(pair):
    hq, r1 = pair
    hq.apply_schema(["CREATE TABLE visit (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer (id),"
                     " at TEXT)"])
    app = app_connection(hq)
    app.executemany("INSERT INTO visit VALUES (?, ?, ?)", [(1, 1, "mon"), (2, 2, "tue"), (3, None, "wed")])
    app.close()
    hq.add_article("sales", "visit", follows="customer")
    replicate(hq, r1)
    assert rows(r1, "SELECT * FROM visit") == [(1, 1, "mon")]  # customer 1 is north, 2 south, 3 has none
