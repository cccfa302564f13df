"""Extracting a SQLite remote from a PostgreSQL consolidated
(PostgresSite.extract, agent.site.postgres.extract over agent.site.sqlite.extract):
one consistent point while applications write, the remote's tables from
the types table, its rows as the log carries them, and the remote-user
rows of both sides as a SQLite consolidated makes them."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from agent.site import Article, ExtractionError, UnknownRemote
from agent.site.sqlite.database import SiteDatabase
from agent.site.postgres.connect import connect
from agent.site.postgres.site import PostgresSite
from codec.ops import operations_of

from .both import COLUMNS, REGIONS, WRITERS, consolidated, seed, write_rows  # noqa: F401  (consolidated: a fixture)
from .replay import Copy


def _remote_rows(path) -> dict:  # type: ignore[no-untyped-def]
    with sqlite3.connect(path) as conn:
        found = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM customer").fetchall()
    return {(row[0],): dict(zip(COLUMNS, row)) for row in found}


def test_a_remote_extracted_while_applications_write_plus_the_log_after_its_point_is_its_subset(consolidated,
                                                                                                 tmp_path):
    """Four writers go on while north1 is extracted.  Replayed strictly
    onto the extracted rows (no INSERT of a row held, no UPDATE whose
    before-image differs), the log after the recorded offset gives exactly
    the consolidated's north rows: the copy holds every change at or below
    the offset and none above it.  Applied to the extracted remote by its
    own apply, the same."""
    site, setup = consolidated.site, consolidated.app()
    seed(setup)
    site.scan()
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            write_rows(consolidated.app(), number, stop, transactions=200)
        except BaseException as error:  # noqa: BLE001  (reported below)
            failures.append(error)

    threads = [threading.Thread(target=writer, args=(number,)) for number in range(1, WRITERS + 1)]
    for thread in threads:
        thread.start()
    time.sleep(0.15)  # the writers are under way
    for _ in range(3):
        site.scan()
    result = site.extract("north1", tmp_path / "north1.db")
    extracted_while_writing = any(thread.is_alive() for thread in threads)
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert extracted_while_writing
    row = site.remote("north1")
    assert row.log_sent == row.confirm_sent == row.log_send == result.offset
    assert row.peer_incarnation == result.incarnation
    end = site.scan()
    assert end > result.offset  # the writers wrote after the extraction point
    transactions = list(site.read_log("north1", result.offset, end))
    copy = Copy(tables={"customer": _remote_rows(result.path)})
    assert result.rows == {"customer": len(copy.tables["customer"])}
    for transaction in transactions:
        copy.apply(operations_of(transaction.ops))
    assert copy.problems == []
    expected = setup.rows("WHERE region = %s", ("north",))
    assert copy.tables["customer"] == expected
    with SiteDatabase.open(result.path) as remote:
        assert remote.remote("hq").log_received == result.offset
        applied = remote.apply("hq", transactions, log_received=end)
        assert remote.apply_errors() == () and remote.conflicts() == () and applied is not None
        assert remote.remote("hq").log_received == end
    assert _remote_rows(result.path) == expected


def test_the_remote_s_tables_come_from_the_types_table_and_its_values_as_the_log_carries_them(target, tmp_path):
    with connect(target) as app:
        app.execute("CREATE TYPE mood AS ENUM ('calm', 'busy')")
        app.execute("CREATE SCHEMA field")
        app.execute("CREATE TABLE field.reading (region_id integer, n bigint, code text, amount numeric(10,2),"
                    " at timestamptz, day date, blob bytea, flag boolean, ratio real, big double precision, id uuid,"
                    " doc jsonb, mood mood, note varchar(20), secret text, PRIMARY KEY (code, n))")
        app.execute("INSERT INTO field.reading VALUES (7, 1, 'a', 12.5, '2024-05-01 12:30:00.5+00', '2024-02-29',"
                    " '\\x00ff', true, 0.1, 1e300, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '{\"b\": 1, \"a\": 2}',"
                    " 'busy', 'hello', 'kept at hq'), (8, 2, 'b', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
                    " NULL, NULL, NULL, NULL), (9, 3, 'c', 'NaN', 'infinity', '-infinity', '', false, 'NaN', '-0',"
                    " NULL, 'null', 'calm', '', 'x')")
        with PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "home") as site:
            site.create_publication("p", [Article("field.reading", columns=(
                "n", "code", "amount", "at", "day", "blob", "flag", "ratio", "big", "id", "doc", "mood", "note"),
                subscribe_by="region_id")])
            site.add_remote("r1")
            site.subscribe("r1", "p", 7)
            site.subscribe("r1", "p", 9.0)  # equal to the integer 9 in Python's terms, as the readers select
            result = site.extract("r1", tmp_path / "r1.db")
            app.execute("UPDATE field.reading SET amount = 13, note = 'changed' WHERE n = 1")
            [transaction] = site.read_log("r1", result.offset, site.scan())
    with sqlite3.connect(result.path) as remote:
        declared = [(name, kind, key) for _, name, kind, _, _, key in remote.execute(
            'PRAGMA table_info("field.reading")')]
        rows = remote.execute('SELECT *, typeof(amount), typeof(flag) FROM "field.reading" ORDER BY n').fetchall()
        articles = remote.execute("SELECT table_name, subscribe_by FROM fieldsync_article").fetchall()
    # Table order, the key (code, n) in its own order; the SUBSCRIBE BY column is not published.
    assert declared == [("n", "INTEGER", 2), ("code", "TEXT", 1), ("amount", "TEXT", 0), ("at", "TEXT", 0),
                        ("day", "TEXT", 0), ("blob", "BLOB", 0), ("flag", "INTEGER", 0), ("ratio", "REAL", 0),
                        ("big", "REAL", 0), ("id", "TEXT", 0), ("doc", "TEXT", 0), ("mood", "TEXT", 0),
                        ("note", "TEXT", 0)]
    assert rows == [
        (1, "a", "12.50", "2024-05-01T12:30:00.500000Z", "2024-02-29", b"\x00\xff", 1, 0.1, 1e300,
         "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", '{"a": 2, "b": 1}', "busy", "hello", "text", "integer"),
        (3, "c", "NaN", "infinity", "-infinity", b"", 0, "NaN", 0.0, None, "null", "calm", "", "text", "integer")]
    assert result.rows == {"field.reading": 2}
    assert articles == [("field.reading", None)]  # the remote publishes it whole, to the consolidated
    # The stream speaks of the row as the copy holds it: its before-image is the copy's values.
    [update] = transaction.ops
    assert (update.table, update.key, update.before, update.after) == (
        "field.reading", ("a", 1), {"amount": "12.50", "note": "hello"}, {"amount": "13.00", "note": "changed"})


def test_the_remote_s_tables_keep_the_foreign_keys_it_can_check_with_their_actions(target, tmp_path):
    """A key whose columns, parent and parent key the remote gets is kept
    with its actions (a line goes with its order there as at hq); one to a
    table the remote does not get, to columns that are not the parent's key
    there, or with SET DEFAULT (the copy has no defaults) is not."""
    with connect(target) as app:
        app.execute("CREATE TABLE region (code text PRIMARY KEY, name text UNIQUE)")
        app.execute("CREATE TABLE orders (id bigint PRIMARY KEY, region text REFERENCES region (code),"
                    " region_name text REFERENCES region (name), note text)")
        app.execute("CREATE TABLE unpublished (id bigint PRIMARY KEY)")
        app.execute("CREATE TABLE line (id bigint PRIMARY KEY,"
                    " order_id bigint NOT NULL REFERENCES orders (id) ON DELETE CASCADE ON UPDATE SET NULL,"
                    " other bigint REFERENCES unpublished (id),"
                    " fallback bigint DEFAULT 1 REFERENCES orders (id) ON DELETE SET DEFAULT DEFERRABLE)")
        app.execute("INSERT INTO region VALUES ('n', 'north')")
        app.execute("INSERT INTO orders VALUES (1, 'n', 'north', 'a')")
        app.execute("INSERT INTO line VALUES (10, 1, NULL, NULL), (11, 1, NULL, NULL)")
        with PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "home") as site:
            site.create_publication("p", ["region", "orders", "line"])
            site.add_remote("r1")
            site.subscribe("r1", "p")
            result = site.extract("r1", tmp_path / "r1.db")
    with sqlite3.connect(result.path) as remote:
        keys = {table: [(row[2], row[3], row[4], row[5], row[6]) for row in remote.execute(
            f"PRAGMA foreign_key_list({table})")] for table in ("region", "orders", "line")}
        remote.execute("PRAGMA foreign_keys = ON")
        remote.execute("DELETE FROM orders WHERE id = 1")
        left = remote.execute("SELECT count(*) FROM line").fetchone()[0]
    assert keys == {"region": [], "orders": [("region", "region", "code", "NO ACTION", "NO ACTION")],
                    "line": [("orders", "order_id", "id", "SET NULL", "CASCADE")]}
    assert left == 0


def test_the_remote_s_tables_get_the_indexes_sqlite_can_make_alike(target, tmp_path):
    """B-tree indexes on published plain columns go to the copy, UNIQUE and
    DESC with them, named as at hq (schema-qualified outside public); an
    index on a column the remote does not get, on an expression, with a
    WHERE, of another access method, of a DEFERRABLE constraint, or NULLS
    NOT DISTINCT does not.  The unique index holds at the remote."""
    with connect(target) as app:
        app.execute("CREATE SCHEMA sales")
        app.execute("CREATE TABLE orders (id bigint PRIMARY KEY, region text, code text, placed date, secret text,"
                    " tags text, CONSTRAINT orders_code_later UNIQUE (placed) DEFERRABLE)")
        app.execute("CREATE INDEX orders_region_placed ON orders (region, placed DESC) INCLUDE (secret)")
        app.execute("CREATE UNIQUE INDEX orders_code ON orders (code)")
        app.execute("CREATE INDEX orders_secret ON orders (secret)")
        app.execute("CREATE INDEX orders_lower ON orders (lower(code))")
        app.execute("CREATE INDEX orders_open ON orders (region) WHERE placed IS NULL")
        app.execute("CREATE INDEX orders_hash ON orders USING hash (tags)")
        app.execute("CREATE UNIQUE INDEX orders_tags ON orders (tags) NULLS NOT DISTINCT")
        app.execute("CREATE TABLE sales.item (id bigint PRIMARY KEY, name text)")
        app.execute("CREATE INDEX item_name ON sales.item (name)")
        app.execute("INSERT INTO orders VALUES (1, 'north', 'A1', NULL, 's', NULL), (2, 'south', 'A2', NULL, 's', 't')")
        with PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "home") as site:
            site.create_publication("p", [Article("orders", columns=("region", "code", "placed", "tags"),
                                                  subscribe_by="region"), "sales.item"])
            site.add_remote("r1")
            site.subscribe("r1", "p", "north")
            result = site.extract("r1", tmp_path / "r1.db")
    with sqlite3.connect(result.path) as remote:
        made = sorted(remote.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index'"
                                     " AND sql IS NOT NULL AND name NOT LIKE 'fieldsync%'").fetchall())
        assert remote.execute("SELECT id, code FROM orders").fetchall() == [(1, "A1")]
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            remote.execute("INSERT INTO orders (id, region, code) VALUES (3, 'north', 'A1')")
    assert made == [
        ("orders_code", "orders", 'CREATE UNIQUE INDEX "orders_code" ON "orders" ("code")'),
        ("orders_region_placed", "orders", 'CREATE INDEX "orders_region_placed" ON "orders" ("region", "placed" DESC)'),
        ("sales.item_name", "sales.item", 'CREATE INDEX "sales.item_name" ON "sales.item" ("name")')]


def test_extracting_again_replaces_the_stream_and_remembers_the_copy_it_replaced(hq, app, tmp_path):
    hq.add_remote("r1", address="inbox/r1", public_key="key-one")
    hq.subscribe("r1", "p")
    app.execute("INSERT INTO customer (name, region) VALUES ('Ann', 'north')")
    first = hq.extract("r1", tmp_path / "a.db")
    second = hq.extract("r1", tmp_path / "b.db", options={"poll": "5"})
    row = hq.remote("r1")
    assert second.incarnation != first.incarnation and row.peer_incarnation == second.incarnation
    assert (row.resend_count, row.rereceive_count) == (2, 2) and row.public_key == "key-one"
    assert hq.replaced_incarnations("r1") == frozenset({first.incarnation})
    with SiteDatabase.open(tmp_path / "b.db") as remote:
        assert remote.identity.name == "r1" and remote.identity.role.value == "remote"
        assert remote.identity.address == "inbox/r1" and remote.transport_options() == {"poll": "5"}
        consolidated = remote.remote("hq")
        assert (consolidated.resend_count, consolidated.rereceive_count) == (2, 2)
        assert consolidated.peer_incarnation == hq.identity.incarnation
        assert [publication.name for publication in remote.publications()] == ["p"]


def test_a_failed_extraction_changes_nothing_and_leaves_no_file(hq, app, tmp_path, monkeypatch):
    import agent.site.postgres.extract as pg_extract

    hq.add_remote("r1")
    hq.subscribe("r1", "p")
    with pytest.raises(UnknownRemote):
        hq.extract("ghost", tmp_path / "ghost.db")
    (tmp_path / "taken.db").write_bytes(b"")
    with pytest.raises(ExtractionError, match="exists already"):
        hq.extract("r1", tmp_path / "taken.db")
    before = hq.remote("r1")

    def interrupted(*args):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(pg_extract, "_copy_rows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hq.extract("r1", tmp_path / "r1.db")
    assert hq.remote("r1") == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hq-home", "taken.db"]
    hq.scan()  # the site's connection is usable, and no transaction was left open


def test_a_stream_that_moves_on_during_the_extraction_is_not_overwritten(hq, app, tmp_path, monkeypatch):
    import agent.site.postgres.extract as pg_extract

    hq.add_remote("r1")
    hq.subscribe("r1", "p")
    copy_rows = pg_extract._copy_rows

    def resend_meanwhile(*args):  # type: ignore[no-untyped-def]
        app.execute("UPDATE fieldsync.remote SET rereceive_count = rereceive_count + 1 WHERE name = 'r1'")
        return copy_rows(*args)

    monkeypatch.setattr(pg_extract, "_copy_rows", resend_meanwhile)
    with pytest.raises(ExtractionError, match="asked for or was asked for a resend while it was extracted"):
        hq.extract("r1", tmp_path / "r1.db")
    assert hq.remote("r1").peer_incarnation is None and not (tmp_path / "r1.db").exists()
