"""Extraction of a remote database (agent.site.sqlite.extract)."""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import re
import stat
import time

import pytest

from agent.site import (
    Article,
    ExtractionError,
    InvalidSetting,
    RemoteKeys,
    Role,
    SiteDatabase,
    UnknownRemote,
    WrongRole,
)

from tests.sqlfiles import connected

from .conftest import CUSTOMER, LINE, app_connection, make_site, replicate, table_rows
from .workers import churn_orders


@pytest.fixture
def hq(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER, LINE,
                     "CREATE TABLE secret (id INTEGER PRIMARY KEY, x)",
                     "CREATE INDEX line_sku ON line (sku)",
                     "CREATE INDEX customer_name ON customer (name)",
                     "CREATE INDEX customer_balance ON customer (balance)")
    site.create_publication("sales", [Article("customer", columns=["name", "region"], subscribe_by="region"),
                                      Article("line")])
    app = app_connection(site)
    app.execute("INSERT INTO customer VALUES (1, 'n1', 'north', 1.0, x'01', 'e'), (2, 's2', 'south', 2.0, NULL, NULL),"
                " (3, 'n3', 'north', 3.0, NULL, NULL)")
    app.execute("INSERT INTO line VALUES (1, 1, 'A', 1), (3, 1, 'B', 2)")
    app.execute("INSERT INTO secret VALUES (1, 'not for remotes')")
    site.add_remote("r1", address="r1@example.org", transport="email", send_every=600)
    site.subscribe("r1", "sales", "north")
    yield site
    site.close()


def test_extraction_builds_the_remote(tmp_path, hq):
    target = tmp_path / "out" / "r1.db"
    target.parent.mkdir()
    keys = RemoteKeys(public_key="fieldsync-public r1 SIGN SEAL")
    result = hq.extract("r1", target, keys=keys)
    assert sorted(p.name for p in target.parent.iterdir()) == ["r1.db"]  # no temporary left behind
    assert result.rows == {"customer": 2, "line": 2}
    remote = SiteDatabase.open(target)
    identity = remote.identity
    assert (identity.name, identity.role, identity.address, identity.transport) == (
        "r1", Role.REMOTE, "r1@example.org", "email")
    assert identity.incarnation == result.incarnation != hq.identity.incarnation
    assert identity.public_key == keys.public_key
    # Published schema only; the column subset becomes the remote's table.
    tables = {row[0] for row in remote.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if not row[0].startswith("fieldsync_")}
    assert tables == {"customer", "line"}
    assert [row[1] for row in remote.connection.execute("PRAGMA table_info(customer)")] == ["id", "name", "region"]
    line_sql = remote.connection.execute("SELECT sql FROM sqlite_master WHERE name = 'line'").fetchone()[0]
    assert line_sql == LINE
    indexes = {row[0] for row in remote.connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'"
                                                           " AND sql IS NOT NULL")}
    assert {"line_sku", "customer_name"} <= indexes and "customer_balance" not in indexes
    assert table_rows(remote, "customer") == [(1, "n1", "north"), (3, "n3", "north")]
    assert table_rows(remote, "line") == [(1, 1, "A", 1), (3, 1, "B", 2)]
    # Remote-user rows of both sides meet at the extraction offset.
    (consolidated,) = remote.remotes()
    assert consolidated.name == "hq"
    assert (consolidated.log_received, consolidated.confirm_received) == (result.offset, result.offset)
    assert (consolidated.log_sent, consolidated.confirm_sent) == (0, 0)
    assert consolidated.peer_incarnation == hq.identity.incarnation
    assert (consolidated.address, consolidated.send_every) == ("hq@example.org", 600)
    mine = hq.remote("r1")
    assert (mine.log_send, mine.log_sent, mine.confirm_sent) == (result.offset,) * 3
    assert (mine.log_received, mine.confirm_received) == (0, 0)
    assert mine.peer_incarnation == result.incarnation and mine.public_key == keys.public_key
    # A new epoch both ways, so messages of an earlier copy are stale.
    assert mine.resend_count == consolidated.rereceive_count == 1
    assert mine.rereceive_count == consolidated.resend_count == 1
    # The remote captures its own changes, and nothing of the copy itself.
    assert remote.log_end() == 0
    app_connection(remote).execute("UPDATE customer SET name = 'n1 at r1' WHERE id = 1")
    remote.scan()
    (transaction,) = remote.read_log("hq", 0)
    assert transaction.origin == "r1" and transaction.ops[0].after == {"name": "n1 at r1"}
    remote.close()


