"""A PostgreSQL consolidated: capture, apply, end to end to a SQLite field
site, and a fleet's runs, each against a baseline measured in the same run.

The benchmark starts its own PostgreSQL 15 cluster (tests/pgserver.py,
with PostgreSQL's default durability: fsync on) in a temporary folder, on
127.0.0.1, and stops it at the end whatever happens.  Every site connects
as the cluster's superuser over TCP.  Each figure is the median of
``--repeat`` rounds (3), each round on fresh databases; ``*_runs_s`` lists
every round.

* capture: an application inserts ``--capture-rows`` rows (100,000), 1,000
  per transaction (``executemany``, one session), into a published table
  and into the same table unpublished, in one database, alternating which
  goes first.  ``capture_ratio`` = published rows/s over unpublished rows/s
  (target >= 0.4).
* apply: one message of ``--apply-operations`` operations (100,000: 60%
  INSERTs, then UPDATEs of two columns of half of them, then DELETEs of
  other rows; transactions of 500 operations, as benchmarks/apply.py makes
  them), decoded as the agent hands them over (runs of positional rows),
  applied by ``PostgresSite.apply`` in one call: one PostgreSQL
  transaction with the peer as origin, every UPDATE compared with its
  before-image.  The baseline writes the same rows with psycopg
  ``executemany`` (INSERT, UPDATE by key, DELETE by key) in one
  transaction into the same published table of another database, so the
  capture triggers fire in both and the ratio is the apply's own cost;
  ``apply_raw_unpublished_ops_per_s`` is that baseline into a table
  without triggers, for reference.  ``apply_ratio`` = raw seconds over
  apply seconds (target >= 0.7).
* e2e: an application writes ``--e2e-operations`` operations (100,000:
  three INSERTs to one UPDATE, benchmarks/e2e.py's rows) at PostgreSQL in
  transactions of 500, untimed; then, timed, ``agent run URI --once``
  (cut, read, pack, seal, write the files into the remote's inbox),
  ``agent run r1.db --once`` at the extracted SQLite remote (receive,
  apply, confirm) and ``agent run URI --once`` taking the confirmation.
  The baseline is benchmarks/e2e.py's: ``executemany`` of the same rows,
  500 per transaction, into a fresh SQLite file (WAL, synchronous=FULL).
  ``e2e_ratio`` = raw seconds over the three runs' (target >= 0.3).
* fleet: a consolidated with ``--remotes`` remotes (10,000) added with
  ``agent remote add URI --from FLEET`` (benchmarks/fleet.py's fleet: a
  table ``reading`` of two rows per remote, partitioned by ``region``, a
  folder inbox each; never extracted), then, after one warm-up run (each
  remote's first message), ``agent run URI --once`` with nothing changed
  (``fleet_idle_s``, target 0 files and <= 1 s) and after one row of one
  remote changed (``fleet_one_change_s``, target that remote's file only
  and <= 1 s).  The baseline is the same fleet on a SQLite consolidated
  (``fleet_sqlite_*``).

Run: ``python -m benchmarks.postgres --json`` (``--only PART`` for one
part; the sizes by option).  Every command runs in this process
(benchmarks.common.agent_command).  Each part starts on a settled cluster:
a ``CHECKPOINT`` first, so that the pages an earlier part dirtied (the
e2e part writes 100,000 rows three times) are not written out while a
later part is timed (the fleet's one-change runs took 1.1-1.2 s after
the other parts, 0.8-0.9 s alone).
"""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import sqlite3
import sys
import tempfile
from contextlib import closing, contextmanager
from pathlib import Path
from statistics import median
from typing import Callable, Iterator

import psycopg
from psycopg import sql

from agent.site.postgres.site import PostgresSite
from benchmarks import e2e, fleet
from benchmarks.apply import as_runs, make_rows, transactions
from benchmarks.common import agent_command, run_figures, show, timed, timed_run
from tests.pgserver import PostgresServer

