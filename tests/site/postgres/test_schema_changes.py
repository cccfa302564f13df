"""Schema changes at a PostgreSQL consolidated (agent/site/postgres/changes.py,
docs/postgres.md, "Schema changes"): `agent schema apply URI` adds a
column to a published table, which reaches an extracted SQLite remote in
order with the data, with the value the table's rows got; what it cannot
carry yet is refused in one line, with nothing changed."""

from __future__ import annotations

import json
import time

import pytest

from agent.site import open_site
from agent.site.postgres.connect import connect
from codec.changes import SchemaChange

from .test_cli import consolidated_with_north


def _columns(conn, table: str = "customer") -> list[str]:  # type: ignore[no-untyped-def]
    return [row[0] for row in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                                           " ORDER BY ordinal_position", (table,))]


def _exchange(agent, *sites: object, rounds: int = 3) -> None:  # type: ignore[no-untyped-def]
    for _ in range(rounds):
        for site in sites:
            code, _out, err = agent("run", site, "--once", "-O", "min_age=0")
            assert (code, err) == (0, ""), err


def _extract_west(agent, app_uri: str, tmp_path, *, inbox: str = "north"):  # type: ignore[no-untyped-def]
    """Remote west, subscribed as north is, added and extracted to field/west.db
    (its inbox: ``inbox``'s folder); returns its file."""
    (tmp_path / "inbox" / inbox).mkdir(exist_ok=True)
    assert agent("remote", "add", app_uri, "west", "--address", tmp_path / "inbox" / inbox, "--subscribe",
                 "sales=north")[0] == 0
    west = tmp_path / "field" / "west.db"
    assert agent("extract", app_uri, "west", west)[0] == 0
    return west


