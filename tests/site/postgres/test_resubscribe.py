"""Subscription changes of an extracted remote through its stream at a
PostgreSQL consolidated (agent/site/postgres/resubscribe.py, the cut's part
in log.py): docs/postgres.md, "Changing a remote's subscriptions"."""

from __future__ import annotations

import threading
import time

import pytest

from agent.site import Article
from agent.site.errors import InvalidSetting
from agent.site.postgres.connect import connect
from codec.ops import OpKind

REGIONS = ("north", "south", "east")


@pytest.fixture
def orders(hq, app):
    """hq with publication sales: orders by region (ids 1..30: 1 north, 2
    south, 3 east, 4 north, ...); r1 subscribes to north, r2 to south, both
    extracted."""
    app.execute("CREATE TABLE orders (id integer PRIMARY KEY, region text, qty integer)")
    app.execute("INSERT INTO orders SELECT i, (ARRAY['north', 'south', 'east'])[(i - 1) % 3 + 1], 0"
                " FROM generate_series(1, 30) AS i")
    hq.create_publication("sales", [Article("orders", subscribe_by="region")])
    for number, region in ((1, "north"), (2, "south")):
        hq.add_remote(f"r{number}", address=f"inbox/r{number}")
        hq.subscribe(f"r{number}", "sales", region)
        hq.update_remote(f"r{number}", peer_incarnation=bytes([number]) * 16)  # as extraction records it
    return hq


def ops(transactions) -> list[tuple]:  # type: ignore[no-untyped-def]
    return [(transaction.commit, op.kind, op.key) for transaction in transactions for op in transaction.ops]


def keys(region: str) -> list[tuple[int]]:
    return [(key,) for key in range(REGIONS.index(region) + 1, 31, 3)]


def test_a_subscription_added_then_ended_reaches_that_remote_alone_each_span_with_its_subset(orders, app):
    hq = orders
    start = hq.scan()
    added = hq.subscribe("r1", "sales", "east")
    assert (added.inserts, added.deletes, added.streamed, added.matching) == (10, 0, True, 10)
    assert added.offset is not None and added.offset > start
    app.execute("UPDATE orders SET qty = 5 WHERE id = 3")  # east: r1 now gets it
    ended = hq.unsubscribe("r1", "sales", "east")
    assert (ended.inserts, ended.deletes) == (0, 10) and ended.offset > added.offset
    app.execute("UPDATE orders SET qty = 6 WHERE id = 3")  # east again: no longer for r1
    app.execute("UPDATE orders SET qty = 6 WHERE id = 1")  # north
    last = hq.scan()
    read = ops(hq.read_log("r1", start))
    assert [op for op in read if op[2] != (3,) or op[1] != OpKind.UPDATE] == (
        [(added.offset, OpKind.INSERT, key) for key in keys("east")]
        + [(ended.offset, OpKind.DELETE, key) for key in keys("east")]
        + [(last, OpKind.UPDATE, (1,))])
    # Its one UPDATE of row 3 lies between the INSERTs and the DELETEs.
    [update] = [op for op in read if op[2] == (3,) and op[1] == OpKind.UPDATE]
    assert added.offset < update[0] < ended.offset
    assert ops(hq.read_log("r2", start)) == []  # nobody else gets the rows
    # One pass for several subscribers selects what each reads alone.
    fanned: dict[int, list] = {0: [], 1: []}
    for index, transaction in hq.read_logs([("r1", start, None), ("r2", start, None)]):
        fanned[index].append(transaction)
    assert ops(fanned[0]) == read and fanned[1] == []
    spans = hq.connection.execute("SELECT value_text, since, until FROM fieldsync.subscription WHERE remote = 'r1'"
                                  " ORDER BY id").fetchall()
    assert spans[0] == ("north", 0, None)
    assert spans[1][0] == "east" and start < spans[1][1] <= added.offset and spans[1][2] == ended.offset + 1
    assert [(item.publication, item.value) for item in hq.subscriptions("r1")] == [("sales", "north")]
    assert hq.connection.execute("SELECT count(*) FROM fieldsync.subscription_change").fetchone() == (0,)
    # r2's only subscription ends: the table leaves it, its DELETEs are read with the article they leave.
    left = hq.unsubscribe("r2", "sales", "south")
    assert left.deletes == 10
    assert ops(hq.read_log("r2", last)) == [(left.offset, OpKind.DELETE, key) for key in keys("south")]


