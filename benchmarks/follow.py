"""Rows that follow their parent: what routing a child costs.

Workload: a three-level chain (customer, its orders, their lines) at a
consolidated with ``--subscribers`` remotes (1,000), each subscribed to one
rep's customers; ``--operations`` (100,000) application writes in
transactions of 100: inserts at every level, updates of orders and lines,
and some customers moved to another rep (their orders and lines move with
them).

* follow: the chain published as ``customer@rep``, ``orders@->customer``,
  ``order_line@->orders`` (the route looked up at capture,
  agent/site/sqlite/route.py);
* column: the same tables, each child with a ``rep`` column of its own kept
  equal to its customer's by the application, published as
  ``customer@rep``, ``orders@rep``, ``order_line@rep``: the rows routed by
  a column of their own, the baseline.

Each figure is the application's writes plus one pass reading the log for
every subscriber (``read_logs``, the agent's send phase), per operation;
``ratio`` is column over follow.  Run: ``python -m benchmarks.follow --json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from agent.site import Article, SiteDatabase

FOLLOW = ["CREATE TABLE customer (id INTEGER PRIMARY KEY, rep INTEGER NOT NULL, name TEXT)",
          "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer (id), note TEXT)",
          "CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER REFERENCES orders (id), qty INTEGER)",
          "CREATE INDEX orders_customer ON orders (customer_id)",
          "CREATE INDEX line_order ON order_line (order_id)"]
COLUMN = ["CREATE TABLE customer (id INTEGER PRIMARY KEY, rep INTEGER NOT NULL, name TEXT)",
          "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, rep INTEGER, note TEXT)",
          "CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER, rep INTEGER, qty INTEGER)",
          "CREATE INDEX orders_customer ON orders (customer_id)",
          "CREATE INDEX line_order ON order_line (order_id)"]


def _site(path: Path, follow: bool, subscribers: int) -> SiteDatabase:
    site = SiteDatabase.init(path, name="hq", role="consolidated")
    for statement in FOLLOW if follow else COLUMN:
        site.connection.execute(statement)
    children = ([Article("orders", follows="customer"), Article("order_line", follows="orders")] if follow
                else [Article("orders", subscribe_by="rep"), Article("order_line", subscribe_by="rep")])
    site.create_publication("sales", [Article("customer", subscribe_by="rep"), *children])
    for number in range(subscribers):
        site.add_remote(f"rep{number}")
        site.subscribe(f"rep{number}", "sales", number)
    return site


def _write(site: SiteDatabase, follow: bool, operations: int, subscribers: int, seed: int) -> None:
    """The application's writes (the same draws for both layouts)."""
    rng = random.Random(seed)
    app = site.connection
    customers: dict[int, int] = {}
    orders: dict[int, int] = {}
    lines = 0
    done = 0
    while done < operations:
        app.execute("BEGIN")
        for _ in range(100):
            roll = rng.random()
            if roll < 0.1 or len(customers) < 10:
                number = len(customers) + 1
                customers[number] = rng.randrange(subscribers)
                app.execute("INSERT INTO customer VALUES (?, ?, 'c')", (number, customers[number]))
            elif roll < 0.35 or not orders:
                number = len(orders) + 1
                orders[number] = rng.randint(1, len(customers))
                app.execute("INSERT INTO orders VALUES (?, ?, ?, 'o')" if not follow
                            else "INSERT INTO orders VALUES (?, ?, 'o')",
                            (number, orders[number], customers[orders[number]]) if not follow
                            else (number, orders[number]))
            elif roll < 0.8:
                lines += 1
                order = rng.randint(1, len(orders))
                rep = customers[orders[order]]
                app.execute("INSERT INTO order_line VALUES (?, ?, ?, 1)" if not follow
                            else "INSERT INTO order_line VALUES (?, ?, 1)",
                            (lines, order, rep) if not follow else (lines, order))
            elif roll < 0.98:
                app.execute("UPDATE order_line SET qty = qty + 1 WHERE id = ?", (rng.randint(1, max(lines, 1)),))
            else:  # a customer changes hands: its orders and lines go with it
                number = rng.randint(1, len(customers))
                customers[number] = rng.randrange(subscribers)
                app.execute("UPDATE customer SET rep = ? WHERE id = ?", (customers[number], number))
                if not follow:
                    app.execute("UPDATE orders SET rep = ? WHERE customer_id = ?", (customers[number], number))
                    app.execute("UPDATE order_line SET rep = ? WHERE order_id IN (SELECT id FROM orders"
                                " WHERE customer_id = ?)", (customers[number], number))
            done += 1
        app.execute("COMMIT")
        site.scan()


def _measure(folder: Path, follow: bool, operations: int, subscribers: int, seed: int) -> tuple[float, int]:
    site = _site(folder / ("follow.db" if follow else "column.db"), follow, subscribers)
    try:
        start = site.log_end()
        began = time.perf_counter()
        _write(site, follow, operations, subscribers, seed)
        selected = sum(len(transaction.ops) for _, transaction in site.read_logs(
            [(f"rep{number}", start, None) for number in range(subscribers)]))
        return time.perf_counter() - began, selected
    finally:
        site.close()


def run(operations: int, subscribers: int, rounds: int, seed: int) -> dict:
    best: dict[str, float] = {}
    selected: dict[str, int] = {}
    for round_number in range(rounds):
        for name, follow in (("follow", True), ("column", False)):
            with tempfile.TemporaryDirectory(prefix="fieldsync-follow-") as folder:
                elapsed, count = _measure(Path(folder), follow, operations, subscribers, seed)
            best[name] = min(best.get(name, elapsed), elapsed)
            selected[name] = count
    if selected["follow"] != selected["column"]:
        raise AssertionError(f"the layouts selected different operations: {selected}")
    return {"benchmark": "follow", "operations": operations, "subscribers": subscribers, "rounds": rounds,
            "selected_operations": selected["follow"],
            "follow_us_per_op": round(best["follow"] / operations * 1e6, 2),
            "column_us_per_op": round(best["column"] / operations * 1e6, 2),
            "ratio": round(best["column"] / best["follow"], 3), "target_ratio": 0.5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.follow", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--operations", type=int, default=100_000)
    parser.add_argument("--subscribers", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    result = run(args.operations, args.subscribers, args.rounds, args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
