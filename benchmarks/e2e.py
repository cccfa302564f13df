"""End to end: replicate a consolidated's changes to one remote through the
folder transport, against raw ``executemany`` of the same rows.

Workload: 150,000 INSERTs then 50,000 UPDATEs of realistic 6-column rows,
written by the application in transactions of 500 operations.  The agent
scans after each application transaction (as a running agent scans every
send delay), and those scans are timed.  Then, timed:

* the consolidated's run: read the log for the remote, pack, compress, seal,
  sign, queue durably, write the files into the remote's inbox folder;
* the remote's run: read, verify, queue durably, decode, apply (with
  capture of the applied changes), confirm;
* the consolidated's run that takes the confirmation.

``ops_per_s`` is operations over the sum of those times.  The baseline,
measured in the same run, is ``executemany`` of the same rows, 500 per
transaction, into a fresh SQLite file (WAL, synchronous=FULL).

``floor_ratio`` compares the same run with the physical limit on this
machine, the least work both ends must do: read the changed rows at the
consolidated, write the same operations at a fresh SQLite file in one
durable transaction, and fsync once at the consolidated to record that
they went (``seconds.floor``; ``floor_ratio`` = floor over the run).

``peak_rss_mb`` comes from a child process that sends a backlog of
``--backlog`` operations (default 1,000,000) to a remote: the agent's
memory must not follow the backlog.

``--unscanned`` measures instead what a site coming back after days
offline costs: the application commits ``--unscanned-ops`` INSERTs
(default 1,000,000; 10,000,000 by option) in transactions of 500 before
the agent runs at all, so the first scan makes them one log transaction.
Then one ``run --once`` at the consolidated (``peak_rss_mb_sender``), one
at the remote (``peak_rss_mb_receiver``), and one taking the confirmation;
each in a child process that reports its ``ru_maxrss``.  The baseline is
the same agent's run with nothing to do (``peak_rss_mb_idle``).

Run: ``python -m benchmarks.e2e --json`` or
``python -m benchmarks.e2e --json --unscanned``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.admin import extract_site, init_site
from agent.runner import Agent, RunOptions
from agent.site import SiteDatabase
from agent.spool import check_spool

SCHEMA = ("CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, balance REAL,"
          " visits INTEGER, note TEXT)")
FIRST = ["Ana", "Bruno", "Chloé", "Dmitri", "Eun-ji", "Farid", "Greta", "Hiro", "Ines", "Jonas"]
LAST = ["Silva", "Moreau", "Novak", "Okafor", "Lindqvist", "Tanaka", "García", "Müller"]
CITIES = ["Lyon", "Tromsø", "Kraków", "Porto", "Nairobi", "Osaka", "Quito", "Hobart"]
BATCH = 500


def workload(inserts: int, updates: int, seed: int = 3) -> tuple[list[tuple], list[tuple]]:
    rng = random.Random(seed)
    rows = [(i, f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.choice(CITIES), round(rng.uniform(-500, 5000), 2),
             rng.randint(0, 300), rng.choice([None, "prefers email", "call after 18:00", "VIP since 2019"]))
            for i in range(1, inserts + 1)]
    changes = [(round(rng.uniform(0, 9000), 2), rng.randint(0, 300), rng.randint(1, inserts))
               for _ in range(updates)]
    return rows, changes


def make_sites(root: Path) -> None:
    for site in ("hq", "r1"):
        (root / "inbox" / site).mkdir(parents=True)
    hq = init_site(root / "hq.db", name="hq", role="consolidated", address=str(root / "inbox" / "hq"),
                   transport="folder")
    hq.connection.execute(SCHEMA)
    hq.create_publication("all", ["customer"])
    hq.add_remote("r1", address=str(root / "inbox" / "r1"), transport="folder")
    hq.subscribe("r1", "all")
    extract_site(hq, "r1", root / "r1.db")
    hq.close()


def write_and_scan(root: Path, rows: list[tuple], changes: list[tuple], *, scan: bool = True) -> float:
    """The application writes; the agent scans after each transaction.
    Returns the time spent scanning."""
    app = sqlite3.connect(root / "hq.db", isolation_level=None)
    app.execute("PRAGMA synchronous=FULL")
    site = SiteDatabase.open(root / "hq.db")
    scanning = 0.0
    statements = [("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?)", rows[i:i + BATCH])
                  for i in range(0, len(rows), BATCH)]
    statements += [("UPDATE customer SET balance = ?, visits = ? WHERE id = ?", changes[i:i + BATCH])
                   for i in range(0, len(changes), BATCH)]
    for sql, batch in statements:
        app.execute("BEGIN")
        app.executemany(sql, batch)
        app.execute("COMMIT")
        if scan:
            started = time.perf_counter()
            site.scan()
            scanning += time.perf_counter() - started
    site.close()
    app.close()
    return scanning


async def replicate(root: Path, options: RunOptions) -> dict[str, float]:
    times = {}
    for label, site in (("send", "hq"), ("receive_apply", "r1"), ("confirm", "hq")):
        started = time.perf_counter()
        async with Agent(root / f"{site}.db", options) as agent:
            report = await agent.run_once()
        times[label] = time.perf_counter() - started
        if not report.ok:
            raise SystemExit(f"{site}: {report}")
    return times


def raw(root: Path, rows: list[tuple], changes: list[tuple]) -> float:
    conn = sqlite3.connect(root / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(SCHEMA)
    started = time.perf_counter()
    for i in range(0, len(rows), BATCH):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?)", rows[i:i + BATCH])
        conn.execute("COMMIT")
    for i in range(0, len(changes), BATCH):
        conn.execute("BEGIN")
        conn.executemany("UPDATE customer SET balance = ?, visits = ? WHERE id = ?", changes[i:i + BATCH])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def floor(root: Path, workdir: Path, rows: list[tuple], changes: list[tuple]) -> float:
    """The least work both ends must do to move the operations, on this
    machine: read the changed rows at the consolidated (its table, after
    the application's writes), write the same operations at a fresh SQLite
    file in one transaction (WAL, synchronous=FULL: one durable commit),
    and one fsync at the consolidated to record that they went."""
    started = time.perf_counter()
    with contextlib.closing(sqlite3.connect(root / "hq.db")) as conn:
        read = conn.execute("SELECT * FROM customer").fetchall()
    conn = sqlite3.connect(workdir / "floor.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(SCHEMA)
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("UPDATE customer SET balance = ?, visits = ? WHERE id = ?", changes)
        conn.execute("COMMIT")
    finally:
        conn.close()
    with open(workdir / "floor.sent", "wb") as sent:
        sent.write(len(read).to_bytes(8, "big"))
        sent.flush()
        os.fsync(sent.fileno())
    return time.perf_counter() - started


def check(root: Path) -> None:
    with contextlib.closing(sqlite3.connect(root / "hq.db")) as conn:
        hq = conn.execute("SELECT * FROM customer ORDER BY id").fetchall()
    with contextlib.closing(sqlite3.connect(root / "r1.db")) as conn:
        r1 = conn.execute("SELECT * FROM customer ORDER BY id").fetchall()
    if hq != r1:
        raise SystemExit("replication result differs from the consolidated")
    with SiteDatabase.open(root / "hq.db") as site:
        row = site.remote("r1")
        if not row.confirm_sent == row.log_sent == site.log_end():
            raise SystemExit(f"not confirmed: {row}")


def backlog_child(root: str, operations: int) -> None:
    """In a child process: send a backlog and report peak RSS (KiB) on stdout."""
    options = RunOptions(receive=False)
    asyncio.run(_send_only(Path(root), options))
    # VmHWM, not ru_maxrss: Linux carries the parent's peak across fork+exec
    # into ru_maxrss, and the parent holds the whole workload.
    with open("/proc/self/status") as status:
        print(next(line.split()[1] for line in status if line.startswith("VmHWM:")))


async def _send_only(root: Path, options: RunOptions) -> None:
    async with Agent(root / "hq.db", options) as agent:
        report = await agent.run_once()
        if not report.ok:
            raise SystemExit(str(report))


def peak_rss(operations: int, workdir: Path) -> tuple[float, int]:
    root = workdir / "backlog"
    make_sites(root)
    rows, changes = workload(operations, 0, seed=9)
    write_and_scan(root, rows, changes)
    del rows, changes
    output = subprocess.run([sys.executable, "-m", "benchmarks.e2e", "--backlog-child", str(root),
                             "--backlog", str(operations)], check=True, capture_output=True, text=True)
    files = len(list((root / "inbox" / "r1").iterdir()))
    return int(output.stdout.strip().splitlines()[-1]) / 1024, files


def _unscanned_rows(operations: int, seed: int = 11):
    """The application's INSERTs, 500 at a time, made as they are written
    (10^7 rows would not fit in memory at once)."""
    rng = random.Random(seed)
    for start in range(1, operations + 1, BATCH):
        yield [(i, f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.choice(CITIES), round(rng.uniform(-500, 5000), 2),
                rng.randint(0, 300), rng.choice([None, "prefers email", "call after 18:00", "VIP since 2019"]))
               for i in range(start, min(start + BATCH, operations + 1))]


def write_unscanned(root: Path, operations: int) -> None:
    """The application commits the whole backlog, 500 rows per transaction;
    no scan runs meanwhile."""
    app = sqlite3.connect(root / "hq.db", isolation_level=None)
    app.execute("PRAGMA synchronous=NORMAL")
    for batch in _unscanned_rows(operations):
        app.execute("BEGIN")
        app.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?)", batch)
        app.execute("COMMIT")
    app.close()


def run_child(root: str, site: str) -> None:
    """In a child process: one ``run --once`` of ``site``; print its peak
    RSS (KiB, ru_maxrss) and the seconds it took."""
    started = time.perf_counter()
    asyncio.run(_run_once(Path(root) / f"{site}.db"))
    elapsed = time.perf_counter() - started
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, round(elapsed, 3))


async def _run_once(path: Path) -> None:
    async with Agent(path, RunOptions()) as agent:
        report = await agent.run_once()
        if not report.ok:
            raise SystemExit(f"{path.name}: {report}")


# Linux carries a process's peak RSS across exec into ru_maxrss, and a fork
# starts with its parent's pages: the agent runs as the grandchild of a
# small launcher, so its ru_maxrss is its own.
_LAUNCHER = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def measured_run(root: Path, site: str) -> tuple[float, float]:
    """Peak RSS (MB) and seconds of one ``run --once`` of ``site``, in a fresh process."""
    output = subprocess.run([sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "benchmarks.e2e",
                             "--run-child", str(root), "--site", site], check=True, capture_output=True, text=True)
    peak, seconds = output.stdout.strip().splitlines()[-1].split()
    return int(peak) / 1024, float(seconds)


def check_unscanned(root: Path) -> None:
    """The remote holds the consolidated's rows, compared in SQL (10^7 rows
    are not loaded), and everything sent was confirmed."""
    with contextlib.closing(sqlite3.connect(root / "hq.db")) as conn:
        conn.execute("ATTACH DATABASE ? AS r1", (str(root / "r1.db"),))
        differ = conn.execute("SELECT (SELECT count(*) FROM (SELECT * FROM main.customer EXCEPT"
                              " SELECT * FROM r1.customer)) + (SELECT count(*) FROM (SELECT * FROM r1.customer"
                              " EXCEPT SELECT * FROM main.customer))").fetchone()[0]
    if differ:
        raise SystemExit(f"replication result differs from the consolidated in {differ} rows")
    with SiteDatabase.open(root / "hq.db") as site:
        row = site.remote("r1")
        if not row.confirm_sent == row.log_sent == site.log_end():
            raise SystemExit(f"not confirmed: {row}")


def run_unscanned(operations: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="fieldsync-e2e-unscanned-"))
    try:
        root = workdir / "e2e"
        make_sites(root)
        idle, _ = measured_run(root, "hq")  # the baseline: nothing to send yet
        started = time.perf_counter()
        write_unscanned(root, operations)
        writing = time.perf_counter() - started
        sender, send_seconds = measured_run(root, "hq")
        messages = len(list((root / "inbox" / "r1").iterdir()))
        receiver, receive_seconds = measured_run(root, "r1")
        _, confirm_seconds = measured_run(root, "hq")
        check_unscanned(root)
        return {
            "benchmark": "e2e",
            "mode": "unscanned",
            "operations": operations,
            "application_transactions": -(-operations // BATCH),
            "messages": messages,
            "peak_rss_mb_sender": round(sender, 1),
            "peak_rss_mb_receiver": round(receiver, 1),
            "peak_rss_mb_idle": round(idle, 1),
            "ratio_sender": round(sender / idle, 2),
            "ratio_receiver": round(receiver / idle, 2),
            "target_peak_rss_mb": 200 if operations <= 1_000_000 else 250,
            "seconds": {"write": round(writing, 3), "send": send_seconds, "receive_apply": receive_seconds,
                        "confirm": confirm_seconds},
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(inserts: int, updates: int, backlog: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="fieldsync-e2e-"))
    try:
        root = workdir / "e2e"
        make_sites(root)
        rows, changes = workload(inserts, updates)
        scanning = write_and_scan(root, rows, changes)
        # `agent run` moves what it has loaded out of the cyclic collector's
        # way (agent/cli/run.py); here that is also the workload this process
        # holds for the baseline, which no agent process would hold.
        gc.collect()
        gc.freeze()
        try:
            times = asyncio.run(replicate(root, RunOptions()))
        finally:
            gc.unfreeze()
        check(root)
        raw_seconds = raw(workdir, rows, changes)
        floor_seconds = floor(root, workdir, rows, changes)
        operations = inserts + updates
        total = scanning + sum(times.values())
        files = check_spool(root / "r1.db.agent" / "spool").messages
        result = {
            "benchmark": "e2e",
            "operations": operations,
            "transactions": operations // BATCH,
            "ops_per_s": round(operations / total),
            "raw_ops_per_s": round(operations / raw_seconds),
            "ratio": round(raw_seconds / total, 3),
            "target_ratio": 0.5,  # end to end at half the speed of raw SQLite or better
            "floor_ratio": round(floor_seconds / total, 3),
            "seconds": {"scan": round(scanning, 3), **{k: round(v, 3) for k, v in times.items()},
                        "raw": round(raw_seconds, 3), "floor": round(floor_seconds, 3)},
            "inbound_left_queued": files,
        }
        if backlog:
            rss, sent = peak_rss(backlog, workdir)
            result.update({"backlog_operations": backlog, "backlog_messages": sent,
                           "peak_rss_mb": round(rss, 1), "target_peak_rss_mb": 200})
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--inserts", type=int, default=150_000)
    parser.add_argument("--updates", type=int, default=50_000)
    parser.add_argument("--backlog", type=int, default=1_000_000, help="operations for the RSS check (0: skip)")
    parser.add_argument("--unscanned", action="store_true",
                        help="measure peak RSS of a backlog committed before any scan (no ratio run)")
    parser.add_argument("--unscanned-ops", type=int, default=1_000_000,
                        help="operations of the --unscanned backlog (10000000: about 10 minutes)")
    parser.add_argument("--backlog-child", help=argparse.SUPPRESS)
    parser.add_argument("--run-child", help=argparse.SUPPRESS)
    parser.add_argument("--site", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.backlog_child:
        backlog_child(args.backlog_child, args.backlog)
        return 0
    if args.run_child:
        run_child(args.run_child, args.site)
        return 0
    if args.unscanned:
        result = run_unscanned(args.unscanned_ops)
    else:
        result = run(args.inserts, args.updates, args.backlog)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
