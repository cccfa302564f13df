"""The workload: what the sites write while the faults last.

Rules of this file:
* Every draw comes from the seed's run stream (``run:<seed>``), shared
  with the simulation in the order the steps come, so the same seed writes
  the same transactions.
* Every workload transaction writes ledger entries (``<site>-<n>``, the
  number growing in commit order at the origin); the ledger only ever gets
  new entries, so a second apply of one is an error row, and each entry
  made is remembered in ``ledger`` for the loss check.
* Every written value is new (names and keys from the run's counter,
  product titles from a counter of their own, balances only grow), so no
  change can pass for another.
* Sites change the same customers at once (the consolidated and the
  remote whose subset holds them): an UPDATE of a row another site deleted
  fails by design, and the sites still converge.
* A seed with the follow chain also writes clients, orders and lines
  (chain.py) at every site, in the same transactions, after the draws
  above: a seed without it draws exactly what it drew before the chain.
  Every application writes with its foreign keys on.
* A seed with schema changes (schema_changes.py) writes the new shapes
  too, drawn from a stream of its own; INSERTs name their columns, so
  they run in any shape the change history makes.
"""

from __future__ import annotations

import random
from functools import partial
from typing import Iterable

from .chain import ChainWriter
from .schema_changes import SchemaChanges
from .sites import Sites
from .world import PRODUCTS

# A customer row, its columns named: it runs in any shape a schema change gives the table.
CUSTOMER_INSERT = "INSERT INTO customer (id, region, name, balance, scan) VALUES ({})"