def test_a_column_added_at_postgresql_reaches_the_remote_in_order_with_the_data(agent, app_uri, tmp_path) -> None:
    """north's row written before it applied the change reaches hq in the
    old shape and gets the column's default there; hq's row written after
    the change carries the column; both sites end with the same rows, and
    north reports the schema version hq made."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    with open_site(north) as remote:
        remote.connection.execute("INSERT INTO customer VALUES (7, 'Flo', 'north')")
    with connect(app_uri) as conn:
        conn.execute("UPDATE customer SET name = 'Ann B.' WHERE id = 1")  # logged before the change, old shape
    code, out, err = agent("schema", "apply", app_uri, "ALTER TABLE customer ADD COLUMN phone text DEFAULT 'none'")
    assert (code, err) == (0, ""), err
    with open_site(app_uri) as site:
        offset = site.schema_version()
    assert offset is not None
    assert out.splitlines() == [f"Schema change at offset {offset}: added column customer.phone",
                                "It reaches 1 remote(s) that hold customer, in order with the data: north"]
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (8, 'Gus', 'north', '555')")
    _exchange(agent, north, app_uri)
    expected = [(1, "Ann B.", "north", "none"), (7, "Flo", "north", "none"), (8, "Gus", "north", "555")]
    with connect(app_uri) as conn:
        assert conn.execute("SELECT id, name, region, phone FROM customer ORDER BY id").fetchall() == expected
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id, name, region, phone FROM customer ORDER BY id").fetchall() \
            == expected
        assert remote.schema_version() == offset
        remote.connection.execute("UPDATE customer SET phone = '777' WHERE id = 7")  # captured in the new shape
    _exchange(agent, north, app_uri)
    with connect(app_uri) as conn:
        assert conn.execute("SELECT phone FROM customer WHERE id = 7").fetchone() == ("777",)
    with open_site(app_uri) as site:
        assert site.remote("north").peer_schema_version == offset
        assert site.apply_errors() == () and site.conflicts() == ()
    code, out, err = agent("status", app_uri, "--json")
    assert json.loads(out)["site"]["schema_version"] == offset


def test_a_remote_extracted_after_the_change_has_the_column_and_the_schema_version(agent, app_uri, tmp_path) -> None:
    consolidated_with_north(agent, app_uri, tmp_path)
    assert agent("schema", "apply", app_uri, "ALTER TABLE customer ADD COLUMN score integer DEFAULT 3")[0] == 0
    west = _extract_west(agent, app_uri, tmp_path)
    with open_site(app_uri) as site:
        offset = site.schema_version()
    with open_site(west) as remote:
        assert remote.connection.execute("SELECT id, score FROM customer").fetchall() == [(1, 3)]
        assert remote.schema_version() == offset
    # Many at one point (extract --into: each table read once for all of them), the same.
    for name in ("east", "south"):
        assert agent("remote", "add", app_uri, name, "--address", tmp_path / "inbox" / "north", "--subscribe",
                     "sales=north")[0] == 0
    (tmp_path / "fleet").mkdir()
    code, out, err = agent("extract", app_uri, "east", "south", "--into", tmp_path / "fleet")
    assert (code, err) == (0, ""), err
    for name in ("east", "south"):
        with open_site(tmp_path / "fleet" / f"{name}.db") as remote:
            assert remote.connection.execute("SELECT id, score FROM customer").fetchall() == [(1, 3)]
            assert remote.schema_version() == offset


def test_the_change_is_a_log_transaction_of_its_own_between_the_applications_writes(hq, app, tmp_path) -> None:
    """The cut gives the change's writing transaction a log transaction of
    its own, between the application's transactions before and after it
    (which make one log transaction each side when nothing divides them),
    and records the change's offset."""
    hq.add_remote("r1", address="inbox/r1")
    hq.subscribe("r1", "p")
    hq.extract("r1", tmp_path / "r1.db")
    start = hq.scan()
    app.execute("INSERT INTO customer (id, name) VALUES (10, 'a')")
    app.execute("INSERT INTO customer (id, name) VALUES (11, 'b')")
    result = hq.apply_schema(["ALTER TABLE customer ADD COLUMN city text"])
    app.execute("INSERT INTO customer (id, name, city) VALUES (12, 'c', 'Lyon')")
    app.execute("INSERT INTO customer (id, name, city) VALUES (13, 'd', 'Oslo')")
    end = hq.scan()
    transactions = list(hq.read_log("r1", start, end))
    assert [len(transaction.ops) for transaction in transactions] == [2, 1, 2]
    [change] = transactions[1].ops
    assert isinstance(change, SchemaChange) and result.offsets == (transactions[1].commit,)
    assert change.steps == (("add_column", "customer", "city", '"city" TEXT'),)
    assert [op.after["city"] for op in transactions[2].ops] == ["Lyon", "Oslo"]
    assert "city" not in transactions[0].ops[0].after
    assert result.published == ("customer",) and result.subscribers == ("r1",)
    assert hq.schema_version() == transactions[1].commit


def test_a_constant_default_reaches_the_remote_as_the_value_of_its_rows(hq, app, tmp_path) -> None:
    """Each type's default as the log carries the type's values."""
    result = hq.apply_schema(["ALTER TABLE customer ADD COLUMN a integer DEFAULT -4, ADD COLUMN b text DEFAULT"
                              " 'it''s', ADD COLUMN c bytea DEFAULT '\\x0aff', ADD COLUMN d double precision DEFAULT"
                              " 2.5, ADD COLUMN e boolean DEFAULT true, ADD COLUMN f date DEFAULT '2026-11-28',"
                              " ADD COLUMN g numeric(6, 2) DEFAULT 12.5, ADD COLUMN h text"])
    definitions = {step[2]: step[3] for step in result.steps}
    assert definitions == {"a": '"a" INTEGER DEFAULT -4', "b": "\"b\" TEXT DEFAULT 'it''s'",
                           "c": "\"c\" BLOB DEFAULT X'0aff'", "d": '"d" REAL DEFAULT 2.5',
                           "e": '"e" INTEGER DEFAULT 1', "f": "\"f\" TEXT DEFAULT '2026-11-28'",
                           "g": "\"g\" TEXT DEFAULT '12.50'", "h": '"h" TEXT'}
    assert hq.remote_names() == () and result.subscribers == ()


