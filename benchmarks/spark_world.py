"""A consolidated site with a large outbound backlog, for the Spark batch
tests and benchmark.

The log holds what the Spark path must get right: a SUBSCRIBE BY table whose
rows move between subsets, rows deleted and inserted again in one
transaction, a column-restricted article every subscriber receives, a
subscriber with two values, one subscribed with NULL (it matches nothing),
one not subscribed to the catalog, and transactions applied from remotes,
some of them conflicting (so rows are written back to their origin and must
not echo to it).

Building stays linear in the log size: the application's connection does
not sync (the world needs no durability), and a remote that sends a
transaction has confirmed what it was sent up to its previous one, so the
consolidated's unconfirmed rule checks that stretch of the log, not the
whole log, at each apply.  When the world is built every remote is back at
``log_sent = confirm_sent = 0``: its backlog is the whole log.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from agent.admin import init_site
from agent.site import Article, SiteDatabase
from codec.ops import Operation, OpKind, Transaction

ORDERS = ("CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT NOT NULL, qty INTEGER, note TEXT,"
          " price REAL)")
PRODUCT = "CREATE TABLE product (sku TEXT PRIMARY KEY, name TEXT, price REAL, secret TEXT)"


def subscriber_names(count: int) -> list[str]:
    return [f"field{index:03d}" for index in range(1, count + 1)]


def region_of(index: int, regions: int) -> str:
    return f"region{index % regions:03d}"


def build_world(directory: Path, operations: int, subscribers: int, *, seed: int = 1,
                scan_every: int = 40) -> SiteDatabase:
    """Make ``hq.db`` in ``directory`` whose log holds about ``operations``
    capture rows after the remotes were added; return it open."""
    rng = random.Random(seed)
    path = directory / "hq.db"
    site = init_site(path, name="hq", role="consolidated", address=str(directory / "hq-inbox"))
    app = sqlite3.connect(path, isolation_level=None)
    app.execute("PRAGMA synchronous=OFF")
    app.execute(ORDERS)
    app.execute(PRODUCT)
    site.create_publication("sales", [Article("orders", subscribe_by="region")])
    site.create_publication("catalog", [Article("product", columns=("name", "price"))])
    regions = max(1, subscribers)
    names = subscriber_names(subscribers)
    for index, name in enumerate(names):
        site.add_remote(name, address=str(directory / f"{name}-inbox"), transport="folder", start=0)
        if index == 1 and subscribers > 2:
            site.subscribe(name, "sales", None)  # NULL matches no row
        else:
            site.subscribe(name, "sales", region_of(index, regions))
        if index == 2 and subscribers > 3:
            site.subscribe(name, "sales", region_of(index + 1, regions))
        if index != 3:
            site.subscribe(name, "catalog")
    done = 0
    next_id = 1
    live: list[int] = []
    products = [f"sku{index:05d}" for index in range(200)]
    app.execute("BEGIN")
    app.executemany("INSERT INTO product VALUES (?, ?, ?, 'x')", [(sku, sku, 1.0) for sku in products])
    app.execute("COMMIT")
    done += len(products)
    remote_commit: dict[str, int] = {}
    confirmed: dict[str, int] = {}
    transactions = 0
    while done < operations:
        transactions += 1
        if rng.random() < 0.02 and live:
            done += _remote_transaction(site, rng, names, live, remote_commit, confirmed, regions)
            continue
        size = min(operations - done, rng.choice((1, 2, 5, 10, 30, 100)))
        app.execute("BEGIN")
        for _ in range(size):
            roll = rng.random()
            if roll < 0.45 or len(live) < 10:
                region = f"region{rng.randrange(regions):03d}"
                app.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                            (next_id, region, rng.randrange(100), f"note {next_id}", rng.random() * 100))
                live.append(next_id)
                next_id += 1
                done += 1
            elif roll < 0.75:
                app.execute("UPDATE orders SET qty = ?, note = ? WHERE id = ?",
                            (rng.randrange(100), f"changed {done}", rng.choice(live)))
                done += 1
            elif roll < 0.85:  # moves the row to another subscriber's subset
                app.execute("UPDATE orders SET region = ? WHERE id = ?",
                            (f"region{rng.randrange(regions):03d}", rng.choice(live)))
                done += 1
            elif roll < 0.90:  # deleted and inserted again in one transaction
                row_id = rng.choice(live)
                row = app.execute("SELECT * FROM orders WHERE id = ?", (row_id,)).fetchone()
                app.execute("DELETE FROM orders WHERE id = ?", (row_id,))
                app.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", (row[0], row[1], row[2] + 1, row[3], row[4]))
                done += 2
            elif roll < 0.96:
                app.execute("UPDATE product SET price = ?, secret = ? WHERE sku = ?",
                            (rng.random(), str(done), rng.choice(products)))
                done += 1
            else:
                row_id = live.pop(rng.randrange(len(live)))
                app.execute("DELETE FROM orders WHERE id = ?", (row_id,))
                done += 1
        app.execute("COMMIT")
        if transactions % scan_every == 0:
            site.scan()
    site.scan()
    app.close()
    # Offsets only go back by hand: nothing was really sent to the remotes.
    site.connection.execute("UPDATE fieldsync_remote SET log_sent = 0, confirm_sent = 0")
    return site


def _remote_transaction(site: SiteDatabase, rng: random.Random, names: list[str], live: list[int],
                        remote_commit: dict[str, int], confirmed: dict[str, int], regions: int) -> int:
    """A transaction from a remote, applied at hq; every other one conflicts.
    The remote has confirmed the log up to its previous transaction."""
    peer = rng.choice(names)
    commit = remote_commit.get(peer, 0) + 1
    remote_commit[peer] = commit
    ops = []
    for _ in range(rng.randrange(1, 4)):
        row_id = rng.choice(live)
        current = site.connection.execute("SELECT qty, note FROM orders WHERE id = ?", (row_id,)).fetchone()
        if current is None:
            continue
        before = {"qty": current[0] if rng.random() < 0.5 else -1}  # -1 never matches: a conflict
        ops.append(Operation("orders", OpKind.UPDATE, (row_id,), before, {"qty": rng.randrange(100)}))
    if not ops:
        return 0
    if peer in confirmed:
        site.update_remote(peer, log_sent=confirmed[peer], confirm_sent=confirmed[peer])
    confirmed[peer] = site.log_end()
    site.apply(peer, [Transaction(commit, peer, tuple(ops))], log_received=commit)
    site.scan()
    return len(ops)
