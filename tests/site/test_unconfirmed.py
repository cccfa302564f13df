"""The unconfirmed rule at the consolidated (docs/site-database.md,
"Concurrent changes"): which rows a remote's batch sends back when the
consolidated's log holds operations the remote receives and has not
confirmed, found through the capture table's key indexes, in rows in and
out of the remote's subset, deletes, key changes, several tables, keys of
several columns, NULL keys and rows of an older shape; what that costs as
the unconfirmed stretch grows; and a database of the previous layout."""

from __future__ import annotations

import json
import sqlite3

import pytest

from agent.site import Article, SiteDatabase
from agent.site.sqlite.schema import SCHEMA_VERSION
from codec.ops import Operation, Transaction

from .conftest import ORDERS, app_connection, make_site, table_rows
from .test_concurrent import confirm, deliver, send, write

LINE = ("CREATE TABLE line (order_id INTEGER NOT NULL, line_no INTEGER NOT NULL, sku TEXT, qty INTEGER,"
        " PRIMARY KEY (line_no, order_id)) WITHOUT ROWID")
# A key that is not an INTEGER PRIMARY KEY of a rowid table may hold NULL.
TAG = "CREATE TABLE tag (code TEXT PRIMARY KEY, label TEXT, n INTEGER)"


def build(root, *, orders: int = 12, others: int = 0) -> tuple[SiteDatabase, SiteDatabase]:
    """hq with orders (SUBSCRIBE BY region), line and tag, and r1 (north)
    made by extraction.  Orders 3, 6, 9, 12 are north, 1, 4, 7, 10 south,
    the rest east; lines (1, n) and (2, n) exist for every order n; tags
    NULL, 'a' and 'b'.  ``others`` east orders are added after id 1000."""
    hq = make_site(root, "hq", "consolidated", ORDERS, LINE, TAG)
    hq.create_publication("orders", [Article("orders", subscribe_by="region")])
    hq.create_publication("goods", [Article("line"), Article("tag")])
    app = app_connection(hq)
    app.execute("BEGIN")
    for row_id in range(1, orders + 1):
        app.execute("INSERT INTO orders VALUES (?, ?, 1, 'seed')", (row_id, ["north", "south", "east"][row_id % 3]))
        app.executemany("INSERT INTO line VALUES (?, ?, 'sku', 1)", [(row_id, 1), (row_id, 2)])
    app.executemany("INSERT INTO orders VALUES (?, 'east', 1, 'other')",
                    [(1000 + index,) for index in range(others)])
    app.executemany("INSERT INTO tag VALUES (?, 'seed', 1)", [(None,), ("a",), ("b",)])
    app.execute("COMMIT")
    app.close()
    hq.add_remote("r1")
    hq.subscribe("r1", "orders", "north")
    hq.subscribe("r1", "goods")
    hq.extract("r1", root / "r1.db")
    return hq, SiteDatabase.open(root / "r1.db")


@pytest.fixture
def sites(tmp_path):
    hq, r1 = build(tmp_path)
    yield hq, r1
    hq.close()
    r1.close()


def sent_back(hq: SiteDatabase, r1: SiteDatabase, at_hq: list[str], at_r1: list[str], *,
              converges: bool = True) -> list[Operation]:
    """hq writes ``at_hq`` and sends it (r1 has not received it), r1 writes
    ``at_r1`` and its change reaches hq: what hq's log then holds for r1,
    that is the rows the batch sends back to it.  Then everything arrives
    and (unless ``converges`` is false) the two sites agree."""
    if at_hq:
        write(hq, *at_hq)
    on_its_way = send(hq, r1)
    write(r1, *at_r1)
    start = hq.scan()
    deliver(hq, r1, send(r1, hq))
    ops = [op for transaction in hq.read_log("r1", start) for op in transaction.ops]
    deliver(r1, hq, on_its_way)
    deliver(r1, hq, send(hq, r1))
    confirm(hq, r1)
    for table, where in (("orders", "WHERE region = 'north'"), ("line", ""), ("tag", "")):
        assert not converges or table_rows(r1, table) == table_rows(hq, table, where), table
    return ops


