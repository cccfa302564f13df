"""Change capture by triggers (agent.site.sqlite.capture) where a SQLite site is
its own: values and storage classes, generated and wide columns, ALTER
TABLE.  What application writes produce on both backends is
tests/site/both/test_capture_log.py."""

from __future__ import annotations

import math

import pytest

from agent.site import Article, SiteDatabase, UnpublishableTable
from codec.ops import Operation, values_identical

from .conftest import CUSTOMER, LINE, app_connection, make_site, table_rows


def ops_for(site: SiteDatabase, remote: str, after: int = 0) -> list[Operation]:
    end = site.scan()
    return [op for transaction in site.read_log(remote, after, end) for op in transaction.ops]


@pytest.fixture
def site(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER, LINE)
    site.create_publication("all", [Article("customer"), Article("line")])
    site.add_remote("r1")
    site.subscribe("r1", "all")
    yield site
    site.close()


def test_table_without_primary_key_is_refused_with_the_reason(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", "CREATE TABLE notes (title TEXT, body TEXT)")
    with pytest.raises(UnpublishableTable, match="no primary key.*drift apart"):
        site.create_publication("p", ["notes"])
    assert site.publications() == ()  # nothing half-made
    assert site.connection.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 0
    site.close()


@pytest.mark.parametrize("statement, table, reason", [
    ("CREATE VIEW v AS SELECT 1 AS x", "v", "view"),
    (None, "nowhere", "does not exist"),
    (None, "fieldsync_log", "belongs to fieldsync"),
])
def test_other_unpublishable_tables(tmp_path, statement, table, reason):
    site = make_site(tmp_path, "hq", "consolidated", *([statement] if statement else []))
    with pytest.raises(UnpublishableTable, match=reason):
        site.create_publication("p", [table])
    site.close()


EXACT_VALUES = [
    -0.0, 0.0, float("inf"), float("-inf"), 2**63 - 1, -(2**63), 1, 1.0, 1e-310, "", b"", b"\x00\xff\x00",
    "nul\x00inside", "日本語 ✓", None,
]


def test_values_round_trip_exactly_between_sites(tmp_path, site):
    """Capture at one site, read, apply at another: every value comes out
    identical (type, sign of zero, 64-bit range, embedded NULs)."""
    remote = make_site(tmp_path, "r1", "remote", CUSTOMER, LINE)
    remote.add_remote("hq")
    app = app_connection(site)
    big_text = "x" * 1_500_000
    big_blob = bytes(range(256)) * 6000
    app.execute("BEGIN")
    for index, value in enumerate(EXACT_VALUES, start=1):
        # `extra` has no declared type, so SQLite keeps the value as given.
        app.execute("INSERT INTO customer (id, name, extra) VALUES (?, ?, ?)", (index, f"v{index}", value))
    app.execute("INSERT INTO customer (id, name, photo, extra) VALUES (100, ?, ?, ?)", (big_text, big_blob, big_text))
    app.execute("COMMIT")
    transactions = list(site.read_log("r1", 0, site.scan()))
    captured = {op.key[0]: op.after["extra"] for t in transactions for op in t.ops}
    for index, value in enumerate(EXACT_VALUES, start=1):
        assert values_identical(captured[index], value), (index, value, captured[index])
    remote.apply("hq", transactions, log_received=site.log_end())
    for index, value in enumerate(EXACT_VALUES, start=1):
        stored = remote.connection.execute("SELECT extra FROM customer WHERE id = ?", (index,)).fetchone()[0]
        assert values_identical(stored, value), (index, value, stored)
    assert remote.connection.execute("SELECT name, photo, extra FROM customer WHERE id = 100").fetchone() == (
        big_text, big_blob, big_text)
    remote.close()


def test_nan_is_stored_as_null_by_sqlite_and_replicated_as_null(site):
    app = app_connection(site)
    app.execute("INSERT INTO customer (id, balance, extra) VALUES (1, ?, ?)", (math.nan, math.nan))
    (op,) = ops_for(site, "r1")
    assert op.after["balance"] is None and op.after["extra"] is None
    assert table_rows(site, "customer")[0][3] is None


def test_real_affinity_is_the_tables_business(site):
    """A REAL column turns -0.0 into 0.0 and 3 into 3.0 before the trigger
    sees it: capture records what the row holds."""
    app = app_connection(site)
    app.execute("INSERT INTO customer (id, balance) VALUES (1, -0.0)")
    app.execute("INSERT INTO customer (id, balance) VALUES (2, 3)")
    ops = ops_for(site, "r1")
    stored = [row[3] for row in table_rows(site, "customer")]
    assert [op.after["balance"] for op in ops] == stored
    assert all(type(value) is float for value in stored)


def test_generated_columns_are_not_captured(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated",
                     "CREATE TABLE box (id INTEGER PRIMARY KEY, w REAL, h REAL, area REAL GENERATED ALWAYS AS (w*h))")
    site.create_publication("p", ["box"])
    site.add_remote("r")
    site.subscribe("r", "p")
    app_connection(site).execute("INSERT INTO box (id, w, h) VALUES (1, 2.0, 3.0)")
    (op,) = ops_for(site, "r")
    assert op.after == {"id": 1, "w": 2.0, "h": 3.0}
    site.close()


def test_alter_table_is_picked_up_at_the_next_scan(site):
    app = app_connection(site)
    app.execute("INSERT INTO customer (id, name) VALUES (1, 'Ana')")
    site.scan()
    app.execute("ALTER TABLE customer ADD COLUMN phone TEXT")
    end = site.scan()  # re-installs the triggers for the new definition
    app.execute("UPDATE customer SET phone = '555-0100', name = 'Ana B' WHERE id = 1")
    (op,) = ops_for(site, "r1", end)
    assert op.after == {"name": "Ana B", "phone": "555-0100"}


def test_wide_tables_widen_the_capture_table(tmp_path):
    columns = ", ".join(f"c{i} INTEGER" for i in range(40))
    site = make_site(tmp_path, "hq", "consolidated", f"CREATE TABLE wide (id INTEGER PRIMARY KEY, {columns})")
    site.create_publication("p", ["wide"])
    site.add_remote("r")
    site.subscribe("r", "p")
    app = app_connection(site)
    app.execute(f"INSERT INTO wide VALUES (1, {', '.join(str(i) for i in range(40))})")
    app.execute("UPDATE wide SET c39 = -1 WHERE id = 1")
    insert, update = ops_for(site, "r")
    assert insert.after["c39"] == 39 and len(insert.after) == 41
    assert update.before == {"c39": 39} and update.after == {"c39": -1}
    site.close()