def test_a_write_running_when_the_change_starts_is_waited_for_and_read_in_the_rows_it_sends(orders, target):
    """An application's transaction that changed an east row and has not
    committed: the subscription waits for it (its lock on the table), so
    the INSERT r1 gets carries the committed value, and r1 gets no UPDATE
    of a row it did not hold yet."""
    hq = orders
    start = hq.scan()
    writer = connect(target, autocommit=False)
    writer.execute("UPDATE orders SET qty = 99 WHERE id = 3")
    done: list = []
    changing = threading.Thread(target=lambda: done.append(hq.subscribe("r1", "sales", "east")))
    changing.start()
    time.sleep(0.5)
    assert not done  # waiting for the writer
    writer.commit()
    writer.close()
    changing.join(10)
    [added] = done
    transactions = list(hq.read_log("r1", start, hq.scan()))
    row = [op for transaction in transactions for op in transaction.ops if op.key == (3,)]
    assert [(op.kind, op.after["qty"]) for op in row] == [(OpKind.INSERT, 99)]
    assert {transaction.commit for transaction in transactions} == {added.offset}


def test_a_table_an_open_transaction_holds_gives_the_change_up_with_nothing_changed(orders, target, monkeypatch):
    """Waiting for the table's lock behind an open transaction would queue
    every later writer of the table behind the change: after LOCK_TIMEOUT
    it gives up in one line, and the writers go on."""
    from agent.site.errors import SiteBusy
    from agent.site.postgres import resubscribe

    hq = orders
    end = hq.scan()
    monkeypatch.setattr(resubscribe, "LOCK_TIMEOUT", 0.3)
    writer = connect(target, autocommit=False)
    writer.execute("UPDATE orders SET qty = 99 WHERE id = 3")
    try:
        with pytest.raises(SiteBusy, match=r"table 'orders' was not free of writers within 0.3 s .* nothing "
                                           "changed: run it again when the table is less busy"):
            hq.subscribe("r1", "sales", "east")
        with connect(target) as other:  # another writer is not held up
            other.execute("UPDATE orders SET qty = 7 WHERE id = 1")
    finally:
        writer.rollback()
        writer.close()
    assert [item.value for item in hq.subscriptions("r1")] == ["north"]
    assert [op[1:] for op in ops(hq.read_log("r1", end, hq.scan()))] == [(OpKind.UPDATE, (1,))]
    assert hq.subscribe("r1", "sales", "east").inserts == 10


def test_a_change_that_moves_no_row_holds_from_the_next_log_transaction(orders, app):
    hq = orders
    end = hq.scan()
    added = hq.subscribe("r1", "sales", "west")
    assert (added.inserts, added.offset, added.matching) == (0, None, 0)
    app.execute("INSERT INTO orders VALUES (31, 'west', 1)")
    app.execute("UPDATE orders SET region = 'east' WHERE id = 31")  # leaves r1's subset: a DELETE
    ended = hq.unsubscribe("r1", "sales", "west")
    assert (ended.deletes, ended.offset) == (0, None)
    app.execute("INSERT INTO orders VALUES (32, 'west', 1)")  # no longer r1's
    last = hq.scan()
    assert [op[1:] for op in ops(hq.read_log("r1", end, last))] == [(OpKind.INSERT, (31,)), (OpKind.DELETE, (31,))]


def test_what_cannot_change_is_refused_or_changes_nothing(orders):
    hq = orders
    end = hq.scan()
    with pytest.raises(InvalidSetting, match="'r1' does not subscribe to 'sales' with 'east'"):
        hq.unsubscribe("r1", "sales", "east")
    assert not hq.subscribe("r1", "sales", "north").changed
    assert [item.value for item in hq.subscriptions("r1")] == ["north"]
    assert hq.scan() == end