def test_rows_in_and_out_of_the_subset(sites):
    """Row 3 (north) changed at hq goes back after r1's change; row 6 moved
    out of r1's subset reaches r1 as a DELETE, so nothing goes back; row 9
    has nothing on its way; row 5 (east) changed at hq is not r1's."""
    hq, r1 = sites
    ops = sent_back(hq, r1, ["UPDATE orders SET qty = 50 WHERE id IN (3, 5)",
                             "UPDATE orders SET region = 'east' WHERE id = 6"],
                    ["UPDATE orders SET note = 'r1' WHERE id IN (3, 6, 9)"])
    assert ops == [Operation.update("orders", (3,), {"note": "r1"}, {"note": "r1"})]
    assert table_rows(hq, "orders", "WHERE id IN (3, 6, 9)") == [
        (3, "north", 50, "r1"), (6, "east", 1, "r1"), (9, "north", 1, "r1")]


def test_a_change_outside_the_subset_on_its_way_sends_nothing(sites):
    """Only operations r1 receives count: hq's change of an east row does
    not send r1's change of a north row with another key back."""
    hq, r1 = sites
    assert sent_back(hq, r1, ["UPDATE orders SET qty = 50 WHERE id = 5"],
                     ["UPDATE orders SET note = 'r1' WHERE id = 3"]) == []


def test_nothing_goes_back_when_nothing_is_on_its_way(sites):
    hq, r1 = sites
    assert sent_back(hq, r1, [], ["UPDATE orders SET note = 'r1' WHERE id = 3"]) == []


def test_deletes(sites):
    """hq deleted row 3 (r1's UPDATE of it is an error, both end without
    it); r1 deleted row 6 that hq changed: the UPDATE on its way misses at
    r1, which holds no row 6 any more, so nothing goes back (a DELETE would
    only miss as well)."""
    hq, r1 = sites
    ops = sent_back(hq, r1, ["DELETE FROM orders WHERE id = 3", "UPDATE orders SET qty = 50 WHERE id = 6"],
                    ["UPDATE orders SET note = 'r1' WHERE id = 3", "DELETE FROM orders WHERE id = 6"])
    assert ops == []
    assert table_rows(hq, "orders", "WHERE id IN (3, 6)") == []
    assert len(r1.apply_errors()) == 0


def test_several_tables_and_keys_of_several_columns(sites):
    """Line (1, 3) and order 3 go back; line (1, 9) shares its first key
    column with (1, 3) and line (2, 3) its second, and neither has
    anything on its way."""
    hq, r1 = sites
    ops = sent_back(hq, r1, ["UPDATE line SET qty = 5 WHERE line_no = 1 AND order_id = 3",
                             "UPDATE orders SET qty = 50 WHERE id = 3"],
                    ["UPDATE line SET sku = 'r1' WHERE line_no = 1 AND order_id IN (3, 9)",
                     "UPDATE line SET sku = 'r1' WHERE line_no = 2 AND order_id = 3",
                     "UPDATE orders SET note = 'r1' WHERE id = 3"])
    assert sorted(ops) == sorted([Operation.update("line", (1, 3), {"sku": "r1"}, {"sku": "r1"}),
                                  Operation.update("orders", (3,), {"note": "r1"}, {"note": "r1"})])


