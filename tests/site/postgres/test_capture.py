"""agent.site.postgres.capture: what the triggers write, in the logical form
of a SQLite site's capture rows, for whom, and what they refuse."""

from __future__ import annotations

import psycopg
import pytest

from agent.site.errors import UnpublishableTable
from agent.site.postgres.capture import describe_table, drop_capture, install_capture, load_shapes, set_origin
from agent.site.postgres.connect import connect
from agent.site.postgres.log import cut, iter_capture, log_end
from agent.site.postgres.schema import install_schema
from agent.site.postgres.uri import parse_uri
from codec.ops import Operation
from tests.pgserver import write_pgpass

from .replay import Copy, operations

CUSTOMER = "CREATE TABLE customer (id integer PRIMARY KEY, name text, region text, balance numeric(10,2))"
# Key order (line_no, order_id) differs from column order on purpose.
LINE = ("CREATE TABLE line (order_id integer NOT NULL, line_no integer NOT NULL, sku text NOT NULL, qty integer,"
        " PRIMARY KEY (line_no, order_id))")


def _log(conn, target, after: int = 0) -> list[tuple[int, str, list[tuple]]]:
    """Cut, then every log transaction after ``after``, rows joined."""
    end = cut(conn, target, "hq").log_end
    merged: list[tuple[int, str, list[tuple]]] = []
    for commit, origin, rows in iter_capture(conn, after, end):
        if merged and merged[-1][0] == commit:
            merged[-1][2].extend(rows)
        else:
            merged.append((commit, origin, list(rows)))
    return merged


def test_rows_have_the_sqlite_layout_and_the_readers_take_them(site, target):
    site.execute(CUSTOMER)
    shape = install_capture(site, target, "customer")
    with site.transaction():
        site.execute("INSERT INTO customer VALUES (1, 'Fjord', 'north', 10.5), (2, 'Sand', 'south', NULL)")
        site.execute("UPDATE customer SET region = 'west', balance = 11 WHERE id = 1")
        site.execute("UPDATE customer SET name = name WHERE id = 2")  # changes nothing
        site.execute("DELETE FROM customer WHERE id = 2")
    [(commit, origin, rows)] = _log(site, target)
    assert (commit, origin) == (1, "hq")
    assert [row[:4] for row in rows] == [(rows[0][0] + n, shape.id, kind, 0) for n, kind in
                                         enumerate((1, 1, 2, 2, 3))]
    assert rows[2][4:] == (1, "Fjord", "north", "10.50", 1, "Fjord", "west", "11.00")
    assert operations(rows, load_shapes(site)) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "Fjord", "region": "north", "balance": "10.50"}),
        Operation.insert("customer", (2,), {"id": 2, "name": "Sand", "region": "south", "balance": None}),
        Operation("customer", 2, (1,), {"region": "north", "balance": "10.50"}, {"region": "west", "balance": "11.00"}),
        Operation("customer", 3, (2,), {"id": 2, "name": "Sand", "region": "south", "balance": None}, None),
    ]


def test_keys_come_in_primary_key_order_and_key_moves_keep_the_old_key(site, target):
    site.execute(LINE)
    shape = install_capture(site, target, "line")
    assert shape.layout.key_columns == ("line_no", "order_id") and shape.shape.key_positions == (1, 0)
    site.execute("INSERT INTO line VALUES (7, 1, 'pump', 2)")
    site.execute("UPDATE line SET line_no = 2 WHERE order_id = 7")
    [(_, _, rows)] = _log(site, target)
    ops = operations(rows, load_shapes(site))
    assert [op.key for op in ops] == [(1, 7), (1, 7)]
    assert ops[1].after == {"line_no": 2}