CUSTOMER = ("CREATE TABLE {} (id integer PRIMARY KEY, name text NOT NULL, city text, balance double precision,"
            " visits integer, note text)")
CAPTURE_BATCH = 1000
PARTS = ("capture", "apply", "e2e", "fleet")
TARGETS = {"capture_ratio": 0.4, "apply_ratio": 0.7, "e2e_ratio": 0.3, "fleet_idle_s": 1.0, "fleet_idle_files": 0,
           "fleet_one_change_s": 1.0, "fleet_one_change_files": 1}


@contextmanager
def cluster() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster of its own, durable, stopped and removed at the
    end however the benchmark ends (SIGTERM too)."""
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    server = PostgresServer(durable=True)
    try:
        yield server.start()
    finally:
        server.close()
        signal.signal(signal.SIGTERM, previous)


def new_database(server: PostgresServer, *tables: str) -> str:
    """A new database holding the customer tables named; its URI."""
    uri = server.uri(server.create_database())
    with psycopg.connect(uri, autocommit=True) as conn:
        for table in tables:
            conn.execute(sql.SQL(CUSTOMER).format(sql.Identifier(table)))
    return uri


def new_site(server: PostgresServer, home: Path, *plain: str) -> str:
    """A consolidated whose table customer is published and whose tables
    ``plain`` are not, with the remote ``peer``; its URI."""
    uri = new_database(server, "customer", *plain)
    with PostgresSite.init(uri, name="hq", role="consolidated", home=home) as site:
        site.create_publication("main", ["customer"])
        site.add_remote("peer")
    return uri


def drop(server: PostgresServer, uri: str) -> None:
    server.drop_database(uri.rsplit("/", 1)[1])


def write_batches(conn: psycopg.Connection, statement: sql.Composable, rows: list[tuple], batch: int) -> None:
    """``executemany`` of ``rows``, ``batch`` per transaction, as an application would."""
    for start in range(0, len(rows), batch):
        with conn.transaction(), conn.cursor() as cursor:
            cursor.executemany(statement, rows[start:start + batch])


def insert_sql(table: str) -> sql.Composed:
    return sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)").format(sql.Identifier(table))


def update_sql(table: str) -> sql.Composed:
    """The UPDATE of benchmarks.e2e's and benchmarks.apply's changes: (balance, visits, id)."""
    return sql.SQL("UPDATE {} SET balance = %s, visits = %s WHERE id = %s").format(sql.Identifier(table))


# --- capture ---------------------------------------------------------------------------------


def measure_capture(server: PostgresServer, workdir: Path, count: int, repeats: int, seed: int) -> dict:
    rows, _ = make_rows(count, seed)
    uri = new_site(server, workdir / "capture-home", "customer_plain")
    seconds: dict[str, list[float]] = {"customer": [], "customer_plain": []}
    try:
        with psycopg.connect(uri, autocommit=True) as app:
            for repeat in range(repeats):
                shifted = [(row[0] + repeat * count, *row[1:]) for row in rows]  # fresh keys each round
                order = ("customer", "customer_plain") if repeat % 2 == 0 else ("customer_plain", "customer")
                for table in order:
                    seconds[table].append(timed(lambda: write_batches(app, insert_sql(table), shifted,
                                                                      CAPTURE_BATCH))[0])
    finally:
        drop(server, uri)
    published, plain = median(seconds["customer"]), median(seconds["customer_plain"])
    return {
        "capture_rows": count,
        "capture_transaction_rows": CAPTURE_BATCH,
        "capture_published_rows_per_s": round(count / published),
        "capture_unpublished_rows_per_s": round(count / plain),
        "capture_ratio": round(plain / published, 3),
        "capture_published_runs_s": [round(value, 3) for value in seconds["customer"]],
        "capture_unpublished_runs_s": [round(value, 3) for value in seconds["customer_plain"]],
    }


# --- apply -----------------------------------------------------------------------------------


def apply_workload(operations: int, seed: int) -> tuple[list, list[tuple], list[tuple], list[tuple]]:
    """The message (decoded transactions) and the raw rows: INSERTs,
    UPDATEs as (balance, visits, id), DELETEs as (id,)."""
    inserted = operations * 6 // 10
    rows, updates = make_rows(inserted, seed)
    deleted = min(operations - inserted - len(updates), inserted - len(updates))
    deletes = rows[len(rows) - deleted:] if deleted > 0 else []
    insert_txns, change_txns = transactions(rows, updates, deletes)
    message = [as_runs(transaction) for transaction in (*insert_txns, *change_txns)]
    return (message, rows, [(new[0], new[1], old[0]) for old, new in updates],
            [(row[0],) for row in deletes])


def write_raw(uri: str, table: str, rows: list[tuple], updates: list[tuple], deletes: list[tuple]) -> float:
    """The baseline: the message's rows in one transaction, ``executemany`` each kind."""
    with psycopg.connect(uri, autocommit=True) as conn:
        def write() -> None:
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(insert_sql(table), rows)
                cursor.executemany(update_sql(table), updates)
                cursor.executemany(sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(table)), deletes)
        return timed(write)[0]