def test_key_changes(sites):
    """hq moved order 3 to key 30 and line (1, 9) to (1, 90): r1's changes
    of the old keys apply to the rows under their new keys.  r1 applies the
    moves to its changed rows, keeping its values, after its changes: the
    columns r1 wrote go back under the new keys."""
    hq, r1 = sites
    ops = sent_back(hq, r1, ["UPDATE orders SET id = 30 WHERE id = 3",
                             "UPDATE line SET order_id = 90 WHERE line_no = 1 AND order_id = 9"],
                    ["UPDATE orders SET note = 'r1' WHERE id = 3",
                     "UPDATE line SET sku = 'r1' WHERE line_no = 1 AND order_id = 9"])
    assert sorted(ops) == sorted([Operation.update("orders", (30,), {"note": "r1"}, {"note": "r1"}),
                                  Operation.update("line", (1, 90), {"sku": "r1"}, {"sku": "r1"})])
    assert table_rows(hq, "orders", "WHERE id IN (3, 30)") == [(30, "north", 1, "r1")]
    assert table_rows(hq, "line", "WHERE order_id IN (9, 90) AND line_no = 1") == [(90, 1, "r1", 1)]
    assert hq.apply_errors() == () and hq.conflicts() == ()


@pytest.mark.parametrize("table", ["orders", "line"])
def test_a_key_change_on_its_way_to_the_key_the_remote_inserts(sites, table):
    """hq moved a row to a new key (order 6 to 33, line (1, 3) to (1, 30))
    and r1 inserted that key meanwhile: an existing key at hq, whose row
    goes back whole.  r1 drops its row when it applies the move."""
    hq, r1 = sites
    if table == "orders":
        ops = sent_back(hq, r1, ["UPDATE orders SET id = 33 WHERE id = 6"],
                        ["INSERT INTO orders VALUES (33, 'north', 7, 'r1')"])
        assert ops == [Operation.update("orders", (33,), {"id": 33, "region": "north", "qty": 7, "note": "r1"},
                                        {"id": 33, "region": "north", "qty": 1, "note": "seed"})]
    else:
        ops = sent_back(hq, r1, ["UPDATE line SET order_id = 30 WHERE line_no = 1 AND order_id = 3"],
                        ["INSERT INTO line VALUES (30, 1, 'r1', 9)"])
        assert ops == [Operation.update("line", (1, 30), {"order_id": 30, "line_no": 1, "sku": "r1", "qty": 9},
                                        {"order_id": 30, "line_no": 1, "sku": "sku", "qty": 1})]


def test_null_in_a_key(sites):
    """A row whose key is NULL is matched like any other (SQLite's IS): the
    NULL row goes back, 'a' (not changed by r1) and 'b' (nothing on its
    way) do not."""
    hq, r1 = sites
    ops = sent_back(hq, r1, ["UPDATE tag SET n = 2 WHERE code IS NULL", "UPDATE tag SET n = 3 WHERE code = 'a'"],
                    ["UPDATE tag SET label = 'r1' WHERE code IS NULL OR code = 'b'"])
    assert ops == [Operation.update("tag", (None,), {"label": "r1"}, {"label": "r1"})]
    assert table_rows(hq, "tag") == [(None, "r1", 2), ("a", "seed", 3), ("b", "r1", 1)]


def test_rows_captured_before_a_change_of_the_table(sites):
    """hq's operation on its way was captured with the table's previous
    shape; after both sites add a column, r1's change still finds it."""
    hq, r1 = sites
    write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
    hq.scan()
    for site in (hq, r1):
        write(site, "ALTER TABLE orders ADD COLUMN extra TEXT")
    ops = sent_back(hq, r1, [], ["UPDATE orders SET note = 'r1' WHERE id = 3"])
    assert ops == [Operation.update("orders", (3,), {"note": "r1"}, {"note": "r1"})]
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 50, "r1", None)]


def test_a_conflict_and_the_rule_on_one_row(sites):
    """A row with a conflict, which the rule would send back too, goes back
    once, as one UPDATE (of qty, the column r1 wrote); row 9, with nothing
    on its way, does not go back."""
    hq, r1 = sites
    ops = sent_back(hq, r1, ["UPDATE orders SET qty = 50, note = 'hq' WHERE id = 3"],
                    ["UPDATE orders SET qty = 7 WHERE id = 3", "UPDATE orders SET note = 'r1' WHERE id = 9"])
    assert ops == [Operation.update("orders", (3,), {"qty": 7}, {"qty": 7})]
    assert len(hq.conflicts()) == 1