def test_the_origin_setting_marks_a_transaction_and_ends_with_it(site, target):
    site.execute(CUSTOMER)
    install_capture(site, target, "customer")
    with site.transaction():
        set_origin(site, "north1")
        site.execute("INSERT INTO customer VALUES (1, 'from north1', 'north', 1)")
    site.execute("INSERT INTO customer VALUES (2, 'local', 'south', 2)")
    with site.transaction():
        set_origin(site, "south1")
        site.execute("INSERT INTO customer VALUES (3, 'from south1', 'south', 3)")
    log = _log(site, target)
    assert [(origin, [row[5] for row in rows]) for _, origin, rows in log] == [
        ("north1", ["from north1"]), ("hq", ["local"]), ("south1", ["from south1"])]
    assert [commit for commit, _, _ in log] == [1, 2, 3]


def test_an_application_role_needs_no_grant_on_fieldsync_and_cannot_forge_rows(postgres, site, target, database,
                                                                             tmp_path):
    site.execute(CUSTOMER)
    install_capture(site, target, "customer")
    role = postgres.create_role(password="app password")
    site.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
    site.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON customer TO "{role}"')
    passfile = write_pgpass(tmp_path / "pgpass", [("127.0.0.1", postgres.port, "*", role, "app password")])
    app = psycopg.connect(postgres.uri(database, role, passfile=str(passfile)), autocommit=True)
    try:
        app.execute("INSERT INTO customer VALUES (1, 'by the app', 'north', 1)")
        app.execute("UPDATE customer SET name = 'changed' WHERE id = 1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("INSERT INTO fieldsync.capture (shape, kind, v) VALUES (1, 1, ARRAY['1'])")
    finally:
        app.close()
    [(_, _, rows)] = _log(site, target)
    assert [row[2] for row in rows] == [1, 2]


def test_a_callers_search_path_cannot_change_what_the_triggers_run(site, target):
    site.execute("CREATE TABLE reading (id integer PRIMARY KEY, value float8, at date)")
    install_capture(site, target, "reading")
    site.execute("CREATE SCHEMA evil")
    site.execute("CREATE FUNCTION evil.encode(bytea, text) RETURNS text LANGUAGE sql AS $$ SELECT 'forged' $$")
    site.execute("CREATE FUNCTION evil.float8send(float8) RETURNS bytea LANGUAGE sql AS $$ SELECT '\\x00'::bytea $$")
    with site.transaction():
        site.execute("SET LOCAL search_path = evil, pg_catalog, public")
        site.execute("INSERT INTO reading VALUES (1, 2.5, '2024-01-01')")
    [(_, _, [row])] = _log(site, target)
    assert row[4:] == (1, 2.5, "2024-01-01")


def test_an_application_trigger_changing_the_new_row_is_captured_after_it(site, target):
    """Capture fires first among AFTER triggers, so a row an application
    trigger changes right after its INSERT is replayed in that order."""
    site.execute(CUSTOMER)
    site.execute("CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                 " UPDATE customer SET name = upper(NEW.name) WHERE id = NEW.id; RETURN NULL; END $$")
    site.execute("CREATE TRIGGER audit AFTER INSERT ON customer FOR EACH ROW EXECUTE FUNCTION stamp()")
    install_capture(site, target, "customer")
    site.execute("INSERT INTO customer VALUES (1, 'fjord', 'north', 1)")
    [(_, _, rows)] = _log(site, target)
    copy = Copy()
    copy.apply(operations(rows, load_shapes(site)))
    assert not copy.problems
    assert copy.rows("customer") == site.execute("SELECT id, name, region, balance::text FROM customer").fetchall()


def test_truncate_of_a_published_table_is_refused_and_nothing_changes(site, target):
    site.execute(CUSTOMER)
    site.execute("CREATE TABLE scratch (id integer PRIMARY KEY)")
    install_capture(site, target, "customer")
    site.execute("INSERT INTO customer VALUES (1, 'kept', 'north', 1)")
    site.execute("INSERT INTO scratch VALUES (1)")
    for statement in ("TRUNCATE customer", "TRUNCATE scratch, customer", "TRUNCATE TABLE ONLY public.customer"):
        with pytest.raises(psycopg.errors.FeatureNotSupported) as caught:
            site.execute(statement)
        assert "TRUNCATE of published table public.customer is refused" in str(caught.value)
        assert "DELETE" in caught.value.diag.message_hint
    assert site.execute("SELECT count(*) FROM customer").fetchone() == (1,)
    assert site.execute("SELECT count(*) FROM scratch").fetchone() == (1,)
    site.execute("TRUNCATE scratch")  # unpublished tables are the applications' own business


def test_a_changed_definition_gets_a_new_shape_and_old_rows_keep_theirs(site, target):
    site.execute(CUSTOMER)
    first = install_capture(site, target, "customer")
    assert install_capture(site, target, "customer") == first  # unchanged: the same shape
    site.execute("INSERT INTO customer VALUES (1, 'before', 'north', 1)")
    site.execute("ALTER TABLE customer ADD COLUMN phone text")
    second = install_capture(site, target, "customer")
    assert second.id != first.id and second.layout.columns[-1] == "phone"
    site.execute("INSERT INTO customer VALUES (2, 'after', 'south', 2, '555')")
    [(_, _, rows)] = _log(site, target)
    assert operations(rows, load_shapes(site)) == [
        Operation.insert("customer", (1,), {"id": 1, "name": "before", "region": "north", "balance": "1.00"}),
        Operation.insert("customer", (2,), {"id": 2, "name": "after", "region": "south", "balance": "2.00",
                                            "phone": "555"}),
    ]


def test_drop_capture_stops_capturing_and_allows_truncate(site, target):
    site.execute(CUSTOMER)
    install_capture(site, target, "customer")
    drop_capture(site, target, "customer")
    site.execute("INSERT INTO customer VALUES (1, 'unseen', 'north', 1)")
    site.execute("TRUNCATE customer")
    assert _log(site, target) == [] and log_end(site) == 0


def test_generated_columns_are_left_to_every_site(site, target):
    site.execute("CREATE TABLE item (id integer PRIMARY KEY, price numeric, doubled numeric"
                 " GENERATED ALWAYS AS (price * 2) STORED)")
    assert describe_table(site, "item").layout.columns == ("id", "price")


@pytest.mark.parametrize("setup, table, words", [
    ("CREATE TABLE nokey (a integer)", "nokey", "no primary key"),
    ("CREATE VIEW customer_view AS SELECT 1 AS id", "customer_view", "a view"),
    ("CREATE TABLE parted (id integer PRIMARY KEY) PARTITION BY RANGE (id)", "parted", "a partitioned table"),
    ("SELECT 1", "missing_table", "does not exist"),
    ("SELECT 1", "fieldsync.capture", "belongs to PostgreSQL or fieldsync"),
    ("SELECT 1", "pg_catalog.pg_class", "belongs to PostgreSQL or fieldsync"),
])
def test_what_cannot_be_published_is_refused_in_one_line(site, target, setup, table, words):
    site.execute(setup)
    with pytest.raises(UnpublishableTable) as caught:
        install_capture(site, target, table)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_plain_role_owning_its_tables_runs_capture(postgres, database, tmp_path):
    """No superuser: a role with CREATE on the database and its own tables."""
    role = postgres.create_role(password="agent password")
    with postgres.admin(database) as admin:
        admin.execute(f'GRANT CONNECT, CREATE ON DATABASE "{database}" TO "{role}"')
        admin.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
    passfile = write_pgpass(tmp_path / "pgpass", [("127.0.0.1", postgres.port, "*", role, "agent password")])
    target = parse_uri(postgres.uri(database, role, passfile=str(passfile)))
    conn = connect(target)
    try:
        install_schema(conn, target)
        conn.execute(CUSTOMER)
        install_capture(conn, target, "customer")
        conn.execute("INSERT INTO customer VALUES (1, 'x', 'north', 1)")
        assert [len(rows) for _, _, rows in _log(conn, target)] == [1]
    finally:
        conn.close()