def test_extracting_again_makes_a_new_incarnation(tmp_path, hq):
    first = hq.extract("r1", tmp_path / "a.db")
    second = hq.extract("r1", tmp_path / "b.db")
    assert first.incarnation != second.incarnation
    assert hq.remote("r1").peer_incarnation == second.incarnation
    assert hq.remote("r1").resend_count == 2


def test_keys_from_a_callback(tmp_path, hq):
    asked = []

    def make_keys(remote):
        asked.append(remote)
        return RemoteKeys(public_key=f"fieldsync-public {remote} X Y")

    hq.extract("r1", tmp_path / "r1.db", keys=make_keys)
    assert asked == ["r1"]
    assert hq.remote("r1").public_key == "fieldsync-public r1 X Y"
    with SiteDatabase.open(tmp_path / "r1.db") as remote:
        assert remote.identity.public_key == "fieldsync-public r1 X Y"


def test_no_secret_key_material_is_taken(tmp_path, hq):
    """A secret has no place in a site database: extraction takes the public
    key only (the agent writes the secret key to a file of its own)."""
    with pytest.raises(TypeError):
        RemoteKeys(public_key="fieldsync-public r1 X Y", secret=b"seed")  # type: ignore[call-arg]
    with pytest.raises(InvalidSetting, match="RemoteKeys or a callable"):
        hq.extract("r1", tmp_path / "r1.db", keys=b"raw seed bytes")
    assert not (tmp_path / "r1.db").exists()


def test_the_copy_gets_the_mode_sqlite_gives_a_new_database(tmp_path, hq):
    previous = os.umask(0o022)
    try:
        hq.extract("r1", tmp_path / "r1.db")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "r1.db").stat().st_mode) == 0o644


def test_extraction_refusals_leave_nothing_behind(tmp_path, hq):
    (tmp_path / "taken.db").write_bytes(b"")
    with pytest.raises(ExtractionError, match="exists already"):
        hq.extract("r1", tmp_path / "taken.db")
    with pytest.raises(ExtractionError, match="does not exist"):
        hq.extract("r1", tmp_path / "no" / "dir" / "r1.db")
    with pytest.raises(UnknownRemote):
        hq.extract("ghost", tmp_path / "ghost.db")
    remote = make_site(tmp_path, "rx", "remote")
    remote.add_remote("hq")
    with pytest.raises(WrongRole):
        remote.extract("hq", tmp_path / "rx2.db")
    remote.close()
    left = {p.name for p in tmp_path.iterdir()}
    assert not {"ghost.db", "rx2.db"} & left
    assert not [name for name in left if ".tmp" in name]


def _stream(site):
    row = site.remote("r1")
    return (row.log_send, row.log_sent, row.confirm_sent, row.resend_count, row.rereceive_count,
            row.log_received, row.peer_incarnation, row.public_key)


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_an_extraction_that_fails_or_is_interrupted_changes_nothing(tmp_path, hq, monkeypatch, failure):
    """The remote's current copy goes on working: no new keys, epochs or
    offsets at the consolidated, and no file."""
    import agent.site.sqlite.extract as extract_module

    first = hq.extract("r1", tmp_path / "r1.db")
    before = _stream(hq)
    copy_rows = extract_module._copy_rows

    def fail_after_the_first_table(copy, plan):  # type: ignore[no-untyped-def]
        if plan.info.name != "customer":
            raise failure("stopped in the middle of the copy")
        return copy_rows(copy, plan)

    monkeypatch.setattr(extract_module, "_copy_rows", fail_after_the_first_table)
    with pytest.raises((failure, ExtractionError)) as caught:
        hq.extract("r1", tmp_path / "again.db")
    assert type(caught.value) is failure  # not hidden behind a later error (Ctrl-C stays Ctrl-C)
    assert _stream(hq) == before and hq.remote("r1").peer_incarnation == first.incarnation
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("hq.db")) == ["r1.db"]