def test_an_end_waits_for_its_cut_and_its_deletes_stay_a_log_transaction_of_their_own(orders, app, monkeypatch):
    """A process that dies between the change and its cut: the subscription
    still holds (listed, and read so) until a cut gives the DELETEs their
    log transaction, which an apply of the same remote right after does not
    join."""
    hq = orders
    start = hq.scan()
    with monkeypatch.context() as patched:
        patched.setattr(hq, "scan", lambda: start)
        ended = hq.unsubscribe("r1", "sales", "north")
    assert ended.deletes == 10 and ended.offset is None
    assert hq.connection.execute("SELECT until FROM fieldsync.subscription WHERE remote = 'r1'").fetchall() == [(None,)]
    app.execute("BEGIN")
    app.execute("SELECT set_config('fieldsync.origin', 'r1', true)")  # as r1's apply writes
    app.execute("UPDATE orders SET qty = 7 WHERE id = 2")
    app.execute("COMMIT")
    end = hq.scan()
    members = hq.connection.execute("SELECT commit_offset, count(*) FROM fieldsync.log_txn WHERE commit_offset > %s"
                                    " GROUP BY commit_offset ORDER BY commit_offset", (start,)).fetchall()
    assert members == [(end - 1, 1), (end, 1)]
    assert hq.connection.execute("SELECT until FROM fieldsync.subscription WHERE remote = 'r1'").fetchall() == [
        (end,)]
    assert ops(hq.read_log("r1", start)) == [(end - 1, OpKind.DELETE, key) for key in keys("north")]


def test_from_the_command_line_the_rows_reach_the_extracted_sqlite_remote_and_leave_it(agent, app_uri, tmp_path):
    """`agent remote subscribe` / `unsubscribe` on a PostgreSQL URI: north,
    extracted with its own region, gets south's rows as INSERTs with no new
    extraction, then loses its own as DELETEs; a write at the field site
    and one at PostgreSQL go on meeting."""
    from agent.site import open_site

    from .test_cli import consolidated_with_north
    from .test_schema_changes import _exchange

    north = consolidated_with_north(agent, app_uri, tmp_path)
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (4, 'Di', 'south'), (5, 'Ed', 'south')")
        everything = conn.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall()
    _exchange(agent, app_uri, north)

    def held() -> list[tuple]:
        with open_site(north) as remote:
            return remote.connection.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall()

    assert held() == [row for row in everything if row[2] == "north"]
    code, out, err = agent("remote", "subscribe", app_uri, "north", "sales=south")
    assert (code, err) == (0, ""), err
    south = [row for row in everything if row[2] == "south"]
    assert out.strip() == (f"Subscribed north to sales with 'south': {len(south)} rows go to it as INSERTs with its "
                           "next send")
    _exchange(agent, app_uri, north)
    assert held() == [row for row in everything if row[2] in ("north", "south")]
    with open_site(north) as remote:
        remote.connection.execute("UPDATE customer SET name = 'Di B.' WHERE id = 4")  # a south row, now north's
    code, out, err = agent("remote", "unsubscribe", app_uri, "north", "sales=north")
    assert (code, err) == (0, ""), err
    assert out.strip() == "Unsubscribed north from sales with 'north': 1 row goes to it as DELETEs with its next send"
    _exchange(agent, north, app_uri)
    with connect(app_uri) as conn:
        assert conn.execute("SELECT name FROM customer WHERE id = 4").fetchone() == ("Di B.",)
    assert held() == [(4, "Di B.", "south"), (5, "Ed", "south")]
    with open_site(app_uri) as site:
        assert site.apply_errors() == () and site.conflicts() == ()
        assert [(item.publication, item.value) for item in site.subscriptions("north")] == [("sales", "south")]


def _writer(target, seed: int, stop: threading.Event, errors: list) -> None:  # type: ignore[no-untyped-def]
    """One-statement transactions on orders until ``stop`` (so the
    writers never deadlock among themselves): new rows, changed
    quantities, rows moved between regions, rows deleted."""
    import random

    rng = random.Random(seed)
    next_id = 1000 * (seed + 1)
    try:
        with connect(target) as conn:
            while not stop.is_set():
                key = rng.randint(1, 30)
                roll = rng.random()
                if roll < 0.4:
                    conn.execute("UPDATE orders SET qty = qty + 1 WHERE id = %s", (key,))
                elif roll < 0.7:
                    conn.execute("UPDATE orders SET region = %s WHERE id = %s", (rng.choice(REGIONS), key))
                elif roll < 0.9:
                    next_id += 1
                    conn.execute("INSERT INTO orders VALUES (%s, %s, 0)", (next_id, rng.choice(REGIONS)))
                else:
                    conn.execute("DELETE FROM orders WHERE id = %s", (next_id,))
    except Exception as error:  # noqa: BLE001 - reported by the test
        errors.append(error)


