"""Applying a peer's transactions (agent.site.sqlite.apply.driver) where a SQLite
site is its own: decoded tuples, the remote's side, the fast path's
replay, a process killed mid-apply.  The consolidated's apply on both
backends (atomicity, errors, conflicts, key moves) is
tests/site/both/test_apply.py."""

from __future__ import annotations

import multiprocessing
import random
import shutil
import time

import pytest

from agent.site import ApplyRefused, SiteDatabase
from codec.ops import Operation, Transaction

from .applying import hq, ins, remote, txn, upd  # noqa: F401  (hq, remote: fixtures)
from .conftest import app_connection, table_rows
from .workers import apply_batch, crash_batch, crash_setup


def test_decoded_tuples_are_accepted(hq):
    """The message decoder hands over plain 5-tuples, not Operation values."""
    batch = [Transaction._trusted(3, "r1", (("customer", 1, (1,), None, {"id": 1, "region": "north"}),))]
    assert hq.apply("r1", batch, log_received=3).operations_applied == 1
    assert table_rows(hq, "customer") == [(1, None, "north", None, None, None)]


def test_a_remote_applies_what_the_consolidated_sends_as_is(remote):
    remote.apply("hq", [txn(5, ins(1, name="one"), ins(2, name="two"), origin="hq")], log_received=5)
    # Row 1 differs from what hq believes, but not through a local change
    # (a divergence): hq's values are taken as they are.
    result = remote.apply("hq", [txn(6, upd(1, {"name": "something else"}, {"name": "from hq"}),
                                     ins(2, name="hq two"), origin="hq")], log_received=6)
    assert result.conflicts == 0
    assert [row[:2] for row in table_rows(remote, "customer")] == [(1, "from hq"), (2, "hq two")]
    assert remote.conflicts() == ()
    (error,) = remote.apply_errors()
    assert error.problem.startswith("INSERT of an existing key: the row was overwritten")


def test_a_remote_does_not_capture_what_it_applies(remote):
    """Its only peer never receives its own changes back, so a remote's
    triggers skip the apply path's writes; the application's are captured
    as ever, also in a transaction committed while nothing is applied."""
    def captured():
        return remote.connection.execute("SELECT count(*) FROM fieldsync_capture").fetchone()[0]

    remote.apply("hq", [txn(5, ins(1, name="one"), ins(2, name="two"), origin="hq"),
                        txn(6, upd(1, {"name": "one"}, {"name": "uno"}), origin="hq")], log_received=6)
    assert captured() == 0 and remote.log_end() == 0
    app_connection(remote).execute("UPDATE customer SET name = 'local' WHERE id = 2")
    assert captured() == 1
    with pytest.raises(ApplyRefused):
        remote.apply("hq", [txn(9, ins(3, name="three"), origin="hq")], log_received=8)
    app_connection(remote).execute("INSERT INTO customer (id, name) VALUES (4, 'local')")
    assert captured() == 2
    assert remote.connection.execute("SELECT count(*) FROM fieldsync_applying").fetchone()[0] == 0
    assert [op.key for t in remote.read_log("hq", 0, remote.scan()) for op in t.ops] == [(2,), (4,)]


# --- crash in the middle of an apply ----------------------------------------------------

ITEM = "CREATE TABLE item (id INTEGER PRIMARY KEY, payload TEXT, n INTEGER NOT NULL)"
CRASH_ROWS = 40_000
CRASH_PER_TRANSACTION = 2_000


def crash_site(path):
    site = SiteDatabase.init(path, name="hq", role="consolidated")
    site.connection.execute(ITEM)
    crash_setup(site)
    return site


def snapshot(site):
    return (site.connection.execute("SELECT * FROM item ORDER BY id").fetchall(),
            site.remote("peer").log_received,
            site.connection.execute("SELECT commit_offset, origin FROM fieldsync_log ORDER BY 1").fetchall())