@pytest.mark.parametrize("hard_links", [True, False], ids=["hard links", "no hard links"])
def test_a_target_that_appears_during_the_extraction_changes_nothing(tmp_path, hq, monkeypatch, hard_links):
    """Nor is it overwritten where the file system has no hard links (FAT):
    the name is then given by a rename, after a check."""
    import agent.site.sqlite.extract as extract_module

    if not hard_links:
        def no_hard_links(source, target, **kwargs):  # type: ignore[no-untyped-def]
            raise PermissionError(errno.EPERM, "Operation not permitted", source)  # what Linux's vfat answers

        monkeypatch.setattr(os, "link", no_hard_links)
    before = _stream(hq)
    target = tmp_path / "r1.db"
    finish = extract_module._finish_remote

    def someone_else_writes_the_target(*args):  # type: ignore[no-untyped-def]
        finish(*args)
        target.write_bytes(b"theirs")

    monkeypatch.setattr(extract_module, "_finish_remote", someone_else_writes_the_target)
    with pytest.raises(ExtractionError, match="appeared while extracting"):
        hq.extract("r1", target)
    assert _stream(hq) == before and target.read_bytes() == b"theirs"
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_folder_that_cannot_be_flushed_fails_the_extraction_and_changes_nothing(tmp_path, hq, monkeypatch):
    """The name is made durable inside the transaction that switches the
    remote's row over: an fsync of the folder that fails is no longer
    ignored, and leaves the row and the folder as they were."""
    import agent.site.sqlite.extract as extract_module

    real_fsync_directory = extract_module.fsync_directory

    def failing_fsync_directory(directory):  # type: ignore[no-untyped-def]
        raise OSError(errno.EIO, "Input/output error", str(directory))

    monkeypatch.setattr(extract_module, "fsync_directory", failing_fsync_directory)
    before = _stream(hq)
    with pytest.raises(ExtractionError, match=f"cannot flush the folder {re.escape(str(tmp_path))} .*Input/output"):
        hq.extract("r1", tmp_path / "r1.db")
    assert _stream(hq) == before
    assert not (tmp_path / "r1.db").exists() and not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    monkeypatch.setattr(extract_module, "fsync_directory", real_fsync_directory)
    hq.extract("r1", tmp_path / "r1.db")  # works once the folder can be flushed
    assert _stream(hq) != before


