"""Rows that follow their parent, changed at the remotes, with foreign keys
on there (docs/site-database.md, "Rows that follow their parent" and
"Apply"): a rep's customers, their orders and the orders' lines, the
remotes extracted and opened as the agent opens them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent.site import Article, SiteDatabase
from codec.ops import OpKind, Operation, Transaction

from .conftest import app_connection, decoded, extracted, make_site, replicate

SUBSET = {
    "customer": "SELECT id, rep, name FROM customer WHERE rep IN ({}) ORDER BY id",
    "orders": "SELECT o.id, o.customer_id, o.note FROM orders o JOIN customer c ON c.id = o.customer_id"
              " WHERE c.rep IN ({}) ORDER BY o.id",
    "order_line": "SELECT l.id, l.order_id, l.qty FROM order_line l JOIN orders o ON o.id = l.order_id"
                  " JOIN customer c ON c.id = o.customer_id WHERE c.rep IN ({}) ORDER BY l.id",
}
HELD = {"customer": "SELECT id, rep, name FROM customer ORDER BY id",
        "orders": "SELECT id, customer_id, note FROM orders ORDER BY id",
        "order_line": "SELECT id, order_id, qty FROM order_line ORDER BY id"}
REPS = {"rep1": 1, "rep2": 2, "rep3": 1}  # rep3 gets rep 1's customers too


class World:
    def __init__(self, hq: SiteDatabase, remotes: dict[str, SiteDatabase]) -> None:
        self.hq = hq
        self.remotes = remotes

    def sync(self, rounds: int = 2) -> None:
        for _ in range(rounds):
            for remote in self.remotes.values():
                replicate(remote, self.hq)
            for remote in self.remotes.values():
                replicate(self.hq, remote)

    def check(self) -> None:
        for name, remote in self.remotes.items():
            for table, query in SUBSET.items():
                assert (remote.connection.execute(HELD[table]).fetchall()
                        == self.hq.connection.execute(query.format(REPS[name])).fetchall()), (name, table)

    def errors(self) -> dict[str, list[tuple]]:
        return {name: [(error.table, error.problem) for error in site.apply_errors()]
                for name, site in {"hq": self.hq, **self.remotes}.items() if site.apply_errors()}


def app(site: SiteDatabase, *statements: str, foreign_keys: bool = True) -> None:
    """An application's transaction at ``site`` (with its foreign keys on, as most set them)."""
    conn = app_connection(site)
    conn.execute(f"PRAGMA foreign_keys = {int(foreign_keys)}")
    conn.execute("BEGIN")
    for statement in statements:
        conn.execute(statement)
    conn.execute("COMMIT")
    conn.close()


def make_world(tmp_path: Path, action: str = "") -> World:
    hq = make_site(tmp_path, "hq", "consolidated",
                   "CREATE TABLE customer (id INTEGER PRIMARY KEY, rep INTEGER, name TEXT)",
                   f"CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer (id) {action},"
                   " note TEXT)",
                   f"CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER REFERENCES orders (id) {action},"
                   " qty INTEGER)")
    app(hq, "INSERT INTO customer VALUES (1, 1, 'one'), (2, 2, 'two'), (3, 1, 'three'), (4, 2, 'four')",
        "INSERT INTO orders VALUES (10, 1, 'a'), (11, 1, 'b'), (20, 2, 'c'), (30, 3, 'd')",
        "INSERT INTO order_line VALUES (100, 10, 1), (101, 11, 2), (200, 20, 3), (300, 30, 4)")
    hq.create_publication("sales", [Article("customer", subscribe_by="rep"), Article("orders", follows="customer"),
                                    Article("order_line", follows="orders")])
    return World(hq, extracted(hq, tmp_path, "sales", REPS))


@pytest.fixture
def world(tmp_path: Path):
    made = make_world(tmp_path)
    yield made
    for site in (made.hq, *made.remotes.values()):
        site.close()


def test_remotes_apply_with_foreign_keys_on_and_the_consolidated_with_them_off(world: World) -> None:
    assert world.remotes["rep1"].connection.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert world.hq.connection.execute("PRAGMA foreign_keys").fetchone() == (0,)
    world.check()


def test_a_copy_without_the_foreign_key_checks_the_parent_itself_when_it_applies(world: World) -> None:
    """A copy extracted from a PostgreSQL consolidated before extraction
    carried foreign keys declares none.  The apply then checks a row's
    parent itself, as the key would (route.apply_triggers): a line hq sent
    under an order rep 1 has deleted meanwhile is refused there, not kept
    without its order; a line whose order rep 1 holds goes in."""
    rep1 = world.remotes["rep1"]
    conn = rep1.connection
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'REFERENCES orders (id)', '')"
                 " WHERE type = 'table' AND name = 'order_line'")
    conn.execute("PRAGMA writable_schema = RESET")
    assert conn.execute("PRAGMA foreign_key_list(order_line)").fetchall() == []
    app(rep1, "DELETE FROM order_line WHERE order_id = 11", "DELETE FROM orders WHERE id = 11")
    log_received = rep1.remote("hq").log_received
    ops = (Operation("order_line", OpKind.INSERT, (777,), None, {"id": 777, "order_id": 11, "qty": 7}),
           Operation("order_line", OpKind.INSERT, (778,), None, {"id": 778, "order_id": 10, "qty": 8}))
    result = rep1.apply("hq", [decoded(Transaction(log_received + 1, "hq", ops))], log_received=log_received + 1)
    assert conn.execute("SELECT id FROM order_line WHERE id > 700").fetchall() == [(778,)]
    assert result.errors == 1
    [error] = rep1.apply_errors()
    assert (error.table, error.key, error.problem) == (
        "order_line", (777,), "constraint failed: no parent row: no orders row has the key this order_line row names"
        " (it follows orders)")