@pytest.mark.parametrize("statement, said", [
    ("ALTER TABLE customer DROP COLUMN region", "customer.region is needed by its article"),
    ("ALTER TABLE customer RENAME COLUMN region TO area", "customer.region is the SUBSCRIBE BY column"),
    ("ALTER TABLE customer DROP COLUMN id", "it re-keys the published table customer"),
    ("ALTER TABLE customer ALTER COLUMN id TYPE numeric", "changing the type of column customer.id of a published "
                                                          "table is refused: it travels as integer and would "
                                                          "travel as numeric"),
    ("ALTER TABLE customer RENAME COLUMN name TO label; ALTER TABLE customer ALTER COLUMN label TYPE date USING NULL",
     "changing the type of column customer.label of a published table is refused: it travels as text"),
    ("ALTER TABLE customer RENAME TO fieldsync_log", "a name of fieldsync's and SQLite's own tables at the remotes"),
    ("DROP TABLE customer", "dropping a published table is refused"),
    ("ALTER TABLE customer ADD COLUMN tag double precision DEFAULT random()", "gives each row its own value"),
    ("INSERT INTO customer (id, name) VALUES (99, 'x')", "it writes rows of a published table"),
    ("ALTER TABLE customer ADD COLUMN n integer; COMMIT", "EXECUTE of transaction commands is not implemented"),
    ("ALTER TABLE fieldsync.log ADD COLUMN x integer", "fieldsync's own tables"),
    ('DROP TRIGGER "0fieldsync_ins" ON customer', "the capture triggers of the published tables are fieldsync's"),
    ("CREATE TABLE notes (id integer PRIMARY KEY); INSERT INTO notes VALUES (1)", "add --unchecked"),
    ("ALTER TABLE customer ADD COLUMN", "syntax error"),
    ("ALTER TABLE customer ADD COLUMN spot point", "customer is published, and a column added to it cannot travel:"
                                                   " column spot has type point"),
])
def test_what_it_cannot_carry_is_one_line_and_changes_nothing(agent, app_uri, tmp_path, statement, said) -> None:
    consolidated_with_north(agent, app_uri, tmp_path)
    with open_site(app_uri) as site:
        end = site.scan()
    code, out, err = agent("schema", "apply", app_uri, statement)
    assert code == 1 and len(err.strip().splitlines()) == 1 and said in err, err
    with connect(app_uri) as conn:
        assert _columns(conn) == ["id", "name", "region"]
        assert conn.execute("SELECT to_regclass('notes') IS NULL, (SELECT count(*) FROM customer)").fetchone() \
            == (True, 1)
    with open_site(app_uri) as site:
        assert site.scan() == end and site.schema_version() is None


def test_a_statement_that_waits_for_a_busy_table_gives_up_and_changes_nothing(agent, app_uri, tmp_path) -> None:
    """An application's open transaction holds customer: the ALTER waits
    --lock-timeout seconds for its lock, then the change is refused in one
    line with nothing changed (while it waits, the table's other users
    queue behind it); once the transaction ends, the same command runs.
    On a SQLite consolidated the option is a usage error."""
    consolidated_with_north(agent, app_uri, tmp_path)
    with connect(app_uri) as holder:
        holder.autocommit = False
        holder.execute("SELECT count(*) FROM customer")  # an open transaction that read it: ACCESS SHARE
        started = time.monotonic()
        code, _out, err = agent("schema", "apply", app_uri, "--lock-timeout", "0.5",
                                "ALTER TABLE customer ADD COLUMN phone text")
        waited = time.monotonic() - started
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "a lock it needs was not granted within 0.5 s" in err and "nothing changed" in err
        assert 0.5 <= waited < 30
        holder.rollback()
    with connect(app_uri) as conn:
        assert _columns(conn) == ["id", "name", "region"]
    with open_site(app_uri) as site:
        assert site.schema_version() is None
    code, _out, err = agent("schema", "apply", app_uri, "--lock-timeout", "0.5",
                            "ALTER TABLE customer ADD COLUMN phone text")
    assert (code, err) == (0, ""), err
    code, _out, err = agent("schema", "apply", tmp_path / "hq.db", "--lock-timeout", "1", "SELECT 1")
    assert code == 2 and "--lock-timeout is for a PostgreSQL consolidated" in err


