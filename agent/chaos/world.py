"""The world a seed runs in: a consolidated and its remotes as real SQLite
files, made from templates, and the reads the checks make of them.

Rules of this file:
* Site files are made once per number of remotes and copied for each seed
  (keys beside their database), unless a seed's inboxes outlive it: then
  every seed makes its sites afresh, with keys and incarnations of its own.
* The consolidated publishes customers (subscribed by region: each
  remote's subset), products and the ledger; every workload transaction
  writes ledger entries.  A seed with the follow chain publishes clients,
  orders and lines besides (chain.py), with rows before extraction: its
  sites come from templates of their own.
* Order (I2): each site journals the ledger entries as they arrive, in a
  local table fed by a trigger (``chaos_arrival``, not published).
* The reads and writes open a connection of their own and close it: no
  agent's connection is used, none is kept.  (A consolidated in
  PostgreSQL: pgworld.py; which site is where: sites.py.)
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Iterable

from ..admin import extract_site, init_site
from ..errors import AgentError
from ..keyfiles import copy_site_keys
from ..site import Site, open_site
from ..site.publication_rules import Article
from . import chain as follow_chain

SCHEMA = [
    "CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, balance REAL, scan BLOB)",
    "CREATE TABLE product (sku TEXT PRIMARY KEY, title TEXT, price REAL)",
    "CREATE TABLE ledger (entry TEXT PRIMARY KEY, site TEXT NOT NULL, amount INTEGER NOT NULL)",
]
# The arrival journal (I2): local to each site, never published.
ARRIVALS = [
    "CREATE TABLE IF NOT EXISTS chaos_arrival (n INTEGER PRIMARY KEY AUTOINCREMENT, entry TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS chaos_arrival_journal AFTER INSERT ON ledger"
    " BEGIN INSERT INTO chaos_arrival (entry) VALUES (NEW.entry); END",
]
PRODUCTS = ("tea", "jam", "rice", "soap")


class ChaosWorldError(AgentError):
    """A seed's world cannot be made where the user asked."""


class Templates:
    """Site files made once per number of remotes and copied for each seed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: set[tuple[int, bool]] = set()

    def copy(self, remotes: int, target: Path, *, own_identities: bool = False, chain: bool = False) -> None:
        """Copy the sites of ``remotes`` remotes (``chain``: with the follow
        chain) into ``target``.
        ``own_identities``: make them afresh instead (new keys and
        incarnations), for inboxes that outlive a seed: mail of an earlier
        seed that a server delivers late (Postfix's queue) then fails its
        checks as another site's, where a copy would take it as its own."""
        if own_identities:
            make_sites(target / "sites", remotes, chain=chain)
            for path in (target / "sites").glob("*.db"):
                shutil.copyfile(path, target / path.name)
                copy_site_keys(path, target / path.name)
            shutil.rmtree(target / "sites")
            return
        source = self.root / f"k{remotes}{'-chain' if chain else ''}"
        if (remotes, chain) not in self._made:
            if source.exists():
                shutil.rmtree(source)
            make_sites(source, remotes, chain=chain)
            self._made.add((remotes, chain))
        for path in source.glob("*.db"):
            shutil.copyfile(path, target / path.name)
            copy_site_keys(path, target / path.name)  # a site's key lives beside its database



def site_names(remotes: int) -> list[str]:
    return [f"f{index}" for index in range(1, remotes + 1)]


def make_sites(root: Path, remotes: int, *, chain: bool = False) -> None:
    root.mkdir(parents=True)
    hq = init_site(root / "hq.db", name="hq", role="consolidated", address="inbox/hq", transport="folder")
    for statement in SCHEMA + (follow_chain.SCHEMA if chain else []):
        hq.connection.execute(statement)
    hq.connection.executemany("INSERT INTO product VALUES (?, ?, 1.0)", [(sku, sku) for sku in PRODUCTS])
    if chain:
        for statement, values in follow_chain.populate(site_names(remotes)):
            hq.connection.execute(statement, values)
    publish_and_extract(hq, root, remotes, chain=chain)
    hq.close()
    add_arrival_journal(root / "hq.db")


def publish_and_extract(hq: Site, root: Path, remotes: int, *, chain: bool = False) -> None:
    """At the consolidated ``hq`` (its tables made): the publication (with
    the follow chain's articles, ``chain``), the remotes, each subscribed
    to its region, and their extractions into ``root``, each with its
    arrival journal."""
    hq.create_publication("field", [Article("customer", subscribe_by="region"), "product", "ledger",
                                    *(follow_chain.ARTICLES if chain else [])])
    for remote in site_names(remotes):
        hq.add_remote(remote, address=f"inbox/{remote}", transport="folder")
        hq.subscribe(remote, "field", remote)
    for remote in site_names(remotes):
        extract_site(hq, remote, root / f"{remote}.db")
        add_arrival_journal(root / f"{remote}.db")


def add_arrival_journal(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in ARRIVALS:
            conn.execute(statement)
    finally:
        conn.close()



def rows(path: Path, table: str, columns: tuple[str, ...] | None = None, where: str | None = None,
         values: tuple = ()) -> list[tuple]:
    """``table``'s rows (``columns``, default all; ``where`` a condition with
    ``?`` placeholders) in the SQLite site at ``path``, in a stable order."""
    query = f"SELECT {', '.join(columns) if columns else '*'} FROM {table}" + (f" WHERE {where}" if where else "")
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute(query, values).fetchall(), key=repr)
    finally:
        conn.close()


def arrivals(path: Path) -> list[str]:
    """The arrival journal of the SQLite site at ``path``, in arrival order."""
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT entry FROM chaos_arrival ORDER BY n")]
    finally:
        conn.close()


def write(path: Path, statements: Iterable[tuple[str, tuple]]) -> None:
    """Run ``statements`` in one transaction at the SQLite site at ``path``, as an application."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        for statement, values in statements:
            conn.execute(statement, values)
        conn.execute("COMMIT")
    finally:
        conn.close()


def remote_rows(locations: dict[str, str | Path]) -> dict[str, tuple[dict, int]]:
    """Each site's remote-user rows by peer, and the end of its log."""
    found = {}
    for site, location in locations.items():
        with open_site(location) as db:
            found[site] = ({row.name: row for row in db.remotes()}, db.log_end())
    return found


def columns(path: Path, table: str) -> tuple[str, ...]:
    """``table``'s columns in the SQLite site at ``path``, in order (none: no such table)."""
    conn = sqlite3.connect(path)
    try:
        return tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
    finally:
        conn.close()


def tables(path: Path, prefix: str) -> list[str]:
    """The tables of the SQLite site at ``path`` whose name starts with ``prefix``."""
    conn = sqlite3.connect(path)
    try:
        return [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE ? ORDER BY name", (f"{prefix}%",))]
    finally:
        conn.close()
