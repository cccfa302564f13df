"""Rows that follow their parent at a PostgreSQL consolidated, where it
differs from a SQLite one (agent/site/postgres/route.py; docs/postgres.md,
"Rows that follow their parent"; what both do alike is
tests/site/both/test_follow.py): a child written while another session
moves its parent ends where the parent is, whichever commits first;
subscribers reading the log while writers move customers and hand orders
about each end with exactly their customers' orders and lines; a
followed table an application drops does not stop its parent's moves."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest
from psycopg import errors as pg_errors

from agent.site import Article, PublicationError
from agent.site.postgres.connect import connect
from agent.site.postgres.site import PostgresSite
from codec.ops import OpKind, operations_of

from .replay import Copy

TABLES = (
    "CREATE TABLE customer (id integer PRIMARY KEY, name text, rep integer)",
    "CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer REFERENCES customer (id), note text)",
    "CREATE TABLE order_line (id integer PRIMARY KEY, order_id integer REFERENCES orders (id), qty integer)",
)
REPS = {"rep1": 1, "rep2": 2, "rep3": 3}
CUSTOMERS = 12
WRITERS = 4


@pytest.fixture
def hq(target, tmp_path):
    with connect(target) as setup:
        for statement in TABLES:
            setup.execute(statement)
    site = PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "hq-home",
                             address="inbox/hq", transport="folder")
    site.create_publication("sales", [Article("customer", subscribe_by="rep"), Article("orders", follows="customer"),
                                      Article("order_line", follows="orders")])
    for name, rep in REPS.items():
        site.add_remote(name)
        site.subscribe(name, "sales", rep)
    yield site
    site.close()


def _owed(app: psycopg.Connection, rep: int) -> dict[str, list[tuple]]:
    return {
        "customer": app.execute("SELECT * FROM customer WHERE rep = %s ORDER BY id", (rep,)).fetchall(),
        "orders": app.execute("SELECT o.* FROM orders o JOIN customer c ON c.id = o.customer_id WHERE c.rep = %s"
                              " ORDER BY o.id", (rep,)).fetchall(),
        "order_line": app.execute("SELECT l.* FROM order_line l JOIN orders o ON o.id = l.order_id JOIN customer c"
                                  " ON c.id = o.customer_id WHERE c.rep = %s ORDER BY l.id", (rep,)).fetchall(),
    }


def _held(copy: Copy) -> dict[str, list[tuple]]:
    return {table: copy.rows(table) for table in ("customer", "orders", "order_line")}


def _ops(site: PostgresSite, remote: str, after: int) -> list[tuple]:
    end = site.scan()
    return [(op.table, op.kind, op.key) for transaction in site.read_log(remote, after, end)
            for op in operations_of(transaction.ops)]


def test_a_child_written_while_its_parent_moves_goes_where_the_parent_goes(hq, target):
    """The route look-up locks the parent FOR SHARE: a move of the parent
    waits for a session that wrote a child under it, and a child written
    under a parent being moved waits for the move and reads its new route."""
    app, other = connect(target), connect(target)
    try:
        app.execute("INSERT INTO customer VALUES (1, 'c1', 1), (2, 'c2', 1)")
        start = hq.scan()
        # A child first: the move waits for it (a short lock_timeout shows it), then takes it along.
        with app.transaction():
            app.execute("INSERT INTO orders VALUES (10, 1, 'first')")
            with pytest.raises(pg_errors.LockNotAvailable):
                with other.transaction():
                    other.execute("SET LOCAL lock_timeout = '200ms'")
                    other.execute("UPDATE customer SET rep = 2 WHERE id = 1")
        other.execute("UPDATE customer SET rep = 2 WHERE id = 1")
        # The move first: the child waits for it and reads the new route.
        done = threading.Event()
        with other.transaction():
            other.execute("UPDATE customer SET rep = 3 WHERE id = 2")

            def insert() -> None:
                app.execute("INSERT INTO orders VALUES (20, 2, 'second')")
                done.set()

            writer = threading.Thread(target=insert)
            writer.start()
            assert not done.wait(0.3)  # waiting for the move to commit
        writer.join(10)
        assert done.is_set()
        held = {}
        for name in REPS:
            copy = Copy()
            copy.apply(op for transaction in hq.read_log(name, 0, hq.scan()) for op in operations_of(transaction.ops))
            assert copy.problems == [], name
            held[name] = _held(copy)
            assert held[name] == _owed(app, REPS[name]), name
        assert [row[0] for row in held["rep2"]["orders"]] == [10]
        assert [row[0] for row in held["rep3"]["orders"]] == [20] and held["rep1"]["orders"] == []
        # Order 20 never reached rep 1: it was written under customer 2's new route.
        assert ("orders", OpKind.INSERT, (20,)) not in _ops(hq, "rep1", start)
    finally:
        app.close()
        other.close()


def test_subscribers_hold_their_customers_orders_and_lines_while_writers_move_them(hq, target):
    """Four writers move customers between reps, add orders and lines, hand
    orders to other customers, change and delete lines, some pausing
    before they commit, while the log is cut and read every 10 ms; each
    rep's copy, replayed strictly from what it read, ends equal to its
    customers, their orders and their lines."""
    setup = connect(target)
    setup.execute("INSERT INTO customer SELECT n, 'c' || n, 1 + n %% 3 FROM generate_series(1, %s) n", (CUSTOMERS,))
    copies = {name: Copy() for name in REPS}
    stop = threading.Event()
    failures: list[BaseException] = []
    counts = {"transactions": 0, "refused": 0, "moves": 0}

    def writer(number: int) -> None:
        rng = random.Random(number)
        conn = connect(target)
        next_id = number * 1_000_000
        orders: list[int] = []
        lines: list[int] = []
        try:
            while not stop.is_set():
                try:
                    with conn.transaction():
                        for _ in range(rng.randint(1, 3)):
                            roll = rng.random()
                            if roll < 0.2:
                                conn.execute("UPDATE customer SET rep = %s WHERE id = %s",
                                             (rng.randint(1, 3), rng.randint(1, CUSTOMERS)))
                                counts["moves"] += 1
                            elif roll < 0.45 or not orders:
                                next_id += 1
                                conn.execute("INSERT INTO orders VALUES (%s, %s, 'new')",
                                             (next_id, rng.randint(1, CUSTOMERS)))
                                orders.append(next_id)
                            elif roll < 0.7:
                                next_id += 1
                                conn.execute("INSERT INTO order_line SELECT %s, id, 1 FROM orders WHERE id = %s",
                                             (next_id, rng.choice(orders)))
                                lines.append(next_id)
                            elif roll < 0.8:
                                conn.execute("UPDATE orders SET customer_id = %s, note = 'handed' WHERE id = %s",
                                             (rng.randint(1, CUSTOMERS), rng.choice(orders)))
                            elif roll < 0.9 and lines:
                                conn.execute("UPDATE order_line SET qty = qty + 1 WHERE id = %s", (rng.choice(lines),))
                            elif lines:
                                gone = lines.pop(rng.randrange(len(lines)))
                                conn.execute("DELETE FROM order_line WHERE id = %s", (gone,))
                        if rng.random() < 0.05:
                            time.sleep(0.005)
                    counts["transactions"] += 1
                except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                    counts["refused"] += 1
        except BaseException as error:  # noqa: BLE001  (reported below)
            failures.append(error)
            stop.set()
        finally:
            conn.close()

    ends = [0]

    def read_step() -> None:
        end = hq.scan()
        for name, copy in copies.items():
            for transaction in hq.read_log(name, ends[-1], end):
                copy.apply(operations_of(transaction.ops))
        ends.append(end)

    threads = [threading.Thread(target=writer, args=(number,)) for number in range(1, WRITERS + 1)]
    for thread in threads:
        thread.start()
    # At least 3 s of writing, and on until the writers have done the work
    # the assertions below count on: a slow machine writes longer, not less.
    started = time.monotonic()

    def writing() -> bool:
        elapsed = time.monotonic() - started
        enough = counts["transactions"] > 200 and counts["moves"] > 20
        return elapsed < 3 or (not enough and elapsed < 60)

    try:
        while writing() and not stop.is_set():
            read_step()
            time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not failures, failures
    read_step()
    assert counts["transactions"] > 200 and counts["moves"] > 20, counts
    for name, rep in REPS.items():
        assert copies[name].problems == [], (name, copies[name].problems[:5])
        assert _held(copies[name]) == _owed(setup, rep), name
    setup.close()


def test_a_followed_table_an_application_dropped_does_not_stop_its_parents_moves(hq, target):
    with connect(target) as app:
        app.execute("INSERT INTO customer VALUES (1, 'c1', 1)")
        app.execute("INSERT INTO orders VALUES (10, 1, 'a')")
        app.execute("INSERT INTO order_line VALUES (100, 10, 1)")
        app.execute("DROP TABLE order_line")
        end = hq.scan()
        app.execute("UPDATE customer SET rep = 2 WHERE id = 1")
    assert sorted(_ops(hq, "rep2", end)) == [("customer", OpKind.INSERT, (1,)), ("orders", OpKind.INSERT, (10,))]


def _shape_routes(site: PostgresSite, table: str) -> list:
    """The route kind of the shape each article of ``table`` names."""
    return [kind for (kind,) in site.connection.execute(
        "SELECT s.route_kind FROM fieldsync.article a JOIN fieldsync.shape s ON s.id = a.shape"
        " WHERE a.table_name = %s ORDER BY a.publication", (table,))]


def test_a_table_that_follows_in_one_publication_is_published_plainly_in_another(hq, target):
    """A table follows a parent in one publication, and a parent is followed
    in one; published plainly elsewhere as well, its rows keep their
    route, and its subscribers of both get each row once."""
    app = connect(target)
    try:
        app.execute("CREATE TABLE visit (id integer PRIMARY KEY, customer_id integer REFERENCES customer (id))")
        app.execute("INSERT INTO customer VALUES (1, 'c1', 1), (2, 'c2', 2)")
        app.execute("INSERT INTO orders VALUES (10, 1, 'x'), (20, 2, 'y')")
        hq.create_publication("notes", [Article("orders", columns=["note"])])  # every order's note
        assert _shape_routes(hq, "orders") == ["integer", "integer"]  # one capture, with the route
        with pytest.raises(PublicationError, match="'orders' follows its parent in 'sales' already"):
            hq.create_publication("other", [Article("customer", subscribe_by="rep"),
                                            Article("orders", follows="customer")])
        with pytest.raises(PublicationError, match="rows follow 'customer' in 'sales' already"):
            hq.create_publication("other", [Article("customer", subscribe_by="rep"),
                                            Article("visit", follows="customer")])
        assert [item.name for item in hq.publications()] == ["notes", "sales"]
        hq.subscribe("rep1", "notes")
        app.execute("UPDATE customer SET rep = 2 WHERE id = 1")  # order 10 leaves sales for rep1; notes keeps it
        app.execute("UPDATE orders SET note = 'z' WHERE id = 20")
        copy = Copy()
        copy.apply(op for transaction in hq.read_log("rep1", 0, hq.scan()) for op in operations_of(transaction.ops))
        assert copy.problems == []
        assert copy.tables["orders"] == {(10,): {"id": 10, "customer_id": None, "note": "x"},
                                         (20,): {"id": 20, "customer_id": None, "note": "z"}}
        # Without its follow, orders is captured with no route: its parent may go.
        hq.remove_article("order_line")
        hq.remove_article("orders", "sales")
        assert _shape_routes(hq, "orders") == [None]
        hq.drop_publication("sales")
        app.execute("ALTER TABLE orders DROP CONSTRAINT orders_customer_id_fkey")
        app.execute("DROP TABLE customer CASCADE")  # and visit's key
        start = hq.scan()
        app.execute("UPDATE orders SET note = 'w' WHERE id = 10")
        assert _ops(hq, "rep1", start) == [("orders", OpKind.UPDATE, (10,))]
    finally:
        app.close()
