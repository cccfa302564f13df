"""Rows that follow their parent (docs/site-database.md, "Rows that follow
their parent"), from the CLI alone on real files: a sales rep's customers,
their orders and the orders' lines, only the customer partitioned by a
column; moves carry the children."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sqlfiles import connected

from .conftest import Agent

SCHEMA = [
    "CREATE TABLE customer (id INTEGER PRIMARY KEY, rep INTEGER NOT NULL, name TEXT)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer (id), note TEXT)",
    "CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders (id),"
    " qty INTEGER)",
]
SUBSET = {
    "customer": "SELECT id, rep, name FROM customer WHERE rep = ? ORDER BY id",
    "orders": "SELECT o.id, o.customer_id, o.note FROM orders o JOIN customer c ON c.id = o.customer_id"
              " WHERE c.rep = ? ORDER BY o.id",
    "order_line": "SELECT l.id, l.order_id, l.qty FROM order_line l JOIN orders o ON o.id = l.order_id"
                  " JOIN customer c ON c.id = o.customer_id WHERE c.rep = ? ORDER BY l.id",
}
HELD = {"customer": "SELECT id, rep, name FROM customer ORDER BY id",
        "orders": "SELECT id, customer_id, note FROM orders ORDER BY id",
        "order_line": "SELECT id, order_id, qty FROM order_line ORDER BY id"}


def rows(path: Path, query: str, *parameters: object) -> list[tuple]:
    with connected(path) as conn:
        return conn.execute(query, parameters).fetchall()


def write(path: Path, *statements: str) -> None:
    with connected(path) as conn:
        for statement in statements:
            conn.execute(statement)


@pytest.fixture
def sales(tmp_path: Path, agent: Agent) -> dict[str, Path]:
    for site in ("hq", "rep1", "rep2"):
        (tmp_path / "inbox" / site).mkdir(parents=True)
    hq = tmp_path / "hq.db"
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox" / "hq").code == 0
    write(hq, *SCHEMA,
          *(f"INSERT INTO customer VALUES ({c}, {1 + c % 2}, 'customer {c}')" for c in range(1, 7)),
          *(f"INSERT INTO orders VALUES ({o}, {1 + o % 6}, 'order {o}')" for o in range(1, 13)),
          *(f"INSERT INTO order_line VALUES ({l}, {1 + l % 12}, {l})" for l in range(1, 31)))
    created = agent("publication", "create", hq, "sales", "customer@rep", "orders@->customer",
                    "order_line@->orders")
    assert created.code == 0, created.err
    assert "orders@customer_id->customer" in created.out and "order_line@order_id->orders" in created.out
    sites = {"hq": hq}
    for number in (1, 2):
        name = f"rep{number}"
        assert agent("remote", "add", hq, name, "--address", tmp_path / "inbox" / name,
                     "--subscribe", f"sales={number}").code == 0
        assert agent("extract", hq, name, tmp_path / f"{name}.db").code == 0
        sites[name] = tmp_path / f"{name}.db"
    return sites


def sync(agent: Agent, sites: dict[str, Path], rounds: int = 3) -> None:
    for _ in range(rounds):
        for path in sites.values():
            result = agent("run", path, "--once")
            assert result.code == 0, result.err


def check(sites: dict[str, Path]) -> None:
    for number in (1, 2):
        for table, query in SUBSET.items():
            assert rows(sites[f"rep{number}"], HELD[table]) == rows(sites["hq"], query, number), (number, table)


def test_extraction_gives_each_remote_its_customers_orders_and_lines(sales: dict[str, Path]) -> None:
    check(sales)
    assert rows(sales["rep1"], "SELECT count(*) FROM order_line") != [(0,)]


def test_a_moved_customer_takes_its_orders_and_lines_and_changes_reach_the_right_rep(
        sales: dict[str, Path], agent: Agent) -> None:
    sync(agent, sales)
    moved_orders = rows(sales["hq"], "SELECT id FROM orders WHERE customer_id = 3")
    assert moved_orders and rows(sales["rep2"], "SELECT id FROM orders WHERE customer_id = 3") == moved_orders
    write(sales["hq"], "UPDATE customer SET rep = 1 WHERE id = 3",  # rep 2 -> rep 1, with its orders and lines
          "INSERT INTO order_line VALUES (100, 2, 7)",  # a line at hq of an order of customer 2 (rep 1)
          "UPDATE orders SET customer_id = 4 WHERE id = 5")  # an order handed to customer 4 (rep 1 -> rep 2)
    write(sales["rep2"], "INSERT INTO orders VALUES (200, 5, 'from rep 2')",  # customer 5 is rep 2's
          "INSERT INTO order_line VALUES (201, 200, 1)")
    sync(agent, sales)
    check(sales)
    assert rows(sales["rep2"], "SELECT count(*) FROM customer WHERE id = 3") == [(0,)]
    assert rows(sales["rep2"], "SELECT count(*) FROM orders WHERE customer_id = 3") == [(0,)]
    assert rows(sales["rep1"], "SELECT id FROM orders WHERE customer_id = 3") == moved_orders
    assert rows(sales["hq"], "SELECT note FROM orders WHERE id = 200") == [("from rep 2",)]
    assert rows(sales["rep1"], "SELECT count(*) FROM orders WHERE id = 200") == [(0,)]
    assert rows(sales["rep2"], "SELECT qty FROM order_line WHERE id = 201") == [(1,)]


def test_a_subscription_change_moves_the_children_with_their_parents(sales: dict[str, Path], agent: Agent) -> None:
    sync(agent, sales)
    result = agent("remote", "subscribe", sales["hq"], "rep1", "sales=2")
    assert result.code == 0, result.err
    sync(agent, sales)
    for table, query in SUBSET.items():
        both = sorted(rows(sales["hq"], query, 1) + rows(sales["hq"], query, 2))
        assert rows(sales["rep1"], HELD[table]) == both, table
    assert agent("remote", "unsubscribe", sales["hq"], "rep1", "sales=1").code == 0
    sync(agent, sales)
    for table, query in SUBSET.items():
        assert rows(sales["rep1"], HELD[table]) == rows(sales["hq"], query, 2), table


def errors(sites: dict[str, Path]) -> dict[str, list[tuple]]:
    found = {name: rows(path, "SELECT table_name, key, problem FROM fieldsync_apply_error ORDER BY id")
             for name, path in sites.items()}
    return {name: problems for name, problems in found.items() if problems}


@pytest.mark.parametrize("first", ["rep1", "hq"])
def test_an_order_written_at_rep1_for_a_customer_hq_gave_rep2_goes_to_rep2(
        sales: dict[str, Path], agent: Agent, first: str) -> None:
    sync(agent, sales)
    write(sales["rep1"], "INSERT INTO orders VALUES (300, 2, 'written at rep 1')",  # customer 2 is rep 1's
          "INSERT INTO order_line VALUES (301, 300, 4)")
    write(sales["hq"], "UPDATE customer SET rep = 2 WHERE id = 2")
    # Which side hears of the other first: hq of the order, or rep1 of the move.
    order = [first] + [name for name in ("hq", "rep1", "rep2") if name != first]
    sync(agent, {name: sales[name] for name in order})
    check(sales)
    assert rows(sales["rep2"], "SELECT note FROM orders WHERE id = 300") == [("written at rep 1",)]
    assert rows(sales["rep2"], "SELECT qty FROM order_line WHERE id = 301") == [(4,)]
    assert rows(sales["rep1"], "SELECT count(*) FROM orders WHERE customer_id = 2") == [(0,)]
    assert errors(sales) == {}


def test_an_order_for_a_customer_hq_does_not_hold_is_an_apply_error_there(
        sales: dict[str, Path], agent: Agent) -> None:
    sync(agent, sales)
    write(sales["rep1"], "INSERT INTO orders VALUES (400, 99, 'no customer 99')")  # its foreign keys off
    write(sales["rep1"], "INSERT INTO orders VALUES (401, 2, 'after it')")
    sync(agent, sales)
    [(table, _key, problem)] = errors(sales)["hq"]
    assert table == "orders" and problem.startswith("constraint failed: no parent row: no customer row"), problem
    assert rows(sales["hq"], "SELECT id FROM orders WHERE id >= 400") == [(401,)]
    # hq sends its DELETE back: rep1 does not keep a row that reaches nobody.
    assert rows(sales["rep1"], "SELECT id FROM orders WHERE id >= 400 ORDER BY id") == [(401,)]
    assert errors(sales).keys() == {"hq"}
    status = agent("status", sales["hq"])
    assert status.code == 0 and "rep1" in status.out


def test_order_lines_rep1_changes_reach_every_remote_that_gets_their_customer(
        sales: dict[str, Path], agent: Agent) -> None:
    assert agent("remote", "subscribe", sales["hq"], "rep2", "sales=1").code == 0
    sync(agent, sales)
    line, gone = rows(sales["rep1"], "SELECT id FROM order_line ORDER BY id LIMIT 2")
    write(sales["rep1"], f"UPDATE order_line SET qty = 1000 WHERE id = {line[0]}",
          f"DELETE FROM order_line WHERE id = {gone[0]}")
    sync(agent, sales)
    assert rows(sales["rep2"], f"SELECT qty FROM order_line WHERE id = {line[0]}") == [(1000,)]
    assert rows(sales["rep2"], f"SELECT count(*) FROM order_line WHERE id = {gone[0]}") == [(0,)]
    assert rows(sales["hq"], f"SELECT count(*) FROM order_line WHERE id = {gone[0]}") == [(0,)]
    assert errors(sales) == {}


@pytest.mark.parametrize("articles, problem", [
    (("orders@->customer",), "'orders' follows 'customer', which is not an article of 'p'"),
    (("customer@rep", "customer2@->customer"), "no foreign key to 'customer'"),
    (("customer", "orders@->customer"), "starts at 'customer', which has no SUBSCRIBE BY column"),
    (("customer@rep", "orders@note->customer"), "has no foreign key (note) to 'customer'"),
    (("customer@rep", "twice@->customer"), "has 2 foreign keys to 'customer'; name the one to follow"),
    (("node@->node",), "which is not an article"),
])
def test_a_follow_that_cannot_hold_is_one_line_and_creates_nothing(
        tmp_path: Path, agent: Agent, articles: tuple[str, ...], problem: str) -> None:
    hq = tmp_path / "hq.db"
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "in").code == 0
    write(hq, *SCHEMA, "CREATE TABLE customer2 (id INTEGER PRIMARY KEY)",
          "CREATE TABLE twice (id INTEGER PRIMARY KEY, a INTEGER REFERENCES customer, b INTEGER REFERENCES customer)",
          "CREATE TABLE node (id INTEGER PRIMARY KEY, up INTEGER REFERENCES node (id))")
    result = agent("publication", "create", hq, "p", *articles)
    assert result.code == 1 and len(result.err_lines) == 1, result.err
    assert problem in result.err
    assert "no publications" in agent("publication", "list", hq).out.lower() or "p" not in [
        line.split()[0] for line in agent("publication", "list", hq).out.splitlines() if line.split()]