def test_a_stream_that_moves_on_during_the_extraction_is_not_overwritten(tmp_path, hq, monkeypatch):
    """An agent running for hq handles a resend request of the remote's
    current copy while the new one is made: the new copy's epochs would no
    longer be above the old copy's, so the extraction gives up."""
    import agent.site.sqlite.extract as extract_module

    copy_rows = extract_module._copy_rows

    def resend_meanwhile(copy, plan):  # type: ignore[no-untyped-def]
        if plan.info.name == "customer":
            with connected(hq.path, isolation_level=None) as app:
                app.execute("UPDATE fieldsync_remote SET rereceive_count = rereceive_count + 1 WHERE name = 'r1'")
        return copy_rows(copy, plan)

    monkeypatch.setattr(extract_module, "_copy_rows", resend_meanwhile)
    before = _stream(hq)
    moved = (*before[:4], before[4] + 1, *before[5:])
    with pytest.raises(ExtractionError, match="asked for or was asked for a resend while it was extracted"):
        hq.extract("r1", tmp_path / "r1.db")
    assert _stream(hq) == moved
    assert not (tmp_path / "r1.db").exists() and not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_partial_index_on_an_unpublished_column_is_left_out(tmp_path, hq):
    with connected(hq.path) as app:
        app.execute("CREATE INDEX customer_flagged ON customer (name) WHERE balance > 100")
        app.execute("CREATE INDEX line_big ON line (sku) WHERE qty > 10")
    hq.extract("r1", tmp_path / "r1.db")
    with SiteDatabase.open(tmp_path / "r1.db") as remote:
        indexes = {row[0] for row in remote.connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "line_big" in indexes and "customer_flagged" not in indexes


ORDERS = "CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT NOT NULL, qty INTEGER, note TEXT)"


def test_extraction_while_an_application_writes_then_a_full_round(tmp_path):
    """A writer process keeps changing orders (inserts, updates, rows moving
    between regions, deletes) while r1 is extracted.  One round each way
    afterwards: r1 holds exactly hq's north rows, hq holds r1's changes,
    and neither side recorded a duplicate or a missing row."""
    hq = make_site(tmp_path, "hq", "consolidated", ORDERS)
    hq.create_publication("orders", [Article("orders", subscribe_by="region")])
    rng = random.Random(3)
    app = app_connection(hq)
    app.execute("BEGIN")
    for row_id in range(1, 3001):
        app.execute("INSERT INTO orders VALUES (?, ?, ?, ?)",
                    (row_id, rng.choice(["north", "south", "east"]), rng.randint(1, 9), f"order {row_id}"))
    app.execute("COMMIT")
    hq.add_remote("r1")
    hq.subscribe("r1", "orders", "north")
    context = multiprocessing.get_context("spawn")
    started, stop = context.Event(), context.Event()
    writer = context.Process(target=churn_orders, args=(hq.path, 9, started, stop))
    writer.start()
    try:
        assert started.wait(60)
        for _ in range(5):
            hq.scan()
            time.sleep(0.02)
        result = hq.extract("r1", tmp_path / "r1.db")
        time.sleep(0.3)
    finally:
        stop.set()
        writer.join(60)
    assert writer.exitcode == 0
    end = hq.scan()
    assert end > result.offset
    assert any(True for _ in hq.read_log("r1", result.offset)), "the writer did nothing after the extraction"

    r1 = SiteDatabase.open(tmp_path / "r1.db")
    replicate(hq, r1)
    assert r1.apply_errors() == ()
    assert table_rows(r1, "orders") == table_rows(hq, "orders", "WHERE region = 'north'")

    # r1 works offline, then sends its changes.
    north = [row[0] for row in table_rows(r1, "orders")]
    local = app_connection(r1)
    local.execute("BEGIN")
    local.execute("UPDATE orders SET qty = qty + 100 WHERE id = ?", (north[0],))
    local.execute("DELETE FROM orders WHERE id = ?", (north[1],))
    local.execute("UPDATE orders SET region = 'south' WHERE id = ?", (north[2],))
    local.execute("INSERT INTO orders VALUES (900001, 'north', 1, 'made at r1')")
    local.execute("COMMIT")
    applied = replicate(r1, hq)
    assert (applied.errors, applied.conflicts, applied.operations_applied) == (0, 0, 4)
    assert hq.apply_errors() == () and hq.conflicts() == ()
    hq_rows = {row[0]: row for row in table_rows(hq, "orders")}
    assert hq_rows[north[0]] == table_rows(r1, "orders", f"WHERE id = {north[0]}")[0]
    assert north[1] not in hq_rows
    assert hq_rows[north[2]][1] == "south"
    assert hq_rows[900001] == (900001, "north", 1, "made at r1")

    # Back to r1: no echo of its own changes, only the cleanup of the row it
    # moved out of its subset.
    result_back = replicate(hq, r1)
    assert result_back.operations_applied == 1
    assert r1.apply_errors() == ()
    assert table_rows(r1, "orders") == table_rows(hq, "orders", "WHERE region = 'north'")
    r1.close()
    hq.close()


@pytest.mark.parametrize("declared", ["", "TEXT", "INTEGER", "NUMERIC", "REAL"])
@pytest.mark.parametrize("value", [7, 7.0, "7", b"7", "seven"])
def test_the_copy_keeps_exactly_the_rows_the_log_reader_sends(tmp_path, declared, value):
    """The copy asks SQLite for candidate rows (IN, by the column's
    affinity), then keeps the rows whose value equals the subscription's as
    the log reader compares them: whatever the column's type and values."""
    from agent.site.extraction import PREFILTER_VALUES

    site = make_site(tmp_path, "hq", "consolidated", f"CREATE TABLE depot (id INTEGER PRIMARY KEY, zone {declared})")
    site.create_publication("zones", [Article("depot", subscribe_by="zone")])
    site.add_remote("r1")
    site.subscribe("r1", "zones", value)
    values = [7, 7.0, "7", b"7", "seven", "07", None, 8]
    app = app_connection(site)
    app.executemany("INSERT INTO depot VALUES (?, ?)", list(enumerate(values)))
    expected = [(number, stored) for number, stored in site.connection.execute("SELECT id, zone FROM depot")
                if stored is not None and stored == value]
    site.extract("r1", tmp_path / "r1.db")
    with connected(tmp_path / "r1.db") as copy:
        assert copy.execute("SELECT id, zone FROM depot ORDER BY id").fetchall() == expected
    # Too many values for the IN list: the same rows, every row tested.
    site.connection.executemany(
        "INSERT INTO fieldsync_subscription (remote, publication, value, created_at) VALUES ('r1', 'zones', ?, 'x')",
        [(f"other {number}",) for number in range(PREFILTER_VALUES)])
    site.extract("r1", tmp_path / "r1-again.db")
    with connected(tmp_path / "r1-again.db") as copy:
        assert copy.execute("SELECT id, zone FROM depot ORDER BY id").fetchall() == expected
    site.close()