def apply_message(uri: str, message: list, expected_rows: int) -> float:
    with closing(PostgresSite.open(uri)) as site:
        seconds, _ = timed(lambda: site.apply("peer", message, log_received=message[-1].commit))
        if site.apply_errors() or site.conflicts():
            raise SystemExit(f"the apply went wrong: {site.apply_errors()[:3]} {site.conflicts()[:3]}")
        count = site.connection.execute("SELECT count(*) FROM customer").fetchone()[0]
    if count != expected_rows:
        raise SystemExit(f"the apply left {count} rows, not {expected_rows}")
    return seconds


def measure_apply(server: PostgresServer, workdir: Path, operations: int, repeats: int, seed: int) -> dict:
    message, rows, updates, deletes = apply_workload(operations, seed)
    total = len(rows) + len(updates) + len(deletes)
    seconds: dict[str, list[float]] = {"apply": [], "raw": [], "plain": []}
    for repeat in range(repeats):
        applied = new_site(server, workdir / f"apply-home{repeat}")
        raw = new_site(server, workdir / f"raw-home{repeat}", "customer_plain")
        try:
            measures = [("apply", lambda: apply_message(applied, message, len(rows) - len(deletes))),
                        ("raw", lambda: write_raw(raw, "customer", rows, updates, deletes)),
                        ("plain", lambda: write_raw(raw, "customer_plain", rows, updates, deletes))]
            for kind, measure in measures if repeat % 2 == 0 else reversed(measures):
                seconds[kind].append(measure())
        finally:
            drop(server, applied)
            drop(server, raw)
    apply_s, raw_s, plain_s = (median(seconds[kind]) for kind in ("apply", "raw", "plain"))
    return {
        "apply_operations": total,
        "apply_inserts": len(rows), "apply_updates": len(updates), "apply_deletes": len(deletes),
        "apply_transactions": len(message),
        "apply_path": "PostgresSite.apply of the decoded transactions (runs), one call",
        "apply_ops_per_s": round(total / apply_s),
        "apply_raw_ops_per_s": round(total / raw_s),
        "apply_raw_unpublished_ops_per_s": round(total / plain_s),
        "apply_ratio": round(raw_s / apply_s, 3),
        "apply_vs_unpublished_ratio": round(plain_s / apply_s, 3),
        "apply_runs_s": [round(value, 3) for value in seconds["apply"]],
        "apply_raw_runs_s": [round(value, 3) for value in seconds["raw"]],
    }


# --- end to end ------------------------------------------------------------------------------


