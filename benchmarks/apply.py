"""Site database: applying a peer's transactions, and capture overhead.

Workload: 200,000 INSERTs of realistic 6-column rows, then 100,000 UPDATEs
of two columns, in transactions of 500 operations, applied at a
consolidated (so every UPDATE is checked against its before-image).

* apply: ``SiteDatabase.apply`` with one transaction of 500 operations per
  call (one SQLite commit each).  Operations are plain tuples, the form the
  message decoder hands over, so their validation is included.
* raw: ``executemany`` of the very same rows, 500 per transaction, into the
  same published table in another site database (the capture triggers fire
  in both, so the ratio is the adapter's own cost).  ``raw_unpublished_*``
  is the same into a table without triggers, for reference.
* capture: application inserts (``executemany``, 500 per transaction) into a
  published table versus the same table unpublished.

Both sides use the adapter's connection settings (WAL, synchronous=FULL).
Each figure is the best of alternating rounds.  Run:
``python -m benchmarks.apply --json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sqlite3
import sys
import tempfile
import time

from agent.site import Article, SiteDatabase
from agent.site._db import connect
from codec.ops import Transaction

TABLE = "customer"
SCHEMA = (f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, balance REAL,"
          " visits INTEGER, note TEXT)")
FIRST = ["Ana", "Bruno", "Chloé", "Dmitri", "Eun-ji", "Farid", "Greta", "Hiro", "Ines", "Jonas"]
LAST = ["Silva", "Moreau", "Novak", "Okafor", "Lindqvist", "Tanaka", "García", "Müller"]
CITIES = ["Lyon", "Tromsø", "Kraków", "Porto", "Nairobi", "Osaka", "Quito", "Hobart"]
BATCH = 500


def make_rows(count: int, seed: int) -> tuple[list[tuple], list[tuple]]:
    """Rows to insert, and (old, new) pairs for the updates of the first half."""
    rng = random.Random(seed)
    rows = []
    for row_id in range(1, count + 1):
        rows.append((row_id, f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.choice(CITIES),
                     round(rng.uniform(-500, 5000), 2), rng.randint(0, 300),
                     rng.choice([None, "prefers email", "call after 18:00", "VIP since 2019", "new address pending"])))
    updates = []
    for row in rows[: count // 2]:
        updates.append((row, (round(row[3] + rng.uniform(1, 100), 2), row[4] + 1)))
    return rows, updates


COLUMNS = ("id", "name", "city", "balance", "visits", "note")


def transactions(rows: list[tuple], updates: list[tuple]) -> tuple[list[Transaction], list[Transaction]]:
    inserts, changes = [], []
    commit = 0
    for start in range(0, len(rows), BATCH):
        commit += 1
        ops = tuple((TABLE, 1, (row[0],), None, dict(zip(COLUMNS, row))) for row in rows[start:start + BATCH])
        inserts.append(Transaction._trusted(commit, "peer", ops))
    for start in range(0, len(updates), BATCH):
        commit += 1
        ops = tuple((TABLE, 2, (old[0],), {"balance": old[3], "visits": old[4]},
                     {"balance": new[0], "visits": new[1]}) for old, new in updates[start:start + BATCH])
        changes.append(Transaction._trusted(commit, "peer", ops))
    return inserts, changes


def new_site(directory: str, name: str, published: bool = True) -> SiteDatabase:
    path = os.path.join(directory, f"{name}.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    site = SiteDatabase.init(path, name=name, role="consolidated")
    site.connection.execute(SCHEMA)
    if published:
        site.create_publication("main", [Article(TABLE)])
    site.add_remote("peer")
    return site


def run_apply(directory: str, inserts: list[Transaction], changes: list[Transaction]) -> tuple[float, float]:
    site = new_site(directory, "adapter")
    try:
        gc.collect()
        started = time.perf_counter()
        for transaction in inserts:
            site.apply("peer", (transaction,), log_received=transaction.commit)
        middle = time.perf_counter()
        for transaction in changes:
            site.apply("peer", (transaction,), log_received=transaction.commit)
        ended = time.perf_counter()
        count = site.connection.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]
        errors = site.connection.execute("SELECT count(*) FROM fieldsync_apply_error").fetchone()[0]
        conflicts = site.connection.execute("SELECT count(*) FROM fieldsync_conflict").fetchone()[0]
        if count != sum(len(t.ops) for t in inserts) or errors or conflicts:
            raise SystemExit(f"apply run went wrong: {count} rows, {errors} errors, {conflicts} conflicts")
        return middle - started, ended - middle
    finally:
        site.close()


def run_raw(directory: str, rows: list[tuple], updates: list[tuple], published: bool) -> tuple[float, float]:
    site = new_site(directory, "raw" if published else "raw_plain", published)
    conn: sqlite3.Connection = site.connection
    insert = f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)"
    update = f"UPDATE {TABLE} SET balance = ?, visits = ? WHERE id = ?"
    changes = [(new[0], new[1], old[0]) for old, new in updates]
    try:
        gc.collect()
        started = time.perf_counter()
        for start in range(0, len(rows), BATCH):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(insert, rows[start:start + BATCH])
            conn.execute("COMMIT")
        middle = time.perf_counter()
        for start in range(0, len(changes), BATCH):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(update, changes[start:start + BATCH])
            conn.execute("COMMIT")
        ended = time.perf_counter()
        return middle - started, ended - middle
    finally:
        site.close()


def run_capture(directory: str, rows: list[tuple], published: bool) -> float:
    """Application-side inserts (a plain sqlite3 connection, as an app would)."""
    site = new_site(directory, "app_pub" if published else "app_plain", published)
    path = site.path
    site.close()
    conn = connect(path)
    insert = f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)"
    try:
        gc.collect()
        started = time.perf_counter()
        for start in range(0, len(rows), BATCH):
            conn.execute("BEGIN")
            conn.executemany(insert, rows[start:start + BATCH])
            conn.execute("COMMIT")
        return time.perf_counter() - started
    finally:
        conn.close()


def measure(inserts_count: int, rounds: int, seed: int) -> dict:
    rows, updates = make_rows(inserts_count, seed)
    insert_txns, update_txns = transactions(rows, updates)
    capture_rows = rows[: inserts_count // 2]
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(seconds, best.get(name, float("inf")))

    with tempfile.TemporaryDirectory(prefix="fieldsync-bench-") as directory:
        for _ in range(rounds):
            raw_insert, raw_update = run_raw(directory, rows, updates, published=True)
            keep("raw_insert", raw_insert)
            keep("raw_update", raw_update)
            apply_insert, apply_update = run_apply(directory, insert_txns, update_txns)
            keep("apply_insert", apply_insert)
            keep("apply_update", apply_update)
            plain_insert, plain_update = run_raw(directory, rows, updates, published=False)
            keep("plain_insert", plain_insert)
            keep("plain_update", plain_update)
            keep("capture_published", run_capture(directory, capture_rows, published=True))
            keep("capture_unpublished", run_capture(directory, capture_rows, published=False))
    operations = len(rows) + len(updates)
    apply_seconds = best["apply_insert"] + best["apply_update"]
    raw_seconds = best["raw_insert"] + best["raw_update"]
    plain_seconds = best["plain_insert"] + best["plain_update"]
    published_rate = len(capture_rows) / best["capture_published"]
    unpublished_rate = len(capture_rows) / best["capture_unpublished"]
    return {
        "benchmark": "apply",
        "inserts": len(rows),
        "updates": len(updates),
        "transaction_size": BATCH,
        "rounds": rounds,
        "sqlite_version": sqlite3.sqlite_version,
        "apply_ops_per_s": round(operations / apply_seconds),
        "raw_ops_per_s": round(operations / raw_seconds),
        "apply_ratio": round(raw_seconds / apply_seconds, 3),
        "apply_insert_ops_per_s": round(len(rows) / best["apply_insert"]),
        "raw_insert_ops_per_s": round(len(rows) / best["raw_insert"]),
        "apply_update_ops_per_s": round(len(updates) / best["apply_update"]),
        "raw_update_ops_per_s": round(len(updates) / best["raw_update"]),
        "raw_unpublished_ops_per_s": round(operations / plain_seconds),
        "apply_vs_unpublished_ratio": round(plain_seconds / apply_seconds, 3),
        "capture_inserts": len(capture_rows),
        "published_insert_rows_per_s": round(published_rate),
        "unpublished_insert_rows_per_s": round(unpublished_rate),
        "capture_ratio": round(published_rate / unpublished_rate, 3),
        "targets": {"apply_ratio": 0.5, "capture_ratio": 0.4},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.apply", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--inserts", type=int, default=200_000, help="INSERTs to apply (UPDATEs: half as many)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is kept")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    result = measure(args.inserts, args.rounds, args.seed)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"apply {result['inserts']:,} INSERTs + {result['updates']:,} UPDATEs, {BATCH} per transaction "
          f"(SQLite {result['sqlite_version']}, best of {result['rounds']})")
    print(f"  adapter apply      {result['apply_ops_per_s']:>10,} ops/s "
          f"(insert {result['apply_insert_ops_per_s']:,}, update {result['apply_update_ops_per_s']:,})")
    print(f"  raw executemany    {result['raw_ops_per_s']:>10,} ops/s "
          f"(insert {result['raw_insert_ops_per_s']:,}, update {result['raw_update_ops_per_s']:,})")
    print(f"  apply_ratio        {result['apply_ratio']:>10}   (target >= 0.5)")
    print(f"  raw, no triggers   {result['raw_unpublished_ops_per_s']:>10,} ops/s "
          f"(apply / this = {result['apply_vs_unpublished_ratio']})")
    print(f"application inserts, {result['capture_inserts']:,} rows")
    print(f"  published table    {result['published_insert_rows_per_s']:>10,} rows/s")
    print(f"  unpublished table  {result['unpublished_insert_rows_per_s']:>10,} rows/s")
    print(f"  capture_ratio      {result['capture_ratio']:>10}   (target >= 0.4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
