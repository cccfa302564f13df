"""Rows that follow their parent while parents move and children change
hands at two sites at once (docs/site-database.md, "Rows that follow their
parent"), on a consolidated of either backend: cases the fault suite's
follow chain found, each with the sites applying each other's changes in
either order, and children a remote writes reaching their parent's
subscribers, or refused for a parent the consolidated deleted.  A rep's customers, their orders and the orders' lines:
customers 1 and 3 are rep 1's (rep1 and rep3 hold them), 2 and 4 rep 2's;
the remotes apply with their foreign keys on (a remote extracted from
PostgreSQL has none: docs/postgres.md, "Extraction")."""

from __future__ import annotations

import contextlib

import pytest

from agent.site import Article, SiteDatabase
from codec.ops import OpKind

from ..conftest import app_connection, extracted, replicate
from .. import test_follow_remotes
from ..test_follow_remotes import HELD, REPS, SUBSET  # rep3 gets rep 1's customers too

TABLES = (
    "DROP TABLE customer",
    "CREATE TABLE customer (id integer PRIMARY KEY, rep integer, name text)",
    "CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer REFERENCES customer (id), note text)",
    "CREATE TABLE order_line (id integer PRIMARY KEY, order_id integer REFERENCES orders (id), qty integer)",
)


class World(test_follow_remotes.World):
    """test_follow_remotes.World (its rounds and errors) at a consolidated of either backend."""

    def __init__(self, backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
        self.backend = backend
        self.hq = backend.site
        self.session = backend.app()
        self.session.run(*TABLES)
        self.session.run("INSERT INTO customer VALUES (1, 1, 'one'), (2, 2, 'two'), (3, 1, 'three'), (4, 2, 'four')",
                         "INSERT INTO orders VALUES (10, 1, 'a'), (11, 1, 'b'), (20, 2, 'c'), (30, 3, 'd')",
                         "INSERT INTO order_line VALUES (100, 10, 1), (101, 11, 2), (200, 20, 3), (300, 30, 4)")
        self.hq.create_publication("sales", [Article("customer", subscribe_by="rep"),
                                             Article("orders", follows="customer"),
                                             Article("order_line", follows="orders")])
        self.remotes: dict[str, SiteDatabase] = extracted(self.hq, tmp_path, "sales", REPS)

    def app(self, site: str, *statements: str) -> None:
        """An application's transaction at ``site`` (a remote's with its foreign keys on, as most set them)."""
        if site == "hq":
            self.session.run(*statements)
            return
        conn = app_connection(self.remotes[site])
        conn.execute("PRAGMA foreign_keys = 1")
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
        conn.close()

    def held(self, site: str, query: str) -> list[tuple]:
        if site == "hq":
            return self.session.query(query)
        return self.remotes[site].connection.execute(query).fetchall()

    def check(self) -> None:
        for name in self.remotes:
            for table, query in SUBSET.items():
                assert self.held(name, HELD[table]) == self.held("hq", query.format(REPS[name])), (name, table)

    def close(self) -> None:
        for remote in self.remotes.values():
            remote.close()


@pytest.fixture
def world(backend, tmp_path):
    with contextlib.closing(World(backend, tmp_path)) as made:
        yield made


ORDERS_OF_REP1 = "SELECT id, customer_id FROM orders ORDER BY id"
LINES = "SELECT id, order_id FROM order_line ORDER BY id"
FIRST = ["hq", "hq, unconfirmed", "rep1"]
# hq deletes customer 3, its order and line first.
DELETE_CUSTOMER_3 = ("DELETE FROM order_line WHERE order_id = 30", "DELETE FROM orders WHERE customer_id = 3",
                     "DELETE FROM customer WHERE id = 3")


def exchange(world: World, first: str) -> None:
    """rep1 and hq apply each other's changes, ``first`` the one that goes
    first; "hq, unconfirmed": rep1 learns that hq has its changes only after
    it applied hq's (its own stay pending meanwhile)."""
    hq, rep1 = world.hq, world.remotes["rep1"]
    if first == "hq":
        replicate(rep1, hq)
        replicate(hq, rep1)
    elif first == "hq, unconfirmed":
        confirmed = rep1.remote("hq").confirm_sent
        replicate(rep1, hq)
        rep1.connection.execute("UPDATE fieldsync_remote SET confirm_sent = ? WHERE name = 'hq'", (confirmed,))
        replicate(hq, rep1)
    else:
        replicate(hq, rep1)
        replicate(rep1, hq)
    world.sync()


@pytest.mark.parametrize("first", FIRST)
def test_an_order_handed_to_a_customer_the_consolidated_deleted_comes_back_with_its_lines(
        world: World, first: str) -> None:
    # hq refuses rep1's change (no customer 3 there any more) and keeps order 10
    # under customer 1; rep1 loses it with customer 3: hq sends it back whole,
    # with the lines under it.
    world.app("rep1", "UPDATE orders SET customer_id = 3 WHERE id = 10")
    world.app("hq", *DELETE_CUSTOMER_3)
    exchange(world, first)
    world.check()
    rep1 = world.remotes["rep1"]
    assert rep1.connection.execute(ORDERS_OF_REP1).fetchall() == [(10, 1), (11, 1)]
    assert rep1.connection.execute(LINES).fetchall() == [(100, 10), (101, 11)]


@pytest.mark.parametrize("first", FIRST)
def test_an_order_a_remote_wrote_for_a_customer_the_consolidated_deleted_goes_even_under_another_customer(
        world: World, first: str) -> None:
    # hq refuses the order (no customer 3 there any more), and rep1 gives it to
    # customer 1 before customer 3's DELETE takes it away: hq sends its DELETE.
    rep1 = world.remotes["rep1"]
    world.app("rep1", "INSERT INTO orders VALUES (12, 3, 'for customer 3')",
              "INSERT INTO order_line VALUES (120, 12, 5)")
    world.app("hq", *DELETE_CUSTOMER_3)
    world.app("rep1", "UPDATE orders SET customer_id = 1 WHERE id = 12")
    exchange(world, first)
    world.check()
    assert rep1.connection.execute(ORDERS_OF_REP1).fetchall() == [(10, 1), (11, 1)]
    assert rep1.connection.execute(LINES).fetchall() == [(100, 10), (101, 11)]


@pytest.mark.parametrize("first", FIRST)
def test_an_order_a_remote_takes_back_from_a_moved_customer_comes_back_with_all_its_lines(
        world: World, first: str) -> None:
    # hq gives customer 1 to rep 2 while rep1 gives order 10 to customer 3 and
    # adds a line to it: the order stays rep 1's, with every line hq holds under it.
    world.app("rep1", "UPDATE orders SET customer_id = 3 WHERE id = 10",
              "INSERT INTO order_line VALUES (102, 10, 9)")
    world.app("hq", "UPDATE customer SET rep = 2 WHERE id = 1")
    exchange(world, first)
    world.check()
    rep1 = world.remotes["rep1"]
    assert rep1.connection.execute(ORDERS_OF_REP1).fetchall() == [(10, 3), (30, 3)]
    assert rep1.connection.execute(LINES).fetchall() == [(100, 10), (102, 10), (300, 30)]


@pytest.mark.parametrize("first", FIRST)
def test_an_order_two_sites_hand_to_customers_of_different_reps_at_once_goes_where_the_conflict_says(
        world: World, first: str) -> None:
    # rep1 gives order 10 to customer 3 while hq gives it to customer 2 (rep 2):
    # the incoming change wins at hq, so the order comes back to rep1, whole,
    # with its lines, whichever site applied the other's change first.
    world.app("rep1", "UPDATE orders SET customer_id = 3 WHERE id = 10")
    world.app("hq", "UPDATE orders SET customer_id = 2 WHERE id = 10")
    exchange(world, first)
    world.check()
    rep1 = world.remotes["rep1"]
    assert rep1.connection.execute(ORDERS_OF_REP1).fetchall() == [(10, 3), (11, 1), (30, 3)]
    assert rep1.connection.execute(LINES).fetchall() == [(100, 10), (101, 11), (300, 30)]
    assert world.remotes["rep2"].connection.execute("SELECT count(*) FROM orders WHERE id = 10").fetchone() == (0,)


# What rep1 writes, the customer hq moves to rep 2 and back meanwhile, and
# the orders rep1 then holds (id, customer, note) and the lines.
AWAY_AND_BACK = {
    # A new order and its line leave rep1 with customer 1.
    "a new order": (("INSERT INTO orders VALUES (12, 1, 'written at rep1')",
                     "INSERT INTO order_line VALUES (120, 12, 5)"), 1,
                    [(10, 1, "a"), (11, 1, "b"), (12, 1, "written at rep1"), (30, 3, "d")],
                    [(100, 10), (101, 11), (120, 12), (300, 30)]),
    # hq knows order 10 under customer 1, so customer 3's move takes it from
    # rep1 (with its line) without a DELETE of its own.
    "an order handed over": (("UPDATE orders SET customer_id = 3, note = 'at rep1' WHERE id = 10",),
                             3, [(10, 3, "at rep1"), (11, 1, "b"), (30, 3, "d")],
                             [(100, 10), (101, 11), (300, 30)]),
}


@pytest.mark.parametrize("first", FIRST)
@pytest.mark.parametrize("case", AWAY_AND_BACK)
def test_an_order_a_remote_wrote_under_a_customer_that_went_away_and_came_back_stays_there(
        world: World, first: str, case: str) -> None:
    # The order leaves rep1 with its customer and must come back with it:
    # rep1 puts back its own rows, as they went, when it applies both moves
    # before hq applies its change (rep1 first); hq sends them back whole
    # when it applies the change before rep1 has confirmed the moves (hq first).
    written, customer, orders, lines = AWAY_AND_BACK[case]
    hq, rep1 = world.hq, world.remotes["rep1"]
    world.app("rep1", *written)
    world.app("hq", f"UPDATE customer SET rep = 2 WHERE id = {customer}")
    hq.scan()
    world.app("hq", f"UPDATE customer SET rep = 1 WHERE id = {customer}")
    exchange(world, first)
    world.check()
    assert rep1.connection.execute("SELECT id, customer_id, note FROM orders ORDER BY id").fetchall() == orders
    assert rep1.connection.execute(LINES).fetchall() == lines
    assert world.errors() == {}


@pytest.mark.parametrize("first", FIRST)
def test_an_order_the_consolidated_hands_to_a_customer_a_remote_deleted_leaves_the_remote(
        world: World, first: str) -> None:
    # hq gives order 10 to customer 3 while rep1 deletes customer 3 (its order
    # first).  At a SQLite consolidated (its keys off) the order is left under
    # no customer, routed to nobody, and rep1 does not keep it under customer
    # 1.  A PostgreSQL consolidated keeps its keys: they refuse the DELETE of
    # customer 3, which order 10 references there (an apply error), and
    # customer 3 goes back to rep1 whole, with the order and its line.  When
    # rep1 gets them before the confirmation of its DELETE ("hq,
    # unconfirmed"), the rows written back say that hq had applied the
    # DELETE: rep1 takes customer 3 instead of keeping it deleted.
    world.app("hq", "UPDATE orders SET customer_id = 3 WHERE id = 10")
    world.app("rep1", "DELETE FROM order_line WHERE order_id = 30", "DELETE FROM orders WHERE id = 30",
              "DELETE FROM customer WHERE id = 3")
    exchange(world, first)
    kept = world.backend.name == "postgresql"
    world.check()
    for name in ("rep1", "rep3"):
        remote = world.remotes[name]
        assert remote.connection.execute(ORDERS_OF_REP1).fetchall() == [(10, 3)] * kept + [(11, 1)], name
        assert remote.connection.execute(LINES).fetchall() == [(100, 10)] * kept + [(101, 11)], name
    assert [error.table for error in world.hq.apply_errors()] == ["customer"] * kept


def test_a_remote_applies_the_consolidated_s_delete_of_a_child_it_changed_itself(world: World) -> None:
    # The remote records the DELETE of a row with its own pending change
    # (pending.py); a row that follows its parent has no route at a remote.
    hq, rep1 = world.hq, world.remotes["rep1"]
    world.app("rep1", "UPDATE orders SET note = 'changed at rep1' WHERE id = 10")
    world.app("hq", "DELETE FROM order_line WHERE order_id = 10", "DELETE FROM orders WHERE id = 10")
    replicate(hq, rep1)
    assert rep1.connection.execute("SELECT count(*) FROM orders WHERE id = 10").fetchone() == (0,)
    world.sync()
    world.check()


def test_a_customer_moved_away_and_an_order_of_it_handed_back_in_one_transaction(world: World) -> None:
    # hq gives customer 2 to rep 1 and, in the same transaction, order 20 to
    # customer 4 (rep 2's): rep2 gets the order's DELETE and INSERT, not one
    # UPDATE after customer 2's DELETE (which takes the order along there).
    hq = world.hq
    start = hq.scan()
    world.app("hq", "UPDATE customer SET rep = 1 WHERE id = 2", "UPDATE orders SET customer_id = 4 WHERE id = 20")
    hq.scan()
    assert [(op.table, op.kind) for transaction in hq.read_log("rep2", start) for op in transaction.ops
            if op.table == "orders"] == [("orders", OpKind.DELETE), ("orders", OpKind.INSERT)]
    world.sync()
    world.check()
    rep2 = world.remotes["rep2"]
    assert rep2.connection.execute("SELECT id, customer_id FROM orders ORDER BY id").fetchall() == [(20, 4)]
    assert rep2.connection.execute(LINES).fetchall() == [(200, 20)]
    assert world.errors() == {}


@pytest.mark.parametrize("first", FIRST)
def test_a_line_a_remote_changed_keeps_its_value_when_its_customer_moves_away_and_back_in_one_transaction(
        world: World, first: str) -> None:
    # The move sends rep1 the line's DELETE before its order's, so the line
    # does not go along with the order unseen: the INSERT that brings it
    # back keeps rep1's quantity, which hq applies after.
    hq, rep1 = world.hq, world.remotes["rep1"]
    world.app("rep1", "UPDATE order_line SET qty = 77 WHERE id = 100")
    world.app("hq", "UPDATE customer SET rep = 2 WHERE id = 1", "UPDATE customer SET rep = 1 WHERE id = 1")
    exchange(world, first)
    world.check()
    assert rep1.connection.execute("SELECT qty FROM order_line WHERE id = 100").fetchall() == [(77,)]
    assert world.held("hq", "SELECT qty FROM order_line WHERE id = 100") == [(77,)]


def test_an_order_sent_back_under_its_old_customer_keeps_a_later_change_of_the_remote(world: World) -> None:
    # hq refuses rep1's handover of order 10 to customer 3 (deleted at hq) and
    # sends the order back whole, under customer 1; rep1 changed its note
    # since, which hq applies after: rep1 keeps its note, not customer 3.
    hq, rep1 = world.hq, world.remotes["rep1"]
    world.app("rep1", "UPDATE orders SET customer_id = 3 WHERE id = 10")
    world.app("hq", *DELETE_CUSTOMER_3)
    replicate(rep1, hq)
    world.app("rep1", "UPDATE orders SET note = 'later at rep1' WHERE id = 10")
    replicate(hq, rep1)
    assert rep1.connection.execute("SELECT customer_id, note FROM orders WHERE id = 10").fetchall() == [
        (1, "later at rep1")]
    world.sync()
    world.check()
    assert world.held("hq", "SELECT customer_id, note FROM orders WHERE id = 10") == [
        (1, "later at rep1")]


def test_a_line_written_under_an_order_that_left_the_remote_and_comes_back_later_comes_with_it(
        world: World) -> None:
    # rep1 writes a line under order 10, applies hq's handover of the order to
    # customer 2 (the line goes with it), and hq moves customer 2 to rep 1
    # before it applies the line: that move brings order 10 back without the
    # line, which hq sends whole (it knows rep1 wrote it before the order left).
    hq, rep1 = world.hq, world.remotes["rep1"]
    world.app("rep1", "INSERT INTO order_line VALUES (120, 10, 5)")
    world.app("hq", "UPDATE orders SET customer_id = 2 WHERE id = 10")
    replicate(hq, rep1)
    world.app("hq", "UPDATE customer SET rep = 1 WHERE id = 2")
    replicate(rep1, hq)
    world.sync()
    world.check()
    assert rep1.connection.execute("SELECT id FROM order_line WHERE order_id = 10 ORDER BY id").fetchall() == [
        (100,), (120,)]


def test_a_child_changed_at_a_remote_reaches_every_subscriber_of_its_parent(world: World) -> None:
    world.app("rep1", "UPDATE orders SET note = 'changed at rep1' WHERE id = 10",
              "DELETE FROM order_line WHERE id = 100", "INSERT INTO order_line VALUES (102, 11, 7)",
              "INSERT INTO orders VALUES (12, 3, 'new at rep1')")
    world.sync()
    world.check()
    assert world.remotes["rep3"].connection.execute("SELECT note FROM orders WHERE id IN (10, 12) ORDER BY id"
                                                    ).fetchall() == [("changed at rep1",), ("new at rep1",)]
    assert world.remotes["rep3"].connection.execute("SELECT id FROM order_line WHERE order_id IN (10, 11)"
                                                    " ORDER BY id").fetchall() == [(101,), (102,)]
    assert world.errors() == {}


def test_a_child_written_at_a_remote_for_a_parent_the_consolidated_deleted(world: World) -> None:
    hq, rep1 = world.hq, world.remotes["rep1"]
    world.app("rep1", "INSERT INTO orders VALUES (31, 3, 'late')")
    world.app("hq", "DELETE FROM order_line WHERE order_id = 30", "DELETE FROM orders WHERE customer_id = 3",
              "DELETE FROM customer WHERE id = 3")
    replicate(rep1, hq)
    world.sync()
    world.check()
    assert [(error.table, error.key) for error in hq.apply_errors()] == [("orders", (31,))]
    assert world.errors().keys() == {"hq"}
    assert rep1.connection.execute("SELECT count(*) FROM orders WHERE id = 31").fetchone() == (0,)
