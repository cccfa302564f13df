"""Child-process bodies for the multi-process site tests (imported by the
``spawn`` start method, so they live in a module, not in a test)."""

from __future__ import annotations

import random
import sqlite3
import time


def write_transactions(path: str, count: int, seed: int) -> None:
    """Commit ``count`` application transactions of 1-12 rows each into
    ``event``; every row carries its transaction number and size."""
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    for txn in range(1, count + 1):
        size = rng.randint(1, 12)
        conn.execute("BEGIN")
        for position in range(size):
            conn.execute("INSERT INTO event (txn, size, pos, payload) VALUES (?, ?, ?, ?)",
                         (txn, size, position, "x" * rng.randint(0, 200)))
            if position == size // 2:
                time.sleep(rng.choice([0, 0, 0.0005]))  # a transaction stays open a while
        conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1")
        conn.execute("COMMIT")
        time.sleep(rng.choice([0, 0.0005, 0.001]))  # let the scanner in
    conn.close()


CRASH_BASE_ROWS = 2000


def crash_setup(site) -> None:  # type: ignore[no-untyped-def]
    """Publish ``item`` at ``site`` (either backend) to peer ``peer`` and
    apply its base rows from it (commit 5), for the crash tests."""
    from codec.ops import Operation, Transaction

    site.create_publication("p", ["item"])
    site.add_remote("peer")
    site.subscribe("peer", "p")
    base = [Operation.insert("item", (i,), {"id": i, "payload": "base", "n": 0})
            for i in range(1, CRASH_BASE_ROWS + 1)]
    site.apply("peer", [Transaction(5, "peer", tuple(base))], log_received=5)


def crash_batch(first_commit: int, rows: int, per_transaction: int):
    """A peer batch for the crash test: ``rows`` operations on ``item`` (new
    rows, and every tenth an UPDATE of a base row), ``per_transaction`` per
    transaction.  Returns (transactions, log_received)."""
    from codec.ops import Operation, Transaction

    transactions = []
    ops = []
    commit = first_commit
    for index in range(rows):
        if index % 10 == 9 and index // 10 < CRASH_BASE_ROWS:
            row_id = index // 10 + 1
            ops.append(Operation.update("item", (row_id,), {"n": 0}, {"n": index}))
        else:
            row_id = 100_000 + index
            ops.append(Operation.insert("item", (row_id,), {"id": row_id, "payload": f"row {index} " + "p" * 40,
                                                            "n": index}))
        if len(ops) == per_transaction or index == rows - 1:
            commit += 7
            transactions.append(Transaction(commit, "peer", tuple(ops)))
            ops = []
    return transactions, commit + 3


def apply_batch(path: str, peer: str, batch_start: int, rows: int, per_transaction: int, ready, done) -> None:
    """Apply one large batch from ``peer`` (see crash_batch); the parent
    kills this process at a random moment."""
    from agent.site import SiteDatabase

    site = SiteDatabase.open(path)
    transactions, log_received = crash_batch(batch_start, rows, per_transaction)
    ready.set()
    site.apply(peer, transactions, log_received=log_received)
    done.set()
    site.close()


def churn_orders(path: str, seed: int, started, stop) -> None:
    """Write to ``orders`` until told to stop: multi-row transactions of
    inserts, updates (some moving rows between regions) and deletes."""
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    next_id = 100_000
    first = True
    while not stop.is_set():
        conn.execute("BEGIN IMMEDIATE")
        ids = [row[0] for row in conn.execute("SELECT id FROM orders ORDER BY random() LIMIT 6")]
        for _ in range(rng.randint(1, 6)):
            roll = rng.random()
            if roll < 0.4 or not ids:
                next_id += 1
                conn.execute("INSERT INTO orders (id, region, qty, note) VALUES (?, ?, ?, ?)",
                             (next_id, rng.choice(["north", "south", "east"]), rng.randint(1, 50),
                              f"order {next_id}"))
            elif roll < 0.7:
                conn.execute("UPDATE orders SET qty = qty + 1, note = ? WHERE id = ?",
                             (f"changed {rng.random()}", rng.choice(ids)))
            elif roll < 0.9:
                conn.execute("UPDATE orders SET region = ? WHERE id = ?",
                             (rng.choice(["north", "south", "east"]), rng.choice(ids)))
            else:
                victim = rng.choice(ids)
                ids.remove(victim)
                conn.execute("DELETE FROM orders WHERE id = ?", (victim,))
        conn.execute("COMMIT")
        if first:
            started.set()
            first = False
        time.sleep(0.0005)
    conn.close()