def make_e2e(server: PostgresServer, root: Path) -> str:
    """hq at PostgreSQL (table customer published in ``all``) and r1, its
    extracted SQLite remote, with folder inboxes; hq's URI."""
    uri = new_database(server, "customer")
    for site in ("hq", "r1"):
        (root / "inbox" / site).mkdir(parents=True)
    agent_command("init", uri, "--name", "hq", "--role", "consolidated", "--address", root / "inbox" / "hq",
                  "--home", root / "hq-home")
    agent_command("publication", "create", uri, "all", "customer")
    agent_command("remote", "add", uri, "r1", "--address", root / "inbox" / "r1", "--subscribe", "all")
    agent_command("extract", uri, "r1", root / "r1.db")
    return uri


def check_e2e(uri: str, root: Path) -> None:
    with psycopg.connect(uri) as conn:
        hq = conn.execute("SELECT * FROM customer ORDER BY id").fetchall()
    with closing(sqlite3.connect(root / "r1.db")) as conn:
        r1 = conn.execute("SELECT * FROM customer ORDER BY id").fetchall()
    if hq != r1:
        raise SystemExit("the remote's rows differ from the consolidated's")
    with closing(PostgresSite.open(uri)) as site:
        row = site.remote("r1")
        if not row.confirm_sent == row.log_sent == site.log_end():
            raise SystemExit(f"not confirmed: {row}")


def measure_e2e(server: PostgresServer, workdir: Path, operations: int, repeats: int) -> dict:
    inserts = operations * 3 // 4
    rows, changes = e2e.workload(inserts, operations - inserts)
    phases: dict[str, list[float]] = {"send": [], "receive_apply": [], "confirm": [], "raw": []}
    for repeat in range(repeats):
        root = workdir / f"e2e{repeat}"
        uri = make_e2e(server, root)
        try:
            with psycopg.connect(uri, autocommit=True) as app:
                write_batches(app, insert_sql("customer"), rows, e2e.BATCH)
                write_batches(app, update_sql("customer"), changes, e2e.BATCH)
            for phase, site in (("send", uri), ("receive_apply", root / "r1.db"), ("confirm", uri)):
                phases[phase].append(agent_command("run", site, "--once"))
            check_e2e(uri, root)
        finally:
            drop(server, uri)
        phases["raw"].append(e2e.raw(root, rows, changes))
        shutil.rmtree(root)
    runs = [sum(phases[phase][repeat] for phase in ("send", "receive_apply", "confirm")) for repeat in range(repeats)]
    total, raw_s = median(runs), median(phases["raw"])
    return {
        "e2e_operations": operations,
        "e2e_inserts": inserts, "e2e_updates": operations - inserts,
        "e2e_application_transactions": sum(math.ceil(count / e2e.BATCH) for count in (len(rows), len(changes))),
        "e2e_ops_per_s": round(operations / total),
        "e2e_raw_sqlite_ops_per_s": round(operations / raw_s),
        "e2e_ratio": round(raw_s / total, 3),
        "e2e_seconds": {phase: round(median(values), 3) for phase, values in phases.items()},
        "e2e_runs_s": [round(value, 3) for value in runs],
    }


# --- fleet -----------------------------------------------------------------------------------