def test_changes_made_while_applications_write_leave_the_remote_with_exactly_its_subset(orders, target, app):
    """Three sessions write all the while (moves between regions among
    them) as r1 subscribes and unsubscribes over and over: r1's stream,
    replayed strictly onto its extracted rows, ends as exactly the rows of
    the regions it subscribes to, with no INSERT of a row it holds, no
    UPDATE or DELETE of one it lacks."""
    from agent.site.postgres.capture import load_shapes

    from .replay import Copy

    hq = orders
    start = hq.scan()
    copy = Copy()
    copy.tables["orders"] = {(key,): {"id": key, "region": region, "qty": qty} for key, region, qty in app.execute(
        "SELECT id, region, qty FROM orders WHERE region = 'north'")}
    stop, errors = threading.Event(), []
    writers = [threading.Thread(target=_writer, args=(target, seed, stop, errors)) for seed in range(3)]
    for thread in writers:
        thread.start()
    try:
        for region in ("east", "south", "east", "south", "north", "east"):
            held = {item.value for item in hq.subscriptions("r1")}
            if region in held and len(held) > 1:
                hq.unsubscribe("r1", "sales", region)
            else:
                hq.subscribe("r1", "sales", region)
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in writers:
            thread.join(10)
    assert errors == []
    end = hq.scan()
    copy.apply(op for transaction in hq.read_log("r1", start, end) for op in transaction.ops)
    assert copy.problems == []
    regions = sorted(item.value for item in hq.subscriptions("r1"))
    expected = {(key,): {"id": key, "region": region, "qty": qty} for key, region, qty in app.execute(
        "SELECT id, region, qty FROM orders WHERE region = ANY(%s)", (regions,))}
    assert copy.tables["orders"] == expected
    assert load_shapes(hq.connection)  # the capture stayed in place throughout


def test_rows_that_follow_their_parent_move_with_it_parents_first_in_and_children_first_out(hq, app):
    app.execute("CREATE TABLE client (id integer PRIMARY KEY, rep text NOT NULL)")
    app.execute("CREATE TABLE purchase (id integer PRIMARY KEY, client_id integer NOT NULL REFERENCES client (id),"
                " note text)")
    app.execute("INSERT INTO client VALUES (1, 'a'), (2, 'b'), (3, 'b')")
    app.execute("INSERT INTO purchase VALUES (10, 1, 'x'), (20, 2, 'y'), (30, 3, 'z'), (31, 3, 'w')")
    hq.create_publication("book", [Article("client", subscribe_by="rep"), Article("purchase", follows="client")])
    hq.add_remote("r3", address="inbox/r3")
    hq.subscribe("r3", "book", "a")
    hq.update_remote("r3", peer_incarnation=b"\x03" * 16)
    start = hq.scan()
    added = hq.subscribe("r3", "book", "b")
    assert (added.inserts, added.deletes) == (5, 0)
    assert [(op.table, op.kind, op.key, op.after) for transaction in hq.read_log("r3", start)
            for op in transaction.ops] == [
        ("client", OpKind.INSERT, (2,), {"id": 2, "rep": "b"}), ("client", OpKind.INSERT, (3,), {"id": 3, "rep": "b"}),
        ("purchase", OpKind.INSERT, (20,), {"id": 20, "client_id": 2, "note": "y"}),
        ("purchase", OpKind.INSERT, (30,), {"id": 30, "client_id": 3, "note": "z"}),
        ("purchase", OpKind.INSERT, (31,), {"id": 31, "client_id": 3, "note": "w"})]
    app.execute("INSERT INTO purchase VALUES (21, 2, 'v')")  # under a client r3 now gets
    middle = hq.scan()
    ended = hq.unsubscribe("r3", "book", "a")
    assert (ended.inserts, ended.deletes) == (0, 2)
    assert [(op.table, op.kind, op.key) for transaction in hq.read_log("r3", middle - 1)
            for op in transaction.ops] == [("purchase", OpKind.INSERT, (21,)),
                                           ("purchase", OpKind.DELETE, (10,)), ("client", OpKind.DELETE, (1,))]