def test_columns_renamed_and_dropped_at_postgresql_reach_the_remote_and_its_rows_in_the_old_shape_follow(
        agent, app_uri, tmp_path) -> None:
    """north's rows written in the shape before the change reach hq after
    it, mapped through hq's history: the renamed column's value goes to its
    new name, the dropped column's is dropped (an UPDATE of it alone writes
    nothing); a retired name is not given again."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    assert agent("schema", "apply", app_uri, "ALTER TABLE customer ADD COLUMN phone text")[0] == 0
    _exchange(agent, north, app_uri)
    with open_site(north) as remote:
        remote.connection.execute("INSERT INTO customer (id, name, region, phone) VALUES (7, 'Flo', 'north', '1')")
        remote.connection.execute("UPDATE customer SET phone = '2' WHERE id = 1")
        remote.connection.execute("UPDATE customer SET name = 'Ann B.' WHERE id = 1")
    code, out, err = agent("schema", "apply", app_uri, "ALTER TABLE customer RENAME COLUMN name TO label",
                           "ALTER TABLE customer DROP COLUMN phone")
    assert (code, err) == (0, ""), err
    with open_site(app_uri) as site:
        offset = site.schema_version()
    assert out.splitlines()[0] == (f"Schema change at offset {offset}: renamed column customer.name to label; "
                                   "dropped column customer.phone")
    _exchange(agent, north, app_uri)
    expected = [(1, "Ann B.", "north"), (7, "Flo", "north")]
    with connect(app_uri) as conn:
        assert _columns(conn) == ["id", "label", "region"]
        assert conn.execute("SELECT id, label, region FROM customer ORDER BY id").fetchall() == expected
    with open_site(north) as remote:
        assert [row[1] for row in remote.connection.execute("PRAGMA table_info(customer)")] == ["id", "label",
                                                                                               "region"]
        assert remote.connection.execute("SELECT id, label, region FROM customer ORDER BY id").fetchall() == expected
        assert remote.schema_version() == offset
    with open_site(app_uri) as site:
        assert site.apply_errors() == () and site.conflicts() == ()
    for statement in ("ALTER TABLE customer ADD COLUMN phone text", "ALTER TABLE customer RENAME COLUMN label TO name"):
        code, out, err = agent("schema", "apply", app_uri, statement)
        assert code == 1 and "was a column of the published table before" in err, err


def test_a_column_retyped_to_a_type_that_travels_as_before_changes_nothing_at_the_remotes(
        agent, app_uri, tmp_path) -> None:
    """varchar(20) to varchar(40), integer to bigint: the values travel as
    before, so the change is the consolidated's only (recorded, captured in
    a new shape) and the remotes keep taking and sending the rows."""
    with connect(app_uri) as conn:
        conn.execute("ALTER TABLE customer ALTER COLUMN name TYPE varchar(20)")  # before it is published
    north = consolidated_with_north(agent, app_uri, tmp_path)
    code, out, err = agent("schema", "apply", app_uri, "ALTER TABLE customer ALTER COLUMN name TYPE varchar(40)",
                           "ALTER TABLE customer ALTER COLUMN id TYPE bigint")
    assert (code, err) == (0, ""), err
    assert "changed the type of customer.name (at the consolidated only: it travels as before)" in out
    assert "It changes nothing a remote receives: it stays at hq." in out
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (5000000000, 'a name longer than twenty', 'north')")
    with open_site(north) as remote:
        remote.connection.execute("UPDATE customer SET name = 'Ann, renamed at north' WHERE id = 1")
    _exchange(agent, north, app_uri)
    expected = [(1, "Ann, renamed at north", "north"), (5000000000, "a name longer than twenty", "north")]
    with connect(app_uri) as conn:
        assert conn.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall() == expected
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall() == expected
    with open_site(app_uri) as site:
        assert site.apply_errors() == ()


def _indexes(path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with open_site(path) as remote:
        return dict(remote.connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"
                                              " AND sql IS NOT NULL AND name NOT LIKE 'fieldsync%'").fetchall())


def test_indexes_made_and_dropped_at_postgresql_reach_the_remote(agent, app_uri, tmp_path) -> None:
    """An index SQLite can make alike reaches the remote as extraction
    makes one, another (on an expression) stays at hq; an index that goes,
    by hand or with the column it used, goes at the remote first, so the
    remote's SQLite drops the column (which it refuses while an index
    uses it)."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    code, out, err = agent("schema", "apply", app_uri, "CREATE INDEX customer_lower ON customer (lower(name))")
    assert (code, err) == (0, "") and "It changes nothing a remote receives" in out, err  # SQLite cannot make it
    code, out, err = agent("schema", "apply", app_uri, "CREATE INDEX customer_name ON customer (name DESC)")
    assert (code, err) == (0, "") and "It reaches 1 remote(s) that hold customer" in out, out
    code, _out, err = agent("schema", "apply", app_uri, "ALTER TABLE customer ADD COLUMN phone text",
                            "CREATE UNIQUE INDEX customer_phone ON customer (phone)")
    assert (code, err) == (0, ""), err
    _exchange(agent, app_uri, north)
    assert _indexes(north) == {
        "customer_name": 'CREATE INDEX "customer_name" ON "customer" ("name" DESC)',
        "customer_phone": 'CREATE UNIQUE INDEX "customer_phone" ON "customer" ("phone")'}
    code, _out, err = agent("schema", "apply", app_uri, "ALTER TABLE customer DROP COLUMN phone",
                            "DROP INDEX customer_name")
    assert (code, err) == (0, ""), err
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (8, 'Gus', 'north')")
    _exchange(agent, app_uri, north)
    assert _indexes(north) == {}
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT * FROM customer ORDER BY id").fetchall() == [
            (1, "Ann", "north"), (8, "Gus", "north")]
        assert remote.apply_errors() == ()
    with open_site(app_uri) as site:
        assert site.remote("north").peer_schema_version == site.schema_version()