def test_keys_no_row_can_hold_are_recorded_and_the_rule_goes_on(sites):
    """An operation whose key is beyond 64 bits or of the wrong length is
    an error; the rest of the batch, and the rule, go on."""
    hq, r1 = sites
    write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
    send(hq, r1)
    start = hq.scan()
    batch = [Transaction._trusted(1, "r1", (
        ("orders", 2, (2**70,), {"note": "seed"}, {"note": "r1"}),
        ("orders", 2, (3, 1), {"note": "seed"}, {"note": "r1"}),
        ("orders", 2, (3,), {"note": "seed"}, {"note": "r1"})))]
    result = hq.apply("r1", batch, log_received=1)
    assert (result.operations_applied, result.errors) == (1, 2)
    assert [op for transaction in hq.read_log("r1", start) for op in transaction.ops] == [
        Operation.update("orders", (3,), {"note": "r1"}, {"note": "r1"})]


# --- cost -----------------------------------------------------------------------------


def vm_steps(site: SiteDatabase, action) -> int:
    """SQLite virtual-machine instructions (in hundreds) ``action`` runs on
    the site's connection: a measure of work that does not depend on the
    machine's load."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    site.connection.set_progress_handler(count, 100)
    try:
        action()
    finally:
        site.connection.set_progress_handler(None, 0)
    return steps


def apply_with_a_stretch(root, stretch: int) -> tuple[int, int]:
    """A batch of 25 UPDATEs from r1, 10 of them of rows hq changed, applied
    while hq's log holds ``stretch`` operations r1 has not confirmed (the
    other rows are east orders, which r1 does not receive; it does receive
    hq's changes).  Returns the SQLite work of the apply and the number of
    rows sent back."""
    root.mkdir()
    hq, r1 = build(root, orders=75, others=stretch)
    try:
        start = hq.log_end()
        app = app_connection(hq)
        for first in range(1000, 1000 + stretch, 500):
            app.execute("UPDATE orders SET qty = qty + 1 WHERE id >= ? AND id < ?", (first, first + 500))
            hq.scan()
        app.execute("UPDATE orders SET qty = 50 WHERE id <= 30 AND region = 'north'")
        app.close()
        end = hq.scan()
        assert end - start >= stretch
        hq.update_remote("r1", log_sent=end)
        ops = tuple(Operation.update("orders", (row_id,), {"note": "seed"}, {"note": "r1"})
                    for row_id in range(3, 76, 3))
        steps = vm_steps(hq, lambda: hq.apply("r1", [Transaction(1, "r1", ops)], log_received=1))
        return steps, sum(len(transaction.ops) for transaction in hq.read_log("r1", end))
    finally:
        hq.close()
        r1.close()


def test_the_rule_costs_the_same_however_long_the_unconfirmed_stretch(tmp_path):
    """From 200 to 40,000 unconfirmed operations of other rows, the work of
    the batch in SQLite stays the same (within the depth of a B-tree)."""
    short, sent_short = apply_with_a_stretch(tmp_path / "short", 200)
    long, sent_long = apply_with_a_stretch(tmp_path / "long", 40_000)
    assert sent_short == sent_long == 10
    assert long < short * 1.2, (short, long)


def apply_after_own_transactions(root, count: int) -> int:
    """The SQLite work of a batch of 24 UPDATEs from r1 when hq's log holds,
    after what r1 confirmed, ``count`` transactions of r1's own alone,
    applied 10 at a time, as they came."""
    root.mkdir()
    hq, r1 = build(root, orders=75)
    try:
        own = [Transaction(commit, "r1", (Operation.update("orders", (12,), {"qty": commit}, {"qty": commit + 1}),))
               for commit in range(1, count + 1)]
        for start in range(0, count, 10):
            hq.apply("r1", own[start:start + 10], log_received=own[min(start + 10, count) - 1].commit)
        ops = tuple(Operation.update("orders", (row_id,), {"note": "seed"}, {"note": "r1"})
                    for row_id in range(3, 76, 3) if row_id != 12)
        steps = vm_steps(hq, lambda: hq.apply("r1", [Transaction(count + 1, "r1", ops)], log_received=count + 1))
        assert list(hq.read_log("r1", hq.remote("r1").confirm_sent)) == []
        return steps
    finally:
        hq.close()
        r1.close()


def test_a_long_run_of_the_remotes_own_transactions_is_not_read_again(tmp_path):
    """Whether the rule applies at all does not cost a read of the remote's
    own unconfirmed transactions at every batch: 2,000 of them cost what
    10 do."""
    long = apply_after_own_transactions(tmp_path / "long", 2000)
    short = apply_after_own_transactions(tmp_path / "short", 10)
    assert long < short * 1.2, (short, long)


# --- a database of the previous layout ------------------------------------------------------


def test_every_shape_has_its_key_indexes_at_the_consolidated_only(sites):
    hq, r1 = sites
    write(hq, "ALTER TABLE line ADD COLUMN note TEXT")
    hq.scan()
    indexes = dict(hq.connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"
                                         " AND name LIKE 'fieldsync_capture_%'").fetchall())
    shapes = {shape_id: json.loads(columns) for shape_id, columns in
              hq.connection.execute("SELECT id, columns FROM fieldsync_shape WHERE table_name = 'line'")}
    assert len(shapes) == 2 and len(indexes) == 2 * 4
    for shape_id, columns in shapes.items():
        # line's key is (line_no, order_id): value columns 1 and 0, and 1 + width and width for the new key.
        width = len(columns)
        assert indexes[f"fieldsync_capture_key_{shape_id}"].endswith(f"(v1, v0) WHERE shape = {shape_id}")
        assert f"(v{width + 1}, v{width}) WHERE shape = {shape_id} AND kind = 2" in \
            indexes[f"fieldsync_capture_moved_{shape_id}"]
    assert r1.connection.execute("SELECT count(*) FROM sqlite_master WHERE type = 'index'"
                                 " AND name LIKE 'fieldsync_capture_%'").fetchone()[0] == 0


def triggers(site: SiteDatabase) -> list[str]:
    return [sql for (sql,) in site.connection.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'"
                                                      " ORDER BY name")]


def test_a_database_of_the_previous_layout_is_upgraded_when_opened(tmp_path):
    """Layout 1 had no key indexes on the capture table and capture triggers
    with a plain INSERT: opening it adds the indexes for every shape and
    turns the triggers' INSERT into INSERT OR FAIL at the consolidated
    (nothing at a remote), then adds layout 3's table of replaced copies,
    rebuilds the site row without layout 4's secret column, records layout
    4, and the rule works as before."""
    hq, r1 = build(tmp_path)
    write(hq, "ALTER TABLE orders ADD COLUMN extra TEXT")
    hq.scan()  # a second shape of orders
    write(hq, "ALTER TABLE tag RENAME COLUMN label TO title")  # SQLite rewrites the triggers' text
    hq.scan()
    current = {name: triggers(site) for name, site in (("hq", hq), ("r1", r1))}
    for site in (hq, r1):
        site.close()
    for name in ("hq", "r1"):
        conn = sqlite3.connect(tmp_path / f"{name}.db")
        for (index,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'"
                                     " AND name LIKE 'fieldsync_capture_%'").fetchall():
            conn.execute(f'DROP INDEX "{index}"')
        for trigger, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f'DROP TRIGGER "{trigger}"')
            conn.execute(sql.replace("INSERT OR FAIL INTO fieldsync_capture", "INSERT INTO fieldsync_capture"))
        conn.execute("DROP TABLE fieldsync_replaced_copy")
        conn.execute("UPDATE fieldsync_site SET schema_version = 1")
        conn.commit()
        conn.close()
    hq, r1 = SiteDatabase.open(tmp_path / "hq.db"), SiteDatabase.open(tmp_path / "r1.db")
    try:
        shapes = hq.connection.execute("SELECT count(*) FROM fieldsync_shape").fetchone()[0]
        assert shapes == 5

        def key_indexes(site: SiteDatabase) -> int:
            return site.connection.execute("SELECT count(*) FROM sqlite_master WHERE type = 'index'"
                                           " AND name LIKE 'fieldsync_capture_%'").fetchone()[0]

        assert key_indexes(hq) == 2 * shapes and key_indexes(r1) == 0
        assert triggers(hq) == current["hq"] and len(current["hq"]) == 9
        assert all("INSERT OR FAIL INTO fieldsync_capture" not in sql for sql in triggers(r1))
        for site in (hq, r1):
            assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] \
                == SCHEMA_VERSION == 16
            assert site.replaced_incarnations("r1") == frozenset()
        write(r1, "ALTER TABLE orders ADD COLUMN extra TEXT")
        ops = sent_back(hq, r1, ["UPDATE orders SET qty = 50 WHERE id = 3"],
                        ["UPDATE orders SET note = 'r1' WHERE id = 3"])
        assert ops == [Operation.update("orders", (3,), {"note": "r1"}, {"note": "r1"})]
        # The upgraded triggers capture as before (the renamed column too).
        start = hq.scan()
        write(hq, "UPDATE tag SET title = 'renamed' WHERE code = 'a'", "DELETE FROM orders WHERE id = 9")
        assert [op for transaction in hq.read_log("r1", start, hq.scan()) for op in transaction.ops] == [
            Operation.update("tag", ("a",), {"title": "seed"}, {"title": "renamed"}),
            Operation.delete("orders", (9,), {"id": 9, "region": "north", "qty": 1, "note": "seed", "extra": None})]
    finally:
        hq.close()
        r1.close()


@pytest.mark.parametrize("role", ["consolidated", "remote"])
def test_a_key_of_the_wrong_length_is_an_error_on_the_slow_path_too(sites, role):
    """After an INSERT of an existing key the batch is replayed one operation
    at a time; a key of the wrong length there is recorded as an error, and
    the rest of the batch goes on (one bad row must not stop the stream)."""
    hq, r1 = sites
    site, peer = (hq, "r1") if role == "consolidated" else (r1, "hq")
    existing = table_rows(site, "orders")[0]
    row = dict(zip(("id", "region", "qty", "note"), existing))
    commit = site.remote(peer).log_received + 1
    batch = [Transaction._trusted(commit, peer, (
        ("orders", 1, (row["id"],), None, row),
        ("orders", 1, (9001, 1), None, {"id": 9001, "region": "north", "qty": 1, "note": "two-value key"}),
        ("orders", 1, (row["id"], 7), None, row),  # the slow path would look this key up
        ("orders", 3, (row["id"], 2), {}, None),
        ("orders", 1, (9002,), None, {"id": 9002, "region": "north", "qty": 2, "note": "fine"})))]
    result = site.apply(peer, batch, log_received=commit)
    # The consolidated keeps its row against the INSERT of an existing key (an
    # error); a remote that holds that very row counts it applied.
    assert (result.errors, result.operations_applied) == ((4, 1) if role == "consolidated" else (3, 2))
    assert [r for r in table_rows(site, "orders") if r[0] == 9002] == [(9002, "north", 2, "fine")]
    assert not [r for r in table_rows(site, "orders") if r[0] == 9001]
    problems = [error.problem for error in site.apply_errors()]
    assert sum("key has 2 values" in problem for problem in problems) == 3, problems