def test_a_table_in_two_publications_keeps_the_rows_another_subscription_holds_with_their_columns(hq, app):
    """member in regions (name, region by region) and reps (name, rep,
    price by rep); r5 subscribes to regions north and reps ann.  Leaving
    reps deletes the row only reps kept and sends the row regions keeps as
    an UPDATE that takes reps' columns away; joining reps with bob adds
    bob's row and gives the row regions keeps reps' columns."""
    app.execute("CREATE TABLE member (id integer PRIMARY KEY, name text, region text, rep text,"
                " price double precision NOT NULL)")
    app.execute("INSERT INTO member VALUES (1, 'a', 'north', 'ann', 1.0), (2, 'b', 'north', 'bob', 2.0),"
                " (3, 'c', 'south', 'ann', 3.0), (4, 'd', 'south', 'bob', 4.0)")
    hq.create_publication("regions", [Article("member", columns=["name", "region"], subscribe_by="region")])
    hq.create_publication("reps", [Article("member", columns=["name", "rep", "price"], subscribe_by="rep")])
    hq.add_remote("r5", address="inbox/r5")
    hq.subscribe("r5", "regions", "north")
    hq.subscribe("r5", "reps", "ann")
    hq.update_remote("r5", peer_incarnation=b"\x05" * 16)
    start = hq.scan()
    ended = hq.unsubscribe("r5", "reps", "ann")
    assert (ended.deletes, ended.inserts) == (1, 0)
    assert [(op.kind, op.key, op.after) for transaction in hq.read_log("r5", start)
            for op in transaction.ops] == [(OpKind.DELETE, (3,), None),
                                           (OpKind.UPDATE, (1,), {"rep": None, "price": None})]
    middle = hq.scan()
    added = hq.subscribe("r5", "reps", "bob")
    assert (added.deletes, added.inserts) == (0, 1)
    assert [(op.kind, op.key, op.after) for transaction in hq.read_log("r5", middle)
            for op in transaction.ops] == [
        (OpKind.INSERT, (4,), {"id": 4, "name": "d", "region": None, "rep": "bob", "price": 4.0}),
        (OpKind.UPDATE, (2,), {"rep": "bob", "price": 2.0})]


def test_an_unsubscribe_killed_before_its_cut_is_finished_by_the_next_run(agent, app_uri, tmp_path):
    """`agent remote unsubscribe` killed (SIGKILL) once its rows are
    committed and before the cut that gives them their offset: the
    subscription is still held and listed; the next `agent run` cuts the
    log, which ends it, and the remote loses its rows once."""
    import os
    import signal
    import subprocess

    from agent.site import open_site

    from tests.cli.conftest import AGENT_COMMAND

    from .test_cli import consolidated_with_north
    from .test_schema_changes import _exchange

    north = consolidated_with_north(agent, app_uri, tmp_path)
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (4, 'Di', 'south'), (5, 'Ed', 'south')")
    assert agent("remote", "subscribe", app_uri, "north", "sales=south")[0] == 0
    _exchange(agent, app_uri, north)
    with open_site(north) as remote:
        assert len(remote.connection.execute("SELECT id FROM customer").fetchall()) > 2  # north's and south's
    killed = subprocess.run([*AGENT_COMMAND, "remote", "unsubscribe", app_uri, "north", "sales=north"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "FIELDSYNC_CRASH": "resubscribe.before-cut"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with open_site(app_uri) as site:
        assert sorted(item.value for item in site.subscriptions("north")) == ["north", "south"]
        assert site.connection.execute("SELECT count(*) FROM fieldsync.subscription_change").fetchone() == (1,)
    _exchange(agent, app_uri, north)
    with open_site(app_uri) as site:
        assert [item.value for item in site.subscriptions("north")] == ["south"]
        assert site.connection.execute("SELECT count(*) FROM fieldsync.subscription_change").fetchone() == (0,)
        south = site.connection.execute("SELECT id FROM customer WHERE region = 'south' ORDER BY id").fetchall()
        assert south and site.apply_errors() == ()
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id FROM customer ORDER BY id").fetchall() == south
        assert remote.apply_errors() == ()
