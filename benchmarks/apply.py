"""Site database: applying a peer's transactions, and capture overhead.

Workload: 200,000 INSERTs of realistic 6-column rows, then 100,000 UPDATEs
of two columns, in transactions of 500 operations, applied at a
consolidated (so every UPDATE is checked against its before-image).

* apply: ``SiteDatabase.apply`` with one transaction of 500 operations per
  call (one SQLite commit each), in the form the agent's decoder hands over
  a version-2 message: runs of positional rows (codec.ops.Run), whose
  values are checked as they are applied.  ``apply_operations_*`` is the
  same with the operations as plain 5-tuples with row maps (a version-1
  message, or any caller of ``SiteDatabase.apply``), for reference.
* raw: ``executemany`` of the very same rows, 500 per transaction, into the
  same published table in another site database (the capture triggers fire
  in both, so the ratio is the adapter's own cost).  ``raw_unpublished_*``
  is the same into a table without triggers, for reference.
* capture: application inserts (``executemany``, 500 per transaction) into a
  published table versus the same table unpublished.
* unconfirmed: batches of 500 UPDATEs from a remote applied at a
  consolidated whose log holds a long stretch (``--unconfirmed`` offsets,
  by default five times ``--inserts``, so 1,000,000: the consolidated's
  own INSERTs and UPDATEs of other rows, in transactions of 500) that the
  remote receives and has not confirmed, so the unconfirmed rule runs for
  every batch (and finds nothing to send back).  Baselines in
  the same run, on the same database, with the remote's ``confirm_sent``
  set by hand: at the log end (nothing unconfirmed: the rule does nothing)
  and about 1,000 offsets before the end of the stretch.
  ``unconfirmed_flatness`` is the cost per batch with the long stretch over
  the cost with none.

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
from agent.site.sqlite._db import connect
from codec.ops import Run, Transaction, to_runs

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


def as_runs(transaction: Transaction) -> Transaction:
    """``transaction`` as a version-2 message decodes for the agent: its
    operations in runs, rows as tuples (codec.message, ``runs=True``)."""
    runs = tuple(run._replace(rows=tuple(run.rows)) for run in to_runs(transaction.ops))
    return Transaction._trusted(transaction.commit, transaction.origin, runs)


def transactions(rows: list[tuple], updates: list[tuple],
                 deletes: list[tuple] = ()) -> tuple[list[Transaction], list[Transaction]]:
    """The INSERTs of ``rows``, then the UPDATEs of ``updates`` and the
    DELETEs of the rows ``deletes`` (none by default), ``BATCH`` per
    transaction: the insert transactions, and the others."""
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
    for start in range(0, len(deletes), BATCH):
        commit += 1
        ops = tuple((TABLE, 3, (row[0],), dict(zip(COLUMNS, row)), None) for row in deletes[start:start + BATCH])
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
        inserted = sum(len(op.rows) if type(op) is Run else 1 for t in inserts for op in t.ops)
        if count != inserted or errors or conflicts:
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


def run_unconfirmed(directory: str, stretch: int, batches: int, rounds: int, seed: int) -> dict[str, float]:
    """Seconds per applied batch (best round) with nothing unconfirmed, a
    small and a long unconfirmed stretch (see the module docstring)."""
    rng = random.Random(seed)
    configs = ("none", "small", "long")
    site = new_site(directory, "unconfirmed")
    conn: sqlite3.Connection = site.connection
    app = sqlite3.connect(site.path, isolation_level=None)
    app.execute("PRAGMA synchronous = OFF")  # building the world needs no durability
    insert = f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)"
    try:
        # Rows the remote updates: every batch of every round gets fresh ones,
        # so no batch meets operations of an earlier one.
        touched = rounds * len(configs) * batches * BATCH
        rows, _ = make_rows(touched, seed)
        for start in range(0, len(rows), 5000):
            app.execute("BEGIN")
            app.executemany(insert, rows[start:start + 5000])
            app.execute("COMMIT")
        stretch_start = site.scan()
        # The stretch: INSERTs of other rows, then UPDATEs of them.
        inserted = stretch - stretch // 2
        others, _ = make_rows(inserted, seed + 1)
        others = [(touched + row[0], *row[1:]) for row in others]
        for start in range(0, len(others), BATCH):
            app.execute("BEGIN")
            app.executemany(insert, others[start:start + BATCH])
            app.execute("COMMIT")
            site.scan()
        changes = [(index, touched + 1 + index % inserted) for index in range(stretch // 2)]
        for start in range(0, len(changes), BATCH):
            app.execute("BEGIN")
            app.executemany(f"UPDATE {TABLE} SET visits = ? WHERE id = ?", changes[start:start + BATCH])
            app.execute("COMMIT")
            site.scan()
        stretch_end = site.log_end()
        small_start = conn.execute("SELECT max(commit_offset) FROM fieldsync_log WHERE commit_offset <= ?",
                                   (stretch_end - 1000,)).fetchone()[0]
        confirmed_at = {"long": stretch_start, "small": small_start}
        current = {row[0]: row for row in rows}
        next_row = 1
        commit = 0
        best: dict[str, float] = {}
        for _ in range(rounds):
            for config in configs:
                end = site.log_end()
                # By hand: the protocol never moves confirm_sent back.
                conn.execute("UPDATE fieldsync_remote SET log_sent = ?, confirm_sent = ? WHERE name = 'peer'",
                             (end, confirmed_at.get(config, end)))
                pending = []
                for _batch in range(batches):
                    commit += 1
                    ops = []
                    for row_id in range(next_row, next_row + BATCH):
                        old = current[row_id]
                        balance = round(rng.uniform(-500, 5000), 2)
                        ops.append((TABLE, 2, (row_id,), {"balance": old[3], "visits": old[4]},
                                    {"balance": balance, "visits": old[4] + 1}))
                    next_row += BATCH
                    pending.append(Transaction._trusted(commit, "peer", tuple(ops)))
                gc.collect()
                started = time.perf_counter()
                for transaction in pending:
                    site.apply("peer", (transaction,), log_received=transaction.commit)
                seconds = (time.perf_counter() - started) / batches
                best[config] = min(seconds, best.get(config, float("inf")))
        problems = [conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
                    for name in ("fieldsync_apply_error", "fieldsync_conflict", "fieldsync_returned")]
        if any(problems):
            raise SystemExit(f"unconfirmed run went wrong: errors, conflicts, rows sent back: {problems}")
        best["offsets"] = stretch_end - stretch_start
        return best
    finally:
        app.close()
        site.close()


def measure(inserts_count: int, rounds: int, seed: int, unconfirmed: int = 1_000_000, batches: int = 10) -> dict:
    rows, updates = make_rows(inserts_count, seed)
    op_inserts, op_updates = transactions(rows, updates)
    insert_txns, update_txns = [as_runs(t) for t in op_inserts], [as_runs(t) for t in op_updates]
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
            apply_insert, apply_update = run_apply(directory, op_inserts, op_updates)
            keep("operations_insert", apply_insert)
            keep("operations_update", apply_update)
            plain_insert, plain_update = run_raw(directory, rows, updates, published=False)
            keep("plain_insert", plain_insert)
            keep("plain_update", plain_update)
            keep("capture_published", run_capture(directory, capture_rows, published=True))
            keep("capture_unpublished", run_capture(directory, capture_rows, published=False))
        stretch = run_unconfirmed(directory, unconfirmed, batches, rounds, seed)
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
        "apply_operations_ratio": round(raw_seconds / (best["operations_insert"] + best["operations_update"]), 3),
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
        "unconfirmed_offsets": stretch["offsets"],
        "unconfirmed_batches": batches,
        "unconfirmed_long_batch_ms": round(stretch["long"] * 1000, 3),
        "unconfirmed_small_batch_ms": round(stretch["small"] * 1000, 3),
        "unconfirmed_none_batch_ms": round(stretch["none"] * 1000, 3),
        "unconfirmed_flatness": round(stretch["long"] / stretch["none"], 3),
        "unconfirmed_long_vs_small": round(stretch["long"] / stretch["small"], 3),
        "targets": {"apply_ratio": 0.85, "capture_ratio": 0.4, "unconfirmed_flatness": 1.5},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.apply", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--inserts", type=int, default=200_000, help="INSERTs to apply (UPDATEs: half as many)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is kept")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--unconfirmed", type=int, default=None,
                        help="offsets the remote has not confirmed in the unconfirmed-rule measurement "
                             "(default: five times --inserts)")
    parser.add_argument("--batches", type=int, default=10,
                        help="batches of 500 UPDATEs applied per round and stretch in that measurement")
    args = parser.parse_args(argv)
    if args.unconfirmed is None:
        args.unconfirmed = 5 * args.inserts
    if args.unconfirmed < 2000 or args.batches < 1:
        parser.error("--unconfirmed must be at least 2000 and --batches at least 1")
    result = measure(args.inserts, args.rounds, args.seed, args.unconfirmed, args.batches)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"apply {result['inserts']:,} INSERTs + {result['updates']:,} UPDATEs, {BATCH} per transaction "
          f"(SQLite {result['sqlite_version']}, best of {result['rounds']})")
    print(f"  adapter apply      {result['apply_ops_per_s']:>10,} ops/s "
          f"(insert {result['apply_insert_ops_per_s']:,}, update {result['apply_update_ops_per_s']:,})")
    print(f"  raw executemany    {result['raw_ops_per_s']:>10,} ops/s "
          f"(insert {result['raw_insert_ops_per_s']:,}, update {result['raw_update_ops_per_s']:,})")
    print(f"  apply_ratio        {result['apply_ratio']:>10}   (target >= 0.85; operations as maps: "
          f"{result['apply_operations_ratio']})")
    print(f"  raw, no triggers   {result['raw_unpublished_ops_per_s']:>10,} ops/s "
          f"(apply / this = {result['apply_vs_unpublished_ratio']})")
    print(f"application inserts, {result['capture_inserts']:,} rows")
    print(f"  published table    {result['published_insert_rows_per_s']:>10,} rows/s")
    print(f"  unpublished table  {result['unpublished_insert_rows_per_s']:>10,} rows/s")
    print(f"  capture_ratio      {result['capture_ratio']:>10}   (target >= 0.4)")
    print(f"batches of {BATCH} UPDATEs from a remote, {result['unconfirmed_offsets']:,} offsets unconfirmed by it")
    print(f"  per batch          {result['unconfirmed_long_batch_ms']:>10} ms "
          f"(about 1,000 unconfirmed: {result['unconfirmed_small_batch_ms']} ms, "
          f"none: {result['unconfirmed_none_batch_ms']} ms)")
    print(f"  unconfirmed_flatness {result['unconfirmed_flatness']:>8}   (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