def test_a_moved_parent_reaches_a_remote_whose_foreign_keys_want_it_before_its_children(world: World) -> None:
    world.hq.scan()
    app(world.hq, "UPDATE customer SET rep = 2 WHERE id = 1")
    end = world.hq.scan()
    # The move's log transaction holds the children's rows before the parent's.
    [move] = [transaction for transaction in world.hq.read_log("rep2", world.hq.remote("rep2").log_sent, end)]
    assert [op.table for op in move.ops][-1] == "customer"
    world.sync()
    world.check()
    assert world.remotes["rep2"].connection.execute("SELECT count(*) FROM order_line WHERE order_id IN (10, 11)"
                                                    ).fetchone() == (2,)
    assert world.errors() == {}


@pytest.mark.parametrize("first", ["hq applies rep1's child first", "rep1 applies the move first"])
def test_a_child_written_at_a_remote_while_its_parent_moved_away_goes_to_the_new_subscriber(
        world: World, first: str) -> None:
    hq, rep1 = world.hq, world.remotes["rep1"]
    app(rep1, "INSERT INTO orders VALUES (12, 1, 'written at rep1')", "INSERT INTO order_line VALUES (120, 12, 5)")
    app(hq, "UPDATE customer SET rep = 2 WHERE id = 1")
    if first.startswith("hq"):
        replicate(rep1, hq)
        replicate(hq, rep1)
    else:
        replicate(hq, rep1)  # customer 1 leaves rep1, and rep1's own order with it
        assert rep1.connection.execute("SELECT count(*) FROM orders WHERE customer_id = 1").fetchone() == (0,)
        replicate(rep1, hq)
    world.sync()
    world.check()
    assert world.remotes["rep2"].connection.execute("SELECT note FROM orders WHERE id = 12").fetchall() == [
        ("written at rep1",)]
    assert world.remotes["rep2"].connection.execute("SELECT qty FROM order_line WHERE id = 120").fetchall() == [(5,)]
    assert world.errors() == {}


def test_a_child_a_remote_writes_under_a_parent_outside_its_subset_leaves_it(world: World) -> None:
    # rep1's application keeps its foreign keys off, and customer 2 is rep 2's: the order
    # reaches rep 2 and the consolidated sends rep1 a DELETE of it (by its route).
    rep1 = world.remotes["rep1"]
    app(rep1, "INSERT INTO orders VALUES (21, 2, 'for rep 2')", foreign_keys=False)
    world.sync()
    world.check()
    assert rep1.connection.execute("SELECT count(*) FROM orders WHERE id = 21").fetchone() == (0,)
    assert world.remotes["rep2"].connection.execute("SELECT note FROM orders WHERE id = 21").fetchall() == [
        ("for rep 2",)]
    assert world.errors() == {}


def test_a_child_for_a_parent_missing_at_the_consolidated_is_an_apply_error_there(world: World) -> None:
    hq, rep1 = world.hq, world.remotes["rep1"]
    app(rep1, "INSERT INTO orders VALUES (13, 99, 'no such customer')", "INSERT INTO orders VALUES (14, 3, 'fine')",
        foreign_keys=False)
    app(rep1, "UPDATE orders SET customer_id = 98 WHERE id = 11", foreign_keys=False)
    app(rep1, "INSERT INTO order_line VALUES (140, 14, 1)")
    result = replicate(rep1, hq)
    assert result.errors == 2
    problems = [(error.table, error.kind, error.key, error.problem) for error in hq.apply_errors()]
    assert [problem[:3] for problem in problems] == [("orders", OpKind.INSERT, (13,)), ("orders", OpKind.UPDATE, (11,))]
    assert all(problem[3] == "constraint failed: no parent row: no customer row has the key this orders row names"
               " (it follows customer)" for problem in problems), problems
    # The stream goes on: the rest of the batch and the next one are applied.
    assert hq.connection.execute("SELECT id, customer_id FROM orders WHERE id IN (11, 13, 14) ORDER BY id"
                                 ).fetchall() == [(11, 1), (14, 3)]
    replicate(hq, world.remotes["rep3"])
    assert world.remotes["rep3"].connection.execute("SELECT id FROM order_line WHERE id = 140").fetchall() == [(140,)]


