"""Schema changes at the consolidated (agent/site/changes.py, agent/site/ddl.py;
docs/site-database.md, "Schema changes"): what ``apply_schema`` takes, logs
and sends to whom, and what it refuses with nothing changed."""

from __future__ import annotations

import pytest

from agent.site import Article, SiteDatabase
from agent.site.ddl import added_definition, split_statements
from agent.site.errors import SchemaRefused, WrongRole
from codec.changes import SchemaChange
from codec.ops import change_of
from tests.old_layouts import back_to_layout

from .conftest import app_connection, make_site

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
    result = hq.apply_schema(["ALTER TABLE item ADD COLUMN cost REAL", "ALTER TABLE item RENAME COLUMN secret TO hidden",
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
    ("ALTER TABLE customer RENAME TO client", "renaming a published table is not supported yet"),
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
        hq.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT; ALTER TABLE customer RENAME COLUMN phone TO remark"])


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
    ("CREATE TABLE t (id INTEGER PRIMARY KEY, a)", "CREATE TABLE t (id INTEGER PRIMARY KEY, b)", None),
])
def test_the_added_column_definition_is_what_sqlite_inserted(before, after, definition):
    assert added_definition(before, after) == definition


def test_a_site_of_layout_10_gains_the_record_of_schema_changes_when_opened(tmp_path):
    path = tmp_path / "hq.db"
    SiteDatabase.init(path, name="hq", role="consolidated").close()
    back_to_layout(path, 10, "DROP TABLE fieldsync_schema_change")
    with SiteDatabase.open(path) as site:
        site.connection.execute(CUSTOMER)
        assert site.apply_schema(["ALTER TABLE customer ADD COLUMN phone TEXT"]).offsets == (1,)
