"""Apply into a PostgreSQL consolidated (agent.site.postgres.apply): a
remote's inserts, updates and deletes with its log_received in one
transaction, replays, conflicts and their policies and hooks, apply
errors, key moves, the rows that go back to the origin, and the capture of
what was applied, with the peer as its origin.  The rules are the SQLite
consolidated's (tests/site/test_apply.py, test_conflicts.py,
test_concurrent.py, test_unconfirmed.py); what the remotes receive is read
from the capture table and the log as the SQLite site's reader selects it."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from agent.site import (ApplyRefused, Article, ConflictHookFailed, IncarnationMismatch, InvalidSetting, Resolution,
                        UnpublishableTable)
from agent.site.postgres.apply.lookups import PeerReader
from agent.site.postgres.apply.tables import Tables
from agent.site.postgres.log import iter_capture
from codec.ops import Operation, Run, Transaction

from ..conftest import decoded

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
LATER = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def ins(row_id, **values):
    return Operation.insert("customer", (row_id,), {"id": row_id, **values})


def upd(row_id, before, after):
    return Operation.update("customer", (row_id,), before, after)


def dele(row_id, **before):
    return Operation.delete("customer", (row_id,), {"id": row_id, **before})


def txn(commit, *ops, origin="r1"):
    # As the message decoder builds them, in both forms (tests/site/conftest.py: decoded).
    return decoded(Transaction._trusted(commit, origin, ops))


def rows(app, table: str = "customer") -> list[tuple]:
    return app.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()


def received(hq, subscriber: str, after: int) -> list[Operation]:
    """What ``subscriber`` receives of the log after ``after`` (cut first),
    read as the agent reads it (PostgresSite.read_log), rows written back
    to their origin included; the apply's own reader (PeerReader) selects
    the same."""
    conn = hq.connection
    end = hq.scan()
    ops = [op for transaction in hq.read_log(subscriber, after, end) for op in transaction.ops]
    reader = PeerReader(conn, Tables(), subscriber)
    expected: list = []
    for commit, origin, captured in iter_capture(conn, after, end):
        reader.extend(commit, origin, captured, expected)
    assert ops == expected
    return ops


@pytest.fixture
def sales(hq, app):
    """hq publishing customer by region; r1 and r2 subscribed to north."""
    hq.drop_publication("p")
    hq.create_publication("sales", [Article("customer", subscribe_by="region")])
    for remote in ("r1", "r2"):
        hq.add_remote(remote, now=NOW)
        hq.subscribe(remote, "sales", "north")
    return hq


# --- the batch and log_received --------------------------------------------------

def test_inserts_updates_and_deletes_of_a_remote_are_applied_with_its_log_received(sales, app):
    result = sales.apply("r1", [txn(5, ins(1, name="a", region="north", balance=1.5, photo=b"\x00\xff"),
                                    ins(2, name="b", region="north")),
                                txn(9, upd(1, {"name": "a", "balance": 1.5}, {"name": "A", "balance": 2.25}),
                                    dele(2, name="b"), ins(3, name="c", region="north"))],
                         log_received=10, messages=2, now=NOW)
    assert (result.transactions_applied, result.transactions_skipped, result.operations_applied) == (2, 0, 5)
    assert (result.conflicts, result.errors, result.log_commits) == (0, 0, ())
    assert rows(app) == [(1, "A", "north", 2.25, b"\x00\xff"), (3, "c", "north", None, None)]
    remote = sales.remote("r1")
    assert (remote.log_received, remote.receive_count, remote.last_received_at) == (10, 2, NOW)


def test_runs_are_applied_as_the_operations_they_stand_for(sales, app):
    run = Run("customer", 1, 1, (), ("id", "name", "region"), [(7, 7, "g", "north"), (8, 8, "h", "north")])
    result = sales.apply("r1", [txn(5, run, upd(7, {"name": "g"}, {"name": "G"}))], log_received=5)
    assert result.operations_applied == 3 and result.errors == 0
    assert rows(app) == [(7, "G", "north", None, None), (8, "h", "north", None, None)]


def test_runs_write_their_rows_in_their_order_a_row_changed_twice_included(sales, app):
    # A chunk goes by one statement joined to its table (PgTable.many_sql),
    # yet its capture rows come in the peer's order, whatever order the
    # table holds the rows in; a row changed twice in one run takes both.
    app.execute("INSERT INTO customer (id, name, region) SELECT g, 'n' || g, 'north' FROM generate_series(1, 40) g")
    start = sales.scan()
    sales.update_remote("r1", log_sent=start, confirm_sent=start)  # r1 holds the rows
    order = [17, 3, 40, 1, 25, 9, 33]
    updates = [upd(row_id, {"name": f"n{row_id}"}, {"name": f"m{row_id}"}) for row_id in order]
    twice = [upd(5, {"name": "n5"}, {"name": "x"}), upd(5, {"name": "x"}, {"name": "y"})]
    deletes = [dele(row_id, name=f"m{row_id}") for row_id in reversed(order)]
    result = sales.apply("r1", [txn(5, *updates, *twice), txn(6, *deletes)], log_received=6)
    assert (result.operations_applied, result.errors, result.conflicts) == (16, 0, 0)
    captured = app.execute("SELECT kind, v[1] FROM fieldsync.capture WHERE origin = 'r1' ORDER BY seq").fetchall()
    assert captured == [*((2, str(row_id)) for row_id in [*order, 5, 5]), *((3, str(row_id)) for row_id in reversed(order))]
    assert app.execute("SELECT name FROM customer WHERE id = 5").fetchone() == ("y",)
    assert app.execute("SELECT count(*) FROM customer").fetchone() == (33,)


def test_a_failure_in_the_middle_of_a_message_leaves_neither_its_rows_nor_log_received(sales, app):
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'hq', 'north')")
    sales.set_conflict_hook("customer", lambda conflict: 1 / 0)
    with pytest.raises(ConflictHookFailed, match="ZeroDivisionError"):
        sales.apply("r1", [txn(5, ins(2, name="b", region="north")),
                           txn(6, ins(3, name="c", region="north"), upd(1, {"name": "old"}, {"name": "r1"}))],
                    log_received=6)
    assert rows(app) == [(1, "hq", "north", None, None)]
    assert sales.remote("r1").log_received == 0 and sales.apply_errors() == () and sales.conflicts() == ()
    with pytest.raises(ApplyRefused, match="out of order"):
        sales.apply("r1", [txn(5, ins(2, name="b", region="north")), txn(5, ins(3))], log_received=6)
    assert rows(app) == [(1, "hq", "north", None, None)] and sales.remote("r1").log_received == 0
    assert app.execute("SELECT count(*) FROM fieldsync.capture WHERE origin = 'r1'").fetchone()[0] == 0


def test_a_replayed_message_applies_nothing_twice(sales, app):
    message = [txn(5, ins(1, name="a", region="north")), txn(6, upd(1, {"name": "a"}, {"name": "b"}))]
    sales.apply("r1", message, log_received=6)
    again = sales.apply("r1", message, log_received=6)
    assert (again.transactions_applied, again.transactions_skipped, again.operations_applied) == (0, 2, 0)
    # A message overlapping the last one: only what is new is applied.
    more = sales.apply("r1", [*message, txn(8, upd(1, {"name": "b"}, {"name": "c"}))], log_received=8)
    assert (more.transactions_applied, more.transactions_skipped) == (1, 2)
    assert rows(app) == [(1, "c", "north", None, None)] and sales.apply_errors() == () and sales.conflicts() == ()
    assert app.execute("SELECT count(*) FROM fieldsync.capture").fetchone()[0] == 3
    # skip_through below the recorded log_received applies again (the fault suite's unsafe setting).
    replay = sales.apply("r1", [txn(8, upd(1, {"name": "b"}, {"name": "c"}))], log_received=8, skip_through=6)
    assert replay.transactions_applied == 1 and replay.conflicts == 1


@pytest.mark.parametrize("call, error, words", [
    (dict(log_received=3), ApplyRefused, "would go back from 6 to 3"),
    (dict(log_received=9, skip_through=7), ApplyRefused, "skip_through 7"),
    (dict(log_received=9, messages=-1), InvalidSetting, "non-negative"),
    (dict(log_received=9, peer_incarnation=b"x"), InvalidSetting, "16 bytes"),
    (dict(log_received=9, peer_incarnation=bytes(range(1, 17))), IncarnationMismatch, "extract the remote again"),
])
def test_refused_batches_apply_nothing(sales, app, call, error, words):
    sales.apply("r1", [txn(6, ins(1, name="a", region="north"))], log_received=6, peer_incarnation=bytes(16))
    with pytest.raises(error, match=words):
        sales.apply("r1", [txn(8, ins(2, name="b", region="north"))], **call)
    assert rows(app) == [(1, "a", "north", None, None)] and sales.remote("r1").log_received == 6


def test_a_transaction_beyond_the_new_log_received_is_refused(sales, app):
    with pytest.raises(ApplyRefused, match="beyond the new log_received 6"):
        sales.apply("r1", [txn(5, ins(1)), txn(7, ins(2))], log_received=6)
    assert rows(app) == []


# --- capture of what was applied -------------------------------------------------

def test_applied_rows_are_captured_with_the_peer_as_origin_for_the_other_remotes(sales, app):
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'hq', 'north')")
    start = sales.scan()
    sales.update_remote("r1", log_sent=start, confirm_sent=start)  # r1 holds row 1
    sales.apply("r1", [txn(5, ins(2, name="b", region="north"), upd(1, {"name": "hq"}, {"name": "r1"}))],
                log_received=5)
    app.execute("INSERT INTO customer (id, name, region) VALUES (3, 'app', 'north')")
    captured = app.execute("SELECT origin, kind FROM fieldsync.capture ORDER BY seq").fetchall()
    assert captured == [(None, 1), ("r1", 1), ("r1", 2), (None, 1)]
    end = sales.scan()
    assert app.execute("SELECT commit_offset, origin FROM fieldsync.log WHERE commit_offset > %s"
                       " ORDER BY commit_offset", (start,)).fetchall() == [(start + 1, "r1"), (end, "hq")]
    # r2 gets r1's changes; r1 gets none of its own back, only the application's row.
    assert received(sales, "r2", start) == [ins(2, name="b", region="north", balance=None, photo=None),
                                            upd(1, {"name": "hq"}, {"name": "r1"}),
                                            ins(3, name="app", region="north", balance=None, photo=None)]
    assert received(sales, "r1", start) == [ins(3, name="app", region="north", balance=None, photo=None)]


# --- conflicts ---------------------------------------------------------------------

def conflict_setup(hq, app) -> int:
    """Row 1 is 'base' at r1, but the consolidated changed it meanwhile."""
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, 'base', 'north', 10.0)")
    start = hq.scan()
    app.execute("UPDATE customer SET name = 'hq edit', balance = 11.0 WHERE id = 1")
    hq.scan()
    hq.update_remote("r1", log_sent=start, confirm_sent=start)  # r1 holds the row as it was inserted
    return start


def test_a_conflict_is_recorded_resolved_incoming_by_default_and_goes_back_to_the_origin(sales, app):
    start = conflict_setup(sales, app)
    result = sales.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5, now=LATER)
    assert result.conflicts == 1 and result.errors == 0 and result.operations_applied == 1
    assert rows(app) == [(1, "r1 edit", "north", 11.0, None)]
    (conflict,) = sales.conflicts()
    assert (conflict.peer, conflict.peer_commit, conflict.table, conflict.key, conflict.at) == (
        "r1", 5, "customer", (1,), LATER)
    assert conflict.local_row == {"id": 1, "name": "hq edit", "region": "north", "balance": 11.0, "photo": None}
    assert conflict.incoming_before == {"name": "base"} and conflict.incoming_after == {"name": "r1 edit"}
    assert conflict.resolution == "incoming" and conflict.result_row["name"] == "r1 edit"
    # r1 gets hq's older change, then the columns of the conflict as they ended up.
    assert received(sales, "r1", start) == [upd(1, {"name": "base", "balance": 10.0},
                                                {"name": "hq edit", "balance": 11.0}),
                                            upd(1, {"name": "r1 edit"}, {"name": "r1 edit"})]
    # Everyone else gets the result once, as an ordinary update.
    assert received(sales, "r2", start)[-1] == upd(1, {"name": "hq edit"}, {"name": "r1 edit"})
    # What goes back to r1 says what hq had applied of r1 (through 5); no one else's says anything.
    assert [(t.origin, t.applied) for t in sales.read_log("r1", start)] == [("hq", None), ("r1", 5)]
    assert {t.applied for t in sales.read_log("r2", start)} == {None}


def test_rows_written_back_go_with_their_capture_rows_at_truncation(sales, app):
    conflict_setup(sales, app)
    sales.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    end = sales.scan()
    assert app.execute("SELECT peer, columns FROM fieldsync.returned").fetchall() == [("r1", ["name"])]
    for remote in ("r1", "r2"):
        sales.update_remote(remote, log_sent=end, confirm_sent=end)
    assert app.execute("SELECT applied FROM fieldsync.applied").fetchall() == [(5,)]
    assert sales.truncate_log() == end
    assert app.execute("SELECT count(*) FROM fieldsync.returned").fetchone()[0] == 0
    assert app.execute("SELECT count(*) FROM fieldsync.applied").fetchone()[0] == 0


def test_the_local_policy_keeps_the_row_and_sends_it_back(sales, app):
    start = conflict_setup(sales, app)
    sales.set_conflict_policy("customer", "local")
    assert sales.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5).conflicts == 1
    assert rows(app)[0][1] == "hq edit" and sales.conflicts()[0].resolution == "local"
    assert received(sales, "r1", start)[-1] == upd(1, {"name": "r1 edit"}, {"name": "hq edit"})
    assert [op for op in received(sales, "r2", start) if op.kind == 2][-1].after == {"name": "hq edit",
                                                                                      "balance": 11.0}
    sales.set_conflict_policy("public.customer", None)
    sales.apply("r1", [txn(6, upd(1, {"name": "r1 edit"}, {"name": "again"}))], log_received=6)
    assert rows(app)[0][1] == "again"


def test_conflict_policies_are_checked(sales):
    with pytest.raises(InvalidSetting, match="'incoming' or 'local'"):
        sales.set_conflict_policy("customer", "remote")
    with pytest.raises(UnpublishableTable, match="does not exist"):
        sales.set_conflict_policy("nowhere", "local")
    with pytest.raises(InvalidSetting, match="callable"):
        sales.set_conflict_hook("customer", "not a function")


def test_a_hook_can_merge_or_keep_the_local_row(sales, app):
    conflict_setup(sales, app)
    seen = []

    def merge(conflict):
        seen.append(conflict)
        return {"name": f"{conflict.local_row['name']} + {conflict.incoming.after['name']}"}

    sales.set_conflict_hook("customer", merge)
    sales.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert rows(app)[0][1] == "hq edit + r1 edit" and sales.conflicts()[0].resolution == "merged"
    assert (seen[0].peer, seen[0].peer_commit, seen[0].key, seen[0].local_row["balance"]) == ("r1", 5, (1,), 11.0)
    sales.set_conflict_hook("customer", None)
    sales.set_conflict_hook(None, lambda conflict: Resolution.LOCAL)
    sales.apply("r1", [txn(6, upd(1, {"name": "base"}, {"name": "r1 again"}))], log_received=6)
    assert rows(app)[0][1] == "hq edit + r1 edit" and sales.conflicts()[1].resolution == "local"


@pytest.mark.parametrize("hook, words", [
    (lambda conflict: "whatever", "not a Resolution"),
    (lambda conflict: {"nope": 1}, "bad value for column 'nope'"),
    (lambda conflict: {"balance": "lots"}, "cannot hold: column balance"),
])
def test_a_broken_hook_rolls_the_whole_message_back(sales, app, hook, words):
    conflict_setup(sales, app)
    sales.set_conflict_hook("customer", hook)
    with pytest.raises(ConflictHookFailed, match=words):
        sales.apply("r1", [txn(5, ins(2, name="new", region="north"), upd(1, {"name": "base"}, {"name": "x"}))],
                    log_received=5)
    assert [row[0] for row in rows(app)] == [1] and sales.remote("r1").log_received == 0


def test_an_insert_of_a_held_key_keeps_the_local_row_and_sends_it_back(sales, app):
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'hq row', 'north')")
    start = sales.scan()
    result = sales.apply("r1", [txn(5, ins(1, name="r1 row", region="north"))], log_received=5)
    assert result.errors == 1 and rows(app) == [(1, "hq row", "north", None, None)]
    assert sales.apply_errors()[0].problem == "INSERT of an existing key: the local row was kept and sent back to r1"
    whole = {"id": 1, "region": "north", "balance": None, "photo": None}
    assert received(sales, "r1", start) == [upd(1, {**whole, "name": "r1 row"}, {**whole, "name": "hq row"})]
    assert received(sales, "r2", start) == []


def test_a_delete_carries_no_check(sales, app):
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'changed here', 'north')")
    result = sales.apply("r1", [txn(5, dele(1, name="as r1 had it"))], log_received=5)
    assert (result.operations_applied, result.conflicts, result.errors) == (1, 0, 0) and rows(app) == []


# --- apply errors ----------------------------------------------------------------------

def test_values_the_columns_cannot_hold_are_recorded_and_the_rest_applies(sales, app):
    app.execute("CREATE TYPE mood AS ENUM ('ok', 'sad')")
    app.execute("CREATE TABLE kinds (id integer PRIMARY KEY, flag boolean, day date, code varchar(3),"
                " small smallint, m mood, amount numeric(6,2) CHECK (amount >= 0), note text NOT NULL DEFAULT '')")
    sales.add_article("sales", "kinds")

    def k(row_id, **values):
        return Operation.insert("kinds", (row_id,), {"id": row_id, **values})

    bad = [k(2, flag=2), k(3, day="2024-13-01"), k(4, code="abcdef"), k(5, small=99999), k(6, m="happy"),
           k(7, amount="-1"), k(8, note=None), k(9, flag="yes"), k(10, amount=1.5)]
    result = sales.apply("r1", [txn(5, k(1, flag=1, day="2024-02-29", code="abc", small=7, m="sad", amount="12.5"),
                                    *bad, k(11, note="fine")),
                                txn(6, Operation.insert("nowhere", (1,), {"id": 1}),
                                    Operation.insert("kinds", (12,), {"id": 12, "colour": "red"}),
                                    ("kinds", 1, (13,), None, {"id": [13]}), k(14))],
                         log_received=6)
    assert (result.operations_applied, result.errors) == (3, len(bad) + 3)
    assert app.execute("SELECT id, flag, day::text, code, small, m::text, amount::text FROM kinds ORDER BY id"
                       ).fetchall() == [(1, True, "2024-02-29", "abc", 7, "sad", "12.50"),
                                        (11, None, None, None, None, None, None),
                                        (14, None, None, None, None, None, None)]
    problems = {error.key: error.problem for error in sales.apply_errors()}
    assert problems[(2,)] == "value not convertible: column flag: expected 0 or 1 for a boolean column, got int 2"
    assert problems[(3,)].startswith("value not convertible: date/time field value out of range")
    assert problems[(4,)] == "value not convertible: value too long for type character varying(3)"  # never cut
    assert problems[(5,)] == 'value not convertible: value "99999" is out of range for type smallint'
    assert problems[(6,)].startswith('value not convertible: invalid input value for enum mood: "happy"')
    assert problems[(7,)].startswith('constraint failed: new row for relation "kinds" violates check constraint')
    assert problems[(8,)].startswith('constraint failed: null value in column "note"')
    assert problems[(10,)] == ("value not convertible: column amount: expected text for a numeric column, "
                               "got float 1.5")
    assert problems[(1,)] == "no published table 'nowhere' at this site"
    assert problems[(12,)] == "kinds has no column 'colour' at this site"
    assert problems[(13,)].startswith("malformed operation: after.id")
    (kept,) = [error for error in sales.apply_errors() if error.key == (3,)]
    assert (kept.peer, kept.peer_commit, kept.table, kept.kind) == ("r1", 5, "kinds", 1)
    assert kept.operation == ("kinds", 1, (3,), None, {"id": 3, "day": "2024-13-01"})
    assert sales.remote("r1").log_received == 6


def test_values_that_are_not_sqlite_values_are_recorded_as_malformed_among_good_rows(sales, app):
    """A bool, or an integer past 64 bits, in the middle of rows of one
    table and column list (one run of a version-2 message): those
    operations are recorded as malformed, as one by one, and the others
    of the run apply."""
    def plain(row_id, name):
        return ("customer", 1, (row_id,), None, {"id": row_id, "name": name, "region": "north"})

    result = sales.apply("r1", [txn(5, plain(20, "a"), plain(21, True), plain(2 ** 63, "c"), plain(23, "d"))],
                         log_received=5)
    assert (result.operations_applied, result.errors) == (2, 2)
    assert [row[:2] for row in rows(app)] == [(20, "a"), (23, "d")]
    problems = {error.key: error.problem for error in sales.apply_errors()}
    assert problems[(21,)] == "malformed operation: after.name: bool is not a SQLite value"
    assert problems[(2 ** 63,)].startswith("malformed operation: key: integer 9223372036854775808 is outside")


def test_updates_and_deletes_of_missing_rows_are_recorded(sales, app):
    result = sales.apply("r1", [txn(5, upd(1, {"name": "a"}, {"name": "b"}), dele(2))], log_received=5)
    assert result.errors == 2
    assert [error.problem for error in sales.apply_errors()] == ["UPDATE of a missing row", "DELETE of a missing row"]


def test_open_apply_errors_put_the_peer_in_error_until_acknowledged(sales, app):
    sales.apply("r1", [txn(5, upd(1, {"name": "a"}, {"name": "b"}), dele(2), dele(3))], log_received=5)
    assert sales.open_apply_errors() == {"r1": 3}
    first = sales.apply_errors()[0].id
    assert sales.acknowledge_apply_errors("r1", through=first, now=LATER) == 1
    assert sales.open_apply_errors() == {"r1": 2} and sales.apply_errors()[0].acknowledged_at == LATER
    assert sales.acknowledge_apply_errors("r1") == 2 and sales.open_apply_errors() == {}
    assert len(sales.apply_errors(after_id=first)) == 2
    with pytest.raises(InvalidSetting, match="apply error id"):
        sales.acknowledge_apply_errors("r1", through=-1)


def test_a_child_before_its_parent_waits_for_the_end_of_its_transaction(sales, app):
    app.execute("CREATE TABLE parent (id integer PRIMARY KEY)")
    app.execute("CREATE TABLE child (id integer PRIMARY KEY, parent integer REFERENCES parent)")
    sales.add_article("sales", "parent")
    sales.add_article("sales", "child")

    def row(table, row_id, **values):
        return Operation.insert(table, (row_id,), {"id": row_id, **values})

    result = sales.apply("r1", [txn(5, row("child", 1, parent=1), row("parent", 1)),
                                txn(6, row("child", 2, parent=99))], log_received=6)
    assert (result.operations_applied, result.errors) == (2, 1)
    assert rows(app, "child") == [(1, 1)] and rows(app, "parent") == [(1,)]
    assert sales.apply_errors()[0].problem.startswith('constraint failed: insert or update on table "child"')


# --- what goes back to the origin --------------------------------------------------

def test_a_row_the_remote_moves_out_of_its_subset_goes_back_as_a_delete(sales, app):
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'a', 'north')")
    start = sales.scan()
    sales.update_remote("r1", log_sent=start, confirm_sent=start)
    sales.apply("r1", [txn(5, upd(1, {"region": "north"}, {"region": "south"}))], log_received=5)
    assert received(sales, "r1", start) == [dele(1, name="a", region="south", balance=None, photo=None)]
    assert received(sales, "r2", start) == [dele(1, name="a", region="north", balance=None, photo=None)]


def test_the_unconfirmed_rule_sends_a_row_back_after_changes_on_their_way(sales, app):
    """hq changed row 1 after r1 last confirmed; r1's change of another
    column conflicts with nothing, but hq's change may reach r1 after it
    (and overwrite it there): the row goes back, after hq's change."""
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, 'a', 'north', 1.0)")
    start = sales.scan()
    sales.update_remote("r1", log_sent=start, confirm_sent=start)
    app.execute("UPDATE customer SET balance = 2.0 WHERE id = 1")  # not even cut yet
    result = sales.apply("r1", [txn(5, upd(1, {"name": "a"}, {"name": "r1"}))], log_received=5)
    assert result.conflicts == 0 and rows(app) == [(1, "r1", "north", 2.0, None)]
    assert received(sales, "r1", start) == [upd(1, {"balance": 1.0}, {"balance": 2.0}),
                                            upd(1, {"name": "r1"}, {"name": "r1"})]
    # Once r1 confirmed hq's change, nothing goes back.
    end = sales.log_end()
    sales.update_remote("r1", log_sent=end, confirm_sent=end)
    sales.apply("r1", [txn(6, upd(1, {"name": "r1"}, {"name": "r1 again"}))], log_received=6)
    assert received(sales, "r1", end) == []