def make_pg_fleet(server: PostgresServer, root: Path, count: int) -> str:
    """benchmarks.fleet's consolidated at PostgreSQL; its URI."""
    (root / "inbox" / "hq").mkdir(parents=True)
    uri = server.uri(server.create_database())
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE reading (id integer PRIMARY KEY, region text NOT NULL, value double precision)")
        conn.execute("CREATE INDEX reading_region ON reading (region)")
        with conn.transaction(), conn.cursor() as cursor:
            cursor.executemany("INSERT INTO reading VALUES (%s, %s, 0.0)",
                               [(index + 1, fleet.region(index // fleet.ROWS_PER_REMOTE))
                                for index in range(count * fleet.ROWS_PER_REMOTE)])
    agent_command("init", uri, "--name", "hq", "--role", "consolidated", "--address", root / "inbox" / "hq",
                  "--home", root / "hq-home")
    agent_command("publication", "create", uri, "territory", "reading@region")
    return uri


def fleet_runs(root: Path, site: object, repeats: int, change: Callable[[str], None]) -> dict:
    """The first run (each remote's first message, a heartbeat: first
    contact), then ``repeats`` idle runs and runs after one row changed."""
    first_s, first_files = timed_run(root, site)
    runs: dict[str, list[tuple[float, int]]] = {"idle": [], "one_change": []}
    for repeat in range(repeats):
        runs["idle"].append(timed_run(root, site))
        change(f"WHERE id = {1 + repeat}")
        runs["one_change"].append(timed_run(root, site))
    figures = {"first_run_s": round(first_s, 3), "first_run_files": first_files}
    for kind, measured in runs.items():
        figures.update(run_figures(kind, measured))
    return figures


def measure_fleet(server: PostgresServer, workdir: Path, count: int, repeats: int) -> dict:
    root = workdir / "fleet-pg"
    uri = make_pg_fleet(server, root, count)

    def change(where: str) -> None:
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute(f"UPDATE reading SET value = value + 1 {where}")

    try:
        bulk_add = agent_command("remote", "add", uri, "--from", fleet.write_fleet(root, count))
        figures = fleet_runs(root, uri, repeats, change)
    finally:
        drop(server, uri)
    result = {"fleet_remotes": count, "fleet_bulk_add_s": round(bulk_add, 3)}
    result.update({f"fleet_{name}": value for name, value in figures.items()})
    # The baseline: the same fleet at a SQLite consolidated.
    sqlite_root = workdir / "fleet-sqlite"
    sqlite_root.mkdir()
    hq, fleet_file = fleet.make_consolidated(sqlite_root, count)
    result["fleet_sqlite_bulk_add_s"] = round(agent_command("remote", "add", hq, "--from", fleet_file), 3)
    figures = fleet_runs(sqlite_root, hq, repeats, lambda where: fleet.change(hq, where))
    result.update({f"fleet_sqlite_{name}": value for name, value in figures.items()})
    return result


# --- the whole -------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="fieldsync-bench-pg-"))
    try:
        with cluster() as server:
            with psycopg.connect(server.uri("postgres")) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]
            result: dict = {"benchmark": "postgres", "server_version": version, "repeat": args.repeat,
                            "cluster": "a cluster of its own on 127.0.0.1, PostgreSQL's defaults (fsync on)"}
            parts = {"capture": lambda: measure_capture(server, workdir, args.capture_rows, args.repeat, args.seed),
                     "apply": lambda: measure_apply(server, workdir, args.apply_operations, args.repeat, args.seed),
                     "e2e": lambda: measure_e2e(server, workdir, args.e2e_operations, args.repeat),
                     "fleet": lambda: measure_fleet(server, workdir, args.remotes, args.repeat)}
            for part in args.parts:
                with psycopg.connect(server.uri("postgres"), autocommit=True) as conn:
                    conn.execute("CHECKPOINT")  # what earlier parts wrote is not written while this one is timed
                result.update(parts[part]())
        result["targets"] = TARGETS
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--capture-rows", type=int, default=100_000, help="rows inserted into each table")
    parser.add_argument("--apply-operations", type=int, default=100_000, help="operations of the applied message")
    parser.add_argument("--e2e-operations", type=int, default=100_000, help="operations replicated end to end")
    parser.add_argument("--remotes", type=int, default=10_000, help="remotes of the fleet")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measurement; medians are reported")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--only", choices=PARTS, action="append", dest="parts",
                        help="measure this part only (repeatable; default: all)")
    args = parser.parse_args(argv)
    args.parts = args.parts or list(PARTS)
    if min(args.capture_rows, args.remotes, args.repeat) < 1 or args.apply_operations < 10 \
            or args.e2e_operations < 4 or args.remotes * fleet.ROWS_PER_REMOTE < args.repeat:
        parser.error("sizes: at least 1 capture row, 10 apply operations, 4 e2e operations, 1 repeat, and a fleet "
                     "row to change per repeat (2 per remote)")
    show(measure(args), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