def test_a_new_table_published_reaches_the_extracted_remote_with_its_rows(agent, app_uri, tmp_path) -> None:
    """CREATE TABLE through agent schema apply, then `publication add`: the
    remote gets the table (published in its publication, so it captures
    its own writes) and the rows of its subset, with no new extraction."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    assert agent("schema", "apply", app_uri, "CREATE TABLE visit (id integer PRIMARY KEY, region text NOT NULL,"
                 " note text)", "CREATE INDEX visit_note ON visit (note)")[0] == 0
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO visit VALUES (1, 'north', 'a'), (2, 'south', 'b'), (3, 'north', 'c')")
    code, out, err = agent("publication", "add", app_uri, "sales", "visit@region")
    assert (code, err) == (0, ""), err
    with connect(app_uri) as conn:
        conn.execute("UPDATE visit SET note = 'c2' WHERE id = 3")
    with open_site(north) as remote:
        remote.connection.execute("INSERT INTO customer VALUES (7, 'Flo', 'north')")  # its stream goes on
    _exchange(agent, north, app_uri)
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT * FROM visit ORDER BY id").fetchall() == [(1, "north", "a"),
                                                                                         (3, "north", "c2")]
    assert _indexes(north) == {"visit_note": 'CREATE INDEX "visit_note" ON "visit" ("note")'}  # as extraction's
    with open_site(north) as remote:
        remote.connection.execute("INSERT INTO visit VALUES (4, 'north', 'from north')")
    _exchange(agent, north, app_uri)
    with connect(app_uri) as conn:
        assert conn.execute("SELECT note FROM visit WHERE id = 4").fetchone() == ("from north",)
    with open_site(app_uri) as site:
        assert site.apply_errors() == () and site.remote("north").peer_schema_version == site.schema_version()


def test_a_new_table_s_rows_are_sent_by_the_next_run_when_the_process_died_before(
        agent, app_uri, tmp_path, monkeypatch) -> None:
    """The process that published the table died after the change that
    creates it and before its rows were sent: the table's capture stays
    off (a write meanwhile is not captured), and the next run sends the
    rows as they are then, so the remote misses nothing."""
    import agent.site.postgres.site as site_module

    north = consolidated_with_north(agent, app_uri, tmp_path)
    with connect(app_uri) as conn:
        conn.execute("CREATE TABLE visit (id integer PRIMARY KEY, region text NOT NULL, note text)")
        conn.execute("INSERT INTO visit VALUES (1, 'north', 'a')")
    with monkeypatch.context() as patched:
        patched.setattr(site_module, "finish_sends", lambda conn: 0)  # died before the second transaction
        assert agent("publication", "add", app_uri, "sales", "visit@region")[0] == 0
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO visit VALUES (2, 'north', 'meanwhile')")
        assert conn.execute("SELECT count(*) FROM fieldsync.table_send").fetchone() == (1,)
    _exchange(agent, app_uri, north)
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT * FROM visit ORDER BY id").fetchall() == [
            (1, "north", "a"), (2, "north", "meanwhile")]
    with connect(app_uri) as conn:
        assert conn.execute("SELECT count(*) FROM fieldsync.table_send").fetchone() == (0,)
        conn.execute("UPDATE visit SET note = 'after' WHERE id = 2")  # captured again
    _exchange(agent, app_uri, north)
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT note FROM visit WHERE id = 2").fetchone() == ("after",)


def test_unchecked_statements_run_at_the_consolidated_only(hq, app, tmp_path) -> None:
    """A table of no article, written and dropped under --unchecked: the
    change records its steps; no remote receives any of it."""
    hq.add_remote("r1", address="inbox/r1")
    hq.subscribe("r1", "p")
    hq.extract("r1", tmp_path / "r1.db")
    start = hq.scan()
    result = hq.apply_schema(["CREATE TABLE scratch (id integer PRIMARY KEY, v text)",
                              "INSERT INTO scratch VALUES (1, 'x'); ALTER TABLE scratch ADD COLUMN w text",
                              "CREATE INDEX scratch_v ON scratch (v)"], unchecked=True)
    assert result.steps == (("create_table", "scratch"), ("add_column", "scratch", "w", None),
                            ("create_index", "scratch", "scratch_v"))
    assert result.published == () and result.subscribers == () and len(result.offsets) == 1
    assert [op for transaction in hq.read_log("r1", start, hq.scan()) for op in transaction.ops] == []
    assert app.execute("SELECT * FROM scratch").fetchall() == [(1, "x", None)]


def test_passthrough_runs_at_the_named_remote_only_and_travels_back_as_its_write(agent, app_uri, tmp_path) -> None:
    """`--passthrough --to north` from PostgreSQL: nothing runs at hq, the
    schema version does not move, north runs the statement as its own
    write, which comes back to hq like its others; west, which holds the
    same rows, gets nothing.  What passthrough may not carry is one line,
    with nothing sent."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    west = _extract_west(agent, app_uri, tmp_path, inbox="west")
    with open_site(app_uri) as site:
        end = site.scan()
    for statement, said in [("CREATE TABLE x (id INTEGER PRIMARY KEY)", "passthrough carries data statements only"),
                            ("UPDATE nowhere SET a = 1", "no such table: nowhere"),
                            ("UPDATE customer SET name = 'x'; DELETE FROM fieldsync_log", "statement 2 (DELETE FROM "
                             "fieldsync_log): no such table")]:
        code, _out, err = agent("schema", "apply", app_uri, "--passthrough", "--to", "north", statement)
        assert code == 1 and len(err.strip().splitlines()) == 1 and said in err, err
    code, _out, err = agent("schema", "apply", app_uri, "--passthrough", "--to", "ghost", "DELETE FROM customer")
    assert code == 1 and "no remote named 'ghost'" in err
    with open_site(app_uri) as site:
        assert site.scan() == end  # nothing was logged
    code, out, err = agent("schema", "apply", app_uri, "--passthrough", "--to", "north",
                           "UPDATE customer SET name = 'fixed at north' WHERE id = 1")
    assert (code, err) == (0, ""), err
    assert "it runs at north only" in out
    with connect(app_uri) as conn:
        assert conn.execute("SELECT name FROM customer WHERE id = 1").fetchone() == ("Ann",)
    with open_site(app_uri) as site:
        assert site.schema_version() is None
    _exchange(agent, app_uri, north, west, app_uri, west)
    for path, name in ((north, "fixed at north"), (west, "fixed at north")):
        with open_site(path) as remote:
            assert remote.connection.execute("SELECT name FROM customer WHERE id = 1").fetchone() == (name,)
            assert remote.schema_version() is None
    with connect(app_uri) as conn:  # north's own write came back, and went on to west
        assert conn.execute("SELECT name FROM customer WHERE id = 1").fetchone() == ("fixed at north",)
    with open_site(app_uri) as site:
        assert site.apply_errors() == () and site.conflicts() == ()