class Workload:
    """The transactions of one seed's sites (``sites[0]`` is the consolidated)."""

    def __init__(self, places: Sites, sites: list[str], rng: random.Random, *, chain: bool = False,
                 schema_seed: int | None = None) -> None:
        self.places = places
        self.root = places.root
        self.sites = sites
        self.rng = rng
        self.ledger: set[str] = set()  # every entry made anywhere, less those lost with a replaced remote
        self.next_id = 1
        self.product_writes = 0  # the titles' own counter (_product_write)
        self.chain = ChainWriter(rng, sites[1:], self._new_key) if chain else None
        self.schema = (None if schema_seed is None
                       else SchemaChanges(places, sites, schema_seed, self._new_key))

    def _new_key(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def forget(self, remote: str, *, kept: set[str]) -> None:
        """``remote`` was extracted again: its entries not ``kept`` (never
        reached the consolidated) are gone with the old copy."""
        self.ledger = {entry for entry in self.ledger if not entry.startswith(f"{remote}-") or entry in kept}

    def _write(self, site: str, statements: Iterable[tuple[str, tuple]]) -> None:
        self.places.write(site, statements)

    def _customers(self, site: str) -> list[tuple[int, str]]:
        return sorted(self.places.rows(site, "customer", ("id", "region")))  # by id

    def step(self) -> None:
        """One step: most sites commit a transaction of ledger entries and other changes."""
        rng = self.rng
        remotes = self.sites[1:]
        for site in self.sites:
            if rng.random() < 0.3:
                continue
            statements = self._entries(site, rng.randint(1, 3), rng)
            if rng.random() < 0.4:
                statements.append(self._product_write(site, rng))
            if site != "hq" and rng.random() < 0.6:
                statements += self._remote_customer_writes(site)
            if site == "hq":
                customers = self._customers("hq")
                for _ in range(rng.randint(0, 4)):
                    statements.append((CUSTOMER_INSERT.format("?, ?, ?, ?, NULL"),
                                       (self.next_id, rng.choice(remotes), f"c{self.next_id}", 0.0)))
                    self.next_id += 1
                if customers and rng.random() < 0.5:
                    row_id, _ = rng.choice(customers)
                    statements.append(("UPDATE customer SET balance = balance + 1 WHERE id = ?", (row_id,)))
                if customers and rng.random() < 0.3:  # a row moves between subsets
                    row_id, region = rng.choice(customers)
                    statements.append(("UPDATE customer SET region = ? WHERE id = ?",
                                       (rng.choice(remotes), row_id)))
                if customers and rng.random() < 0.2:
                    statements.append(("DELETE FROM customer WHERE id = ?", (rng.choice(customers)[0],)))
                if rng.random() < 0.15:  # a transaction larger than the message size
                    for _ in range(rng.randint(3, 6)):
                        statements.append((CUSTOMER_INSERT.format("?, ?, 'scan', 0, ?"),
                                           (self.next_id, rng.choice(remotes), rng.randbytes(3000))))
                        self.next_id += 1
            if self.chain is not None and rng.random() < 0.7:
                statements += self.chain.writes(site, partial(self.places.rows, site))
            if self.schema is not None:
                statements += self.schema.writes(site)
            self._write(site, statements)

    def _product_write(self, site: str, rng: random.Random) -> tuple[str, tuple]:
        """A new price and title of a shared product.  The title is new every
        time (numbered by a counter of its own, which moves no key or name):
        an UPDATE that changes only the title (a passthrough's fix) carries
        nothing else to show what it was written without, and a title
        written twice could pass for the older write."""
        self.product_writes += 1
        return ("UPDATE product SET price = ?, title = ? WHERE sku = ?",
                (round(rng.uniform(1, 9), 2), f"{site} price {self.product_writes}", rng.choice(PRODUCTS)))

    def _entries(self, site: str, count: int, rng: random.Random) -> list[tuple[str, tuple]]:
        """``count`` new ledger entries of ``site``, numbered in the order they are written."""
        statements = []
        for _ in range(count):
            entry = f"{site}-{self.next_id}"
            self.next_id += 1
            self.ledger.add(entry)
            statements.append(("INSERT INTO ledger VALUES (?, ?, ?)", (entry, site, rng.randint(1, 99))))
        return statements

    def straggler(self, site: str, rng: random.Random) -> list[tuple[str, tuple]]:
        """A transaction an application keeps open while ``site``'s agent runs
        (a server consolidated's sessions commit at any moment): new ledger
        entries and a new customer, never a row an apply may lock, so the
        agent never waits for it.  Nothing else writes at ``site`` until it
        commits, so its entry numbers stay in commit order."""
        statements = self._entries(site, rng.randint(1, 3), rng)
        statements.append((CUSTOMER_INSERT.format("?, ?, ?, 0, NULL"),
                           (self.next_id, rng.choice(self.sites[1:]), f"late{self.next_id}")))
        self.next_id += 1
        return statements

    def _remote_customer_writes(self, site: str) -> list[tuple[str, tuple]]:
        """A remote changes customers of its own subset: it updates them,
        gives them new keys, deletes them, inserts them, and hands one to
        another remote, all while the consolidated changes the same rows.
        Every written value is new (names and keys from the run's counter,
        balances only grow), so no change can pass for another."""
        rng = self.rng
        statements: list[tuple[str, tuple]] = []
        customers = [row_id for row_id, region in self._customers(site) if region == site]
        for _ in range(rng.randint(1, 2)):
            roll = rng.random()
            self.next_id += 1
            if roll < 0.2 or not customers:
                statements.append((CUSTOMER_INSERT.format("?, ?, ?, 0.5, NULL"),
                                   (self.next_id, site, f"{site}c{self.next_id}")))
                continue
            row_id = rng.choice(customers)
            if roll < 0.65:
                statements.append(("UPDATE customer SET name = ?, balance = balance + 1 WHERE id = ?",
                                   (f"{site}n{self.next_id}", row_id)))
            elif roll < 0.8:
                statements.append(("UPDATE customer SET id = ? WHERE id = ?", (self.next_id, row_id)))
                customers.remove(row_id)
                customers.append(self.next_id)
            elif roll < 0.9:
                statements.append(("DELETE FROM customer WHERE id = ?", (row_id,)))
                customers.remove(row_id)
            else:
                statements.append(("UPDATE customer SET region = ? WHERE id = ?",
                                   (rng.choice(self.sites[1:]), row_id)))
                customers.remove(row_id)
        return statements