@pytest.mark.parametrize("action, kept", [("ON DELETE CASCADE", 0), ("ON DELETE SET NULL", 1)])
def test_rows_a_cascade_changes_at_a_remote_travel_like_any_change(tmp_path: Path, action: str, kept: int) -> None:
    made = make_world(tmp_path, action)
    try:
        rep1 = made.remotes["rep1"]
        start = rep1.scan()
        app(rep1, "DELETE FROM customer WHERE id = 3")  # order 30 and, by CASCADE, its line 300
        rep1.scan()
        # SQLite fires the row triggers of what its foreign key actions change: they are captured.
        captured = [(op.table, op.kind) for transaction in rep1.read_log("hq", start) for op in transaction.ops]
        assert ("orders", OpKind.DELETE if kept == 0 else OpKind.UPDATE) in captured
        made.sync()
        made.check()
        assert made.hq.connection.execute("SELECT count(*) FROM orders WHERE id = 30").fetchone() == (kept,)
        assert made.remotes["rep3"].connection.execute("SELECT count(*) FROM orders WHERE id = 30").fetchone() == (0,)
        assert made.errors() == {}
    finally:
        for site in (made.hq, *made.remotes.values()):
            site.close()


def test_a_transaction_applies_at_a_remote_whatever_the_order_of_parents_and_children(world: World) -> None:
    rep1 = world.remotes["rep1"]
    log_received = rep1.remote("hq").log_received

    def insert(table: str, key: int, **row: object) -> Operation:
        return Operation(table, OpKind.INSERT, (key,), None, {"id": key, **row})

    ops = (insert("order_line", 500, order_id=50, qty=1),  # its order comes later, and the order's customer later still
           Operation("order_line", OpKind.UPDATE, (500,), {"qty": 1}, {"qty": 2}),  # waits with the INSERT of its row
           insert("orders", 50, customer_id=5, note="x"),
           insert("customer", 5, rep=1, name="five"),
           Operation("customer", OpKind.DELETE, (3,), {"id": 3, "rep": 1, "name": "three"}, None),  # its order follows
           Operation("order_line", OpKind.DELETE, (300,), {"id": 300, "order_id": 30, "qty": 4}, None),
           insert("orders", 51, customer_id=77, note="no customer 77 anywhere"))
    result = rep1.apply("hq", [decoded(Transaction(log_received + 1, "hq", ops))], log_received=log_received + 1)
    assert rep1.connection.execute("SELECT id, customer_id FROM orders ORDER BY id").fetchall() == [
        (10, 1), (11, 1), (50, 5)]
    assert rep1.connection.execute("SELECT id, qty FROM order_line ORDER BY id").fetchall() == [
        (100, 1), (101, 2), (500, 2)]
    assert rep1.connection.execute("SELECT id FROM customer ORDER BY id").fetchall() == [(1,), (5,)]
    assert result.errors == 1
    [error] = rep1.apply_errors()
    assert (error.table, error.key, error.problem) == ("orders", (51,), "constraint failed: FOREIGN KEY constraint failed")


def test_a_remote_extracted_before_follows_were_recorded_there_refuses_a_parent_with_children(world: World) -> None:
    # Without its follows (an older copy), a remote with foreign keys on cannot drop a parent
    # whose children the consolidated did not send DELETEs for: recorded, and the batch goes on.
    rep1 = world.remotes["rep1"]
    rep1.connection.execute("UPDATE fieldsync_article SET follows = NULL, follow_columns = NULL, parent_columns = NULL")
    log_received = rep1.remote("hq").log_received
    ops = (Operation("customer", OpKind.DELETE, (3,), {"id": 3, "rep": 1, "name": "three"}, None),
           Operation("customer", OpKind.UPDATE, (1,), {"name": "one"}, {"name": "uno"}))
    result = rep1.apply("hq", [decoded(Transaction(log_received + 1, "hq", ops))], log_received=log_received + 1)
    assert result.errors == 1
    assert rep1.connection.execute("SELECT id, name FROM customer ORDER BY id").fetchall() == [(1, "uno"), (3, "three")]
    with pytest.raises(sqlite3.IntegrityError):
        rep1.connection.execute("DELETE FROM customer WHERE id = 3")


def test_a_followed_table_an_application_dropped_makes_no_trigger_that_would_fail_the_apply(world: World) -> None:
    rep1 = world.remotes["rep1"]
    app(rep1, "DROP TABLE order_line")
    app(world.hq, "UPDATE customer SET rep = 2 WHERE id = 3")  # customer 3 and order 30 leave rep1
    result = replicate(world.hq, rep1)
    assert rep1.connection.execute("SELECT id FROM orders ORDER BY id").fetchall() == [(10,), (11,)]
    assert [name for (name,) in rep1.connection.execute("SELECT name FROM sqlite_temp_master WHERE type = 'trigger'"
                                                         " ORDER BY name")] == ["fieldsync_follow_delete_customer"]
    assert result.errors == 1  # the DELETE of line 300, in a table rep1 no longer has