def test_a_published_table_renamed_at_postgresql_reaches_the_remote_and_rows_under_its_old_name_follow(
        agent, app_uri, tmp_path) -> None:
    """RENAME TO of a published table, with a column added to it in the
    same change: north applies both in order with the data; its row
    logged under the old name before it applied them reaches hq's renamed
    table, and hq's row logged before the rename reaches north's; both
    sites end alike, and write on under the new name.  The old name is
    never given again; a remote extracted after has the table by its new
    name."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    with open_site(north) as remote:
        remote.connection.execute("INSERT INTO customer VALUES (7, 'Flo', 'north')")
    with connect(app_uri) as conn:
        conn.execute("UPDATE customer SET name = 'Ann B.' WHERE id = 1")
    code, out, err = agent("schema", "apply", app_uri, "ALTER TABLE customer RENAME TO client",
                           "ALTER TABLE client ADD COLUMN phone text")
    assert (code, err) == (0, ""), err
    assert "renamed table customer to client" in out and "It reaches 1 remote(s) that hold client" in out, out
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO client VALUES (8, 'Gus', 'north', '555')")
    _exchange(agent, north, app_uri)
    expected = [(1, "Ann B.", "north", None), (7, "Flo", "north", None), (8, "Gus", "north", "555")]
    with connect(app_uri) as conn:
        assert conn.execute("SELECT id, name, region, phone FROM client ORDER BY id").fetchall() == expected
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id, name, region, phone FROM client ORDER BY id").fetchall() \
            == expected
        assert [publication.articles[0].table for publication in remote.publications()] == ["client"]
        remote.connection.execute("UPDATE client SET phone = '777' WHERE id = 7")
    _exchange(agent, north, app_uri)
    with connect(app_uri) as conn:
        assert conn.execute("SELECT phone FROM client WHERE id = 7").fetchone() == ("777",)
    with open_site(app_uri) as site:
        assert site.apply_errors() == () and site.conflicts() == ()
        assert site.remote("north").peer_schema_version == site.schema_version()
        assert site.table_renames() == {"customer": "client"}
    for statement in ("ALTER TABLE client RENAME TO customer", "CREATE TABLE customer (id integer PRIMARY KEY)"):
        code, _out, err = agent("schema", "apply", app_uri, statement)
        assert code == 1 and "customer was the name of a published table before it was renamed" in err, err
    west = _extract_west(agent, app_uri, tmp_path)
    with open_site(west) as remote:
        assert remote.connection.execute("SELECT id, phone FROM client ORDER BY id").fetchall() == [
            (1, None), (7, "777"), (8, "555")]


def test_a_column_dropped_by_hand_fails_writes_only_until_the_agent_runs(agent, app_uri, tmp_path) -> None:
    """ALTER TABLE by hand, outside agent schema apply: the capture
    triggers still name the column dropped, so every write to the table
    fails (PostgreSQL's own error) until the agent's next scan, which makes
    the capture again in the new shape with one warning.  The change
    reaches no remote: north keeps its column, and the next row reaches it
    without a value there."""
    import psycopg

    north = consolidated_with_north(agent, app_uri, tmp_path)
    with connect(app_uri) as conn:
        conn.execute("ALTER TABLE customer DROP COLUMN name")
    with pytest.raises(psycopg.Error, match="name"), connect(app_uri) as conn:
        conn.execute("INSERT INTO customer (id, region) VALUES (9, 'north')")
    code, _out, err = agent("run", app_uri, "--once", "-O", "min_age=0")
    assert code == 0 and "customer was altered outside agent schema apply" in err, err
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer (id, region) VALUES (9, 'north')")
    _exchange(agent, app_uri, north)
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall() == [
            (1, "Ann", "north"), (9, None, "north")]