def test_kill_during_apply_leaves_all_or_nothing(tmp_path):
    """A child applies a large batch; the parent kills it (SIGKILL) at a
    random moment, several times.  Each time the database holds either the
    whole batch and the new log_received, or none of it and the old one."""
    template = crash_site(tmp_path / "template.db")
    before = snapshot(template)
    template.close()
    # The "all" state and how long an apply takes, measured on a copy.
    shutil.copy(tmp_path / "template.db", tmp_path / "full.db")
    full = SiteDatabase.open(tmp_path / "full.db")
    batch, log_received = crash_batch(5, CRASH_ROWS, CRASH_PER_TRANSACTION)
    started = time.perf_counter()
    full.apply("peer", batch, log_received=log_received)
    duration = time.perf_counter() - started
    after = snapshot(full)
    full.close()
    assert after[1] == log_received and len(after[0]) > len(before[0])

    context = multiprocessing.get_context("spawn")
    rng = random.Random(20260301)
    outcomes: list[str] = []
    # Six kills at random moments, then (a loaded machine can make every
    # one land after the commit) earlier and earlier ones until one lands
    # before it: the test proves something either way.
    factors = [rng.uniform(0.1, 1.3) for _ in range(6)] + [0.1 / 2 ** step for step in range(8)]
    for attempt, factor in enumerate(factors):
        if attempt >= 6 and "none" in outcomes:
            break
        path = tmp_path / f"crash{attempt}.db"
        shutil.copy(tmp_path / "template.db", path)
        ready, done = context.Event(), context.Event()
        child = context.Process(target=apply_batch,
                                args=(str(path), "peer", 5, CRASH_ROWS, CRASH_PER_TRANSACTION, ready, done))
        child.start()
        assert ready.wait(60), "the child never got ready"
        time.sleep(factor * duration)  # now and then after the commit
        child.kill()
        child.join()
        site = SiteDatabase.open(path)
        assert site.connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        state = snapshot(site)
        if state == before:
            outcomes.append("none")
        else:
            assert state == after, f"attempt {attempt}: a partial apply survived the crash"
            outcomes.append("all")
        # After the crash the batch applies (again) cleanly: nothing doubled.
        result = site.apply("peer", batch, log_received=log_received)
        assert result.errors == 0
        assert snapshot(site)[:2] == after[:2]
        site.close()
    assert "none" in outcomes, f"no kill landed mid-apply ({outcomes}); the test proved nothing"


@pytest.mark.parametrize("role", ["consolidated", "remote"])
def test_constraint_failures_in_runs_are_replayed_one_by_one(hq, remote, role):
    """The fast path skips a row that breaks a constraint (NOT NULL, a key
    taken by another row) and replays the run with every check: the other
    rows are applied, the bad ones recorded.  (A remote gives the moved row
    the key and drops the row there, recorded as well: the consolidated
    keeps the row it moved, see test_concurrent.)"""
    site = hq if role == "consolidated" else remote
    peer = "r1" if role == "consolidated" else "hq"

    def line(order_id, **values):
        return {"order_id": order_id, "line_no": 1, **values}

    inserts = [Operation.insert("line", (1, order_id), line(order_id, sku="s", qty=1)) for order_id in range(1, 101)]
    inserts[40] = Operation.insert("line", (1, 41), line(41, sku=None, qty=1))
    result = site.apply(peer, [txn(1, *inserts, origin=peer)], log_received=1)
    assert (result.operations_applied, result.errors) == (99, 1)
    updates = [Operation.update("line", (1, order_id), {"qty": 1}, {"qty": 2}) for order_id in range(1, 101)
               if order_id != 41]
    updates[10] = Operation.update("line", (1, 11), {"sku": "s"}, {"sku": None})
    updates[20] = Operation.update("line", (1, 21), {"order_id": 21}, {"order_id": 22})
    result = site.apply(peer, [txn(2, *updates, origin=peer)], log_received=2)
    assert (result.operations_applied, result.errors) == (97, 2)
    problems = [error.problem.split(":")[0] for error in site.apply_errors()]
    if role == "consolidated":
        assert problems == ["constraint failed"] * 3
        assert site.connection.execute("SELECT count(*), sum(qty) FROM line").fetchone() == (99, 97 * 2 + 2)
    else:
        assert problems == ["constraint failed"] * 2 + ["UPDATE onto a key held here"]
        assert site.connection.execute("SELECT count(*), sum(qty) FROM line").fetchone() == (98, 97 * 2 + 1)


def test_an_application_trigger_failing_stops_its_row_only(hq):
    """A table with triggers of the application's own at the consolidated:
    a row whose trigger breaks a constraint is recorded and not applied,
    the others are applied and their triggers run (the fast path does not
    turn the trigger's failure into a skipped statement)."""
    conn = hq.connection
    conn.execute("CREATE TABLE audit (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
    for event, image in (("INSERT", "NEW"), ("UPDATE", "NEW")):
        conn.execute(f"CREATE TRIGGER app_audit_{event.lower()} AFTER {event} ON customer BEGIN "
                     f"INSERT INTO audit (note) VALUES ({image}.name); END")
    inserts = [ins(row_id, name=None if row_id == 5 else f"n{row_id}") for row_id in range(1, 11)]
    result = hq.apply("r1", [txn(1, *inserts)], log_received=1)
    assert (result.operations_applied, result.errors) == (9, 1)
    updates = [upd(row_id, {"name": f"n{row_id}"}, {"name": None if row_id == 7 else f"m{row_id}"})
               for row_id in range(1, 11) if row_id != 5]
    result = hq.apply("r1", [txn(2, *updates)], log_received=2)
    assert (result.operations_applied, result.errors) == (8, 1)
    assert [error.key for error in hq.apply_errors()] == [(5,), (7,)]
    assert conn.execute("SELECT count(*) FROM audit").fetchone()[0] == 9 + 8
    assert table_rows(hq, "customer", "WHERE id = 7")[0][1] == "n7"
