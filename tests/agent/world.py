"""A consolidated and its remotes on real SQLite files, replicating through
real folder inboxes, with faults applied to the files in the inboxes.

The World checks the invariants of docs/protocol.md after every agent run:
I1 on every remote-user row, no apply errors (a double apply of an INSERT
would be one), and at quiescence I5: every remote holds exactly the
consolidated's subscribed rows and every stream is confirmed to its end.
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

from agent.admin import extract_site, init_site
from agent.runner import Agent, RunOptions, RunReport
from agent.site import SiteDatabase
from agent.site.publication_rules import Article

SCHEMA = [
    "CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, balance REAL, photo BLOB)",
    "CREATE TABLE product (sku TEXT NOT NULL, variant INTEGER NOT NULL, title TEXT, price REAL,"
    " PRIMARY KEY (sku, variant))",
    "CREATE TABLE ledger (entry TEXT PRIMARY KEY, site TEXT NOT NULL, amount INTEGER NOT NULL)",
]


@dataclass
class World:
    root: Path
    remotes: tuple[str, ...] = ("f1", "f2")
    # A control message to an idle peer every five virtual minutes.
    options: RunOptions = field(default_factory=lambda: RunOptions(heartbeat=300.0))
    reports: list[tuple[str, RunReport]] = field(default_factory=list)
    #: The agents' clock: a virtual minute passes at each run of a site.
    clock: float = field(default_factory=time.time)

    #: The transport recorded in the remote-user table.  A subclass that runs
    #: over another transport overrides it and the hooks below (make_inbox,
    #: address, run_options, waiting_names); see transport_worlds.py.
    transport: ClassVar[str] = "folder"

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for site in ("hq", *self.remotes):
            self.make_inbox(site)
        hq = init_site(self.db("hq"), name="hq", role="consolidated", address=self.address("hq"),
                       transport=self.transport)
        with self.connect("hq") as conn:
            for statement in SCHEMA:
                conn.execute(statement)
        hq.create_publication("field", [Article("customer", subscribe_by="region"), "product", "ledger"])
        for remote in self.remotes:
            hq.add_remote(remote, address=self.address(remote), transport=self.transport)
            hq.subscribe(remote, "field", remote)
        hq.close()

    # -- files -----------------------------------------------------------------------

    def db(self, site: str) -> Path:
        return self.root / f"{site}.db"

    def inbox(self, site: str) -> Path:
        return self.root / "inbox" / site

    def make_inbox(self, site: str) -> None:
        self.inbox(site).mkdir(parents=True, exist_ok=True)

    def address(self, site: str) -> str:
        """Where peers send to ``site`` (its address in their remote-user rows)."""
        return str(self.inbox(site))

    def run_options(self, site: str) -> RunOptions:
        """How ``site``'s agent runs (before a run's own changes)."""
        return self.options

    def waiting_names(self, site: str) -> list[str]:
        """The names of the files waiting in ``site``'s inbox, in name order."""
        return [path.name for path in self.inbox_files(site)]

    def connect(self, site: str) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db(site), timeout=30, isolation_level=None)
        conn.execute("BEGIN")
        return _Committing(conn)  # type: ignore[return-value]

    def extract_all(self) -> None:
        with SiteDatabase.open(self.db("hq")) as hq:
            for remote in self.remotes:
                extract_site(hq, remote, self.db(remote))

    def write(self, site: str, *statements: tuple[str, tuple]) -> None:
        """One application transaction at ``site``."""
        with self.connect(site) as conn:
            for sql, params in statements:
                conn.execute(sql, params)

    def rows(self, site: str, table: str, where: str = "", params: tuple = ()) -> list[tuple]:
        conn = sqlite3.connect(self.db(site))
        try:
            return sorted(conn.execute(f"SELECT * FROM {table} {where}", params).fetchall(),
                          key=lambda row: repr(row))
        finally:
            conn.close()

    def inbox_files(self, site: str) -> list[Path]:
        return sorted(p for p in self.inbox(site).iterdir() if p.is_file() and not p.name.startswith("."))

    # -- running -----------------------------------------------------------------------

    async def run(self, site: str, **changes: object) -> RunReport:
        options = self.run_options(site)
        if changes:
            options = dataclasses.replace(options, **changes)
        self.clock += 60.0
        async with Agent(self.db(site), options, clock=lambda: self.clock) as agent:
            report = await agent.run_once()
        self.reports.append((site, report))
        self.check_invariants()
        return report

    async def round(self, fault: Callable[["World", str], None] | None = None) -> None:
        """Every site runs once; ``fault(world, site)`` may tamper with the
        inbox of ``site`` just before that site runs."""
        for site in ("hq", *self.remotes):
            if fault is not None:
                fault(self, site)
            await self.run(site)

    async def settle(self, rounds: int = 12) -> int:
        """Run rounds until every stream is confirmed to its end."""
        for number in range(1, rounds + 1):
            await self.round()
            if self.quiescent():
                self.check_converged()
                return number
        raise AssertionError(f"no quiescence after {rounds} rounds:\n{self.describe()}")

    # -- invariants --------------------------------------------------------------------

    def remote_rows(self, site: str):
        with SiteDatabase.open(self.db(site)) as db:
            return {row.name: row for row in db.remotes()}, db.log_end()

    def check_invariants(self) -> None:
        for site in ("hq", *self.remotes):
            if not self.db(site).exists():
                continue
            rows, log_end = self.remote_rows(site)
            for row in rows.values():
                assert row.confirm_sent <= row.log_sent <= log_end, f"I1 broken at {site} for {row.name}: {row}"
            with SiteDatabase.open(self.db(site)) as db:
                errors = db.apply_errors()
            assert not errors, f"apply errors at {site} (an operation applied twice or out of order?): {errors}"

    def quiescent(self) -> bool:
        ends = {}
        rows = {}
        for site in ("hq", *self.remotes):
            rows[site], ends[site] = self.remote_rows(site)
        for site, peers in rows.items():
            for peer, row in peers.items():
                # All that was sent is confirmed, and the log was read to its end.
                if not (row.confirm_sent == row.log_sent and row.horizon == row.read_through == ends[site]):
                    return False
                if row.log_received != rows[peer][site].log_sent:
                    return False
        # Control messages go out when there is news, and heartbeats;
        # data must all have arrived.
        return all(not any(".d." in name for name in self.waiting_names(site)) for site in rows)

    def check_converged(self) -> None:
        """I5: every remote holds exactly the consolidated's subscribed rows."""
        for remote in self.remotes:
            assert self.rows(remote, "customer") == self.rows("hq", "customer", "WHERE region = ?", (remote,)), remote
            assert self.rows(remote, "product") == self.rows("hq", "product"), remote
            assert self.rows(remote, "ledger") == self.rows("hq", "ledger"), remote

    def describe(self) -> str:
        lines = []
        for site in ("hq", *self.remotes):
            rows, end = self.remote_rows(site)
            lines.append(f"{site} (log end {end}, inbox {[name[:40] for name in self.waiting_names(site)]})")
            for row in rows.values():
                lines.append(f"  -> {row.name}: log_send={row.log_send} log_sent={row.log_sent} "
                             f"confirm_sent={row.confirm_sent} resend_count={row.resend_count} "
                             f"log_received={row.log_received} rereceive_count={row.rereceive_count}")
        return "\n".join(lines)

    def counted(self, site: str, field_name: str) -> int:
        return sum(getattr(report, field_name) for who, report in self.reports if who == site)


class _Committing:
    """A connection in a transaction that commits on success, like an application."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, kind, value, traceback) -> None:
        try:
            self.conn.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.conn.close()


def data_files(world: World, site: str) -> list[Path]:
    return [p for p in world.inbox_files(site) if ".d." in p.name]


def random_rows(rng: random.Random, count: int, regions: tuple[str, ...], start: int = 1) -> list[tuple[str, tuple]]:
    return [("INSERT INTO customer VALUES (?, ?, ?, ?, ?)",
             (start + i, rng.choice(regions), f"customer {start + i}", round(rng.uniform(0, 900), 2),
              rng.randbytes(rng.randint(0, 40)) if rng.random() < 0.3 else None)) for i in range(count)]