def test_an_update_of_a_key_hq_moved_applies_where_the_row_is_now(sales, app):
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'a', 'north'), (2, 'b', 'north')")
    app.execute("UPDATE customer SET id = 100 WHERE id = 1")
    app.execute("UPDATE customer SET id = 200 WHERE id = 100")
    result = sales.apply("r1", [txn(5, upd(1, {"name": "a"}, {"name": "moved"}), dele(2, name="b"))],
                         log_received=5)
    assert (result.operations_applied, result.errors) == (2, 0)
    assert rows(app) == [(200, "moved", "north", None, None)]
    sales.apply("r1", [txn(6, dele(1, name="moved"))], log_received=6)
    assert rows(app) == []


def test_a_move_onto_a_key_hq_holds_is_refused_and_both_rows_go_back(sales, app):
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'a', 'north'), (2, 'hq two', 'north')")
    start = sales.scan()
    sales.update_remote("r1", log_sent=start, confirm_sent=start)
    result = sales.apply("r1", [txn(5, upd(1, {"id": 1}, {"id": 2}))], log_received=5)
    assert result.errors == 1 and sales.apply_errors()[0].problem.startswith("constraint failed: duplicate key")
    assert rows(app) == [(1, "a", "north", None, None), (2, "hq two", "north", None, None)]
    back = received(sales, "r1", start)
    assert ins(1, name="a", region="north", balance=None, photo=None) in back
    assert upd(2, {"id": 2, "name": "a", "region": "north", "balance": None, "photo": None},
               {"id": 2, "name": "hq two", "region": "north", "balance": None, "photo": None}) in back
