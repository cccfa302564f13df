"""The follow chain of a seed that draws one: clients (SUBSCRIBE BY rep),
their orders (``orders@->client``) and the orders' lines
(``order_line@->orders``), what the sites write to them, and what each
remote must end up holding.

Rules of this file:
* The chain is published beside the other tables, in the same
  publication; its foreign keys are declared (a line goes with its order
  by ON DELETE CASCADE, an order must go before its client), and every
  site's application writes with ``PRAGMA foreign_keys = ON``.
* A rep is a remote's name (its subscription) or ``hq``, which no remote
  subscribes to: a client moved there leaves every remote.
* Draws come from the seed's run stream, in a fixed order; a site's
  transaction is drawn against a model of the rows it holds, updated
  statement by statement, so no statement breaks a key the ones before it
  left (an order is never written under a client the same transaction
  deleted).  Keys and values come from the run's counter: never reused.
* A remote writes only under clients of its own rep; the consolidated
  writes anywhere.  Both move clients to another rep and hand orders to
  another client: the moves the route must follow.
* The expected subset of a remote is computed from the consolidated's
  final state only, by following each row's foreign keys up to its
  client's rep (:func:`expected`).
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..site.publication_rules import Article

SCHEMA = [
    "CREATE TABLE client (id INTEGER PRIMARY KEY, rep TEXT NOT NULL, name TEXT)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, client_id INTEGER NOT NULL REFERENCES client (id), note TEXT)",
    "CREATE INDEX orders_client ON orders (client_id)",
    "CREATE TABLE order_line (id INTEGER PRIMARY KEY,"
    " order_id INTEGER NOT NULL REFERENCES orders (id) ON DELETE CASCADE, qty INTEGER NOT NULL)",
    "CREATE INDEX order_line_order ON order_line (order_id)",
]
ARTICLES = [Article("client", subscribe_by="rep"), Article("orders", follows="client"),
            Article("order_line", follows="orders")]
TABLES = ("client", "orders", "order_line")
# Rows at a site, whole, in a stable order.
HELD = {
    "client": "SELECT id, rep, name FROM client",
    "orders": "SELECT id, client_id, note FROM orders",
    "order_line": "SELECT id, order_id, qty FROM order_line",
}
# The consolidated's rows of one rep, through the foreign keys.
SUBSET = {
    "client": "SELECT id, rep, name FROM client WHERE rep = ?",
    "orders": "SELECT o.id, o.client_id, o.note FROM orders o JOIN client c ON c.id = o.client_id WHERE c.rep = ?",
    "order_line": "SELECT l.id, l.order_id, l.qty FROM order_line l JOIN orders o ON o.id = l.order_id"
                  " JOIN client c ON c.id = o.client_id WHERE c.rep = ?",
}
# Rows of the consolidated whose chain reaches no client: they go to nobody.
ROOTLESS = ("SELECT (SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM client c WHERE c.id = o.client_id))"
            " + (SELECT count(*) FROM order_line l WHERE NOT EXISTS (SELECT 1 FROM orders o JOIN client c"
            " ON c.id = o.client_id WHERE o.id = l.order_id))")
UNSUBSCRIBED = "hq"


def reps(remotes: list[str]) -> list[str]:
    """The values a client's rep takes: each remote's, and one no remote gets."""
    return [*remotes, UNSUBSCRIBED]


def populate(conn: sqlite3.Connection, remotes: list[str]) -> None:
    """Rows the remotes get at extraction: two clients per rep, with orders and lines."""
    number = 0
    for rep in reps(remotes):
        for _ in range(2):
            number += 1
            client = -number  # negative: never a key the run's counter gives
            conn.execute("INSERT INTO client VALUES (?, ?, ?)", (client, rep, f"client {client}"))
            conn.execute("INSERT INTO orders VALUES (?, ?, ?)", (client * 10, client, f"order {client * 10}"))
            conn.executemany("INSERT INTO order_line VALUES (?, ?, ?)",
                             [(client * 100 - line, client * 10, line) for line in range(2)])


@dataclass(slots=True)
class Held:
    """The chain's rows a site holds: client -> rep, order -> client, line -> order."""

    clients: dict[int, str] = field(default_factory=dict)
    orders: dict[int, int] = field(default_factory=dict)
    lines: dict[int, int] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path, rep: str | None) -> "Held":
        """What the site at ``path`` holds; ``rep``: only that rep's clients
        and the rows under them (a remote writes only there)."""
        conn = sqlite3.connect(path)
        try:
            held = cls(dict(conn.execute("SELECT id, rep FROM client")),
                       dict(conn.execute("SELECT id, client_id FROM orders")),
                       dict(conn.execute("SELECT id, order_id FROM order_line")))
        finally:
            conn.close()
        if rep is not None:
            held.clients = {key: value for key, value in held.clients.items() if value == rep}
            held.orders = {key: value for key, value in held.orders.items() if value in held.clients}
            held.lines = {key: value for key, value in held.lines.items() if value in held.orders}
        return held

    def drop_order(self, order: int) -> None:
        del self.orders[order]
        self.lines = {key: value for key, value in self.lines.items() if value != order}


@dataclass(slots=True)
class ChainCounts:
    moves: int = 0      # clients moved to another rep (their orders and lines with them)
    handovers: int = 0  # orders given to another client


class ChainWriter:
    """Draws one site's writes to the chain; ``new_key`` is the run's counter."""

    def __init__(self, rng: random.Random, remotes: list[str], new_key: Callable[[], int]) -> None:
        self.rng = rng
        self.remotes = remotes
        self.new_key = new_key
        self.counts = ChainCounts()

    def writes(self, site: str, path: Path) -> list[tuple[str, tuple]]:
        """One transaction's statements at ``site`` (the consolidated: ``hq``)."""
        rng = self.rng
        at_hq = site == "hq"
        held = Held.read(path, None if at_hq else site)
        statements: list[tuple[str, tuple]] = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.15 or not held.clients:
                statements += self._new_client(held, rng.choice(reps(self.remotes)) if at_hq else site)
            elif roll < 0.35 or not held.orders:
                client = rng.choice(sorted(held.clients))
                statements += self._new_order(held, client)
            elif roll < 0.5:
                key = self.new_key()
                held.lines[key] = order = rng.choice(sorted(held.orders))
                statements.append(("INSERT INTO order_line VALUES (?, ?, ?)", (key, order, key)))
            elif roll < 0.56:
                statements.append(("UPDATE orders SET note = ? WHERE id = ?",
                                   (f"{site} note {self.new_key()}", rng.choice(sorted(held.orders)))))
            elif roll < 0.6:
                statements.append(("UPDATE client SET name = ? WHERE id = ?",
                                   (f"{site} name {self.new_key()}", rng.choice(sorted(held.clients)))))
            elif roll < 0.65 and held.lines:
                statements.append(("UPDATE order_line SET qty = ? WHERE id = ?",
                                   (self.new_key(), rng.choice(sorted(held.lines)))))
            elif roll < 0.77:
                statements += self._move(held, at_hq, site)
            elif roll < 0.85:
                statements += self._handover(held)
            elif roll < 0.9 and held.lines:
                line = rng.choice(sorted(held.lines))
                del held.lines[line]
                statements.append(("DELETE FROM order_line WHERE id = ?", (line,)))
            elif roll < 0.95:
                order = rng.choice(sorted(held.orders))  # its lines go by ON DELETE CASCADE
                held.drop_order(order)
                statements.append(("DELETE FROM orders WHERE id = ?", (order,)))
            else:
                statements += self._delete_client(held, rng.choice(sorted(held.clients)))
        return statements

    def _new_client(self, held: Held, rep: str) -> list[tuple[str, tuple]]:
        """A new client, and an order of it half the time."""
        key = self.new_key()
        held.clients[key] = rep
        statements = [("INSERT INTO client VALUES (?, ?, ?)", (key, rep, f"client {key}"))]
        if self.rng.random() < 0.5:
            statements += self._new_order(held, key)
        return statements

    def _new_order(self, held: Held, client: int) -> list[tuple[str, tuple]]:
        """A new order of ``client``, with zero to two lines."""
        order = self.new_key()
        held.orders[order] = client
        statements = [("INSERT INTO orders VALUES (?, ?, ?)", (order, client, f"order {order}"))]
        for _ in range(self.rng.randint(0, 2)):
            line = self.new_key()
            held.lines[line] = order
            statements.append(("INSERT INTO order_line VALUES (?, ?, ?)", (line, order, line)))
        return statements

    def _move(self, held: Held, at_hq: bool, site: str) -> list[tuple[str, tuple]]:
        """A client goes to another rep, its orders and lines with it; a
        remote hands it to another remote (or to the consolidated's own)."""
        client = self.rng.choice(sorted(held.clients))
        others = [rep for rep in reps(self.remotes) if rep != held.clients[client]]
        rep = self.rng.choice(others)
        self.counts.moves += 1
        if at_hq:
            held.clients[client] = rep
        else:  # no longer this remote's to write under
            orders = [order for order, owner in held.orders.items() if owner == client]
            del held.clients[client]
            for order in orders:
                held.drop_order(order)
        return [("UPDATE client SET rep = ? WHERE id = ?", (rep, client))]

    def _handover(self, held: Held) -> list[tuple[str, tuple]]:
        """An order changes client (at a remote, one of its own)."""
        order = self.rng.choice(sorted(held.orders))
        others = [client for client in sorted(held.clients) if client != held.orders[order]]
        if not others:
            return []
        client = self.rng.choice(others)
        held.orders[order] = client
        self.counts.handovers += 1
        return [("UPDATE orders SET client_id = ? WHERE id = ?", (client, order))]

    def _delete_client(self, held: Held, client: int) -> list[tuple[str, tuple]]:
        """A client goes, its orders first (an application's order: the
        foreign key has no action); their lines by cascade, or one by one."""
        statements: list[tuple[str, tuple]] = []
        orders = [order for order, owner in held.orders.items() if owner == client]
        if self.rng.random() < 0.5:
            for order in orders:
                statements.append(("DELETE FROM order_line WHERE order_id = ?", (order,)))
        statements.append(("DELETE FROM orders WHERE client_id = ?", (client,)))
        statements.append(("DELETE FROM client WHERE id = ?", (client,)))
        for order in orders:
            held.drop_order(order)
        del held.clients[client]
        return statements


def expected(conn: sqlite3.Connection, rep: str) -> dict[str, list[tuple]]:
    """The consolidated's rows of the chain that route to ``rep``."""
    return {table: sorted(conn.execute(SUBSET[table], (rep,)).fetchall()) for table in TABLES}


def held(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    return {table: sorted(conn.execute(HELD[table]).fetchall()) for table in TABLES}


def differences(root: Path, remote: str) -> list[str]:
    """How ``remote``'s chain differs from the consolidated's rows that route to it."""
    hq = sqlite3.connect(root / "hq.db")
    site = sqlite3.connect(root / f"{remote}.db")
    try:
        wanted, found = expected(hq, remote), held(site)
        problems = []
        for table in TABLES:
            extra = set(found[table]) - set(wanted[table])
            missing = set(wanted[table]) - set(found[table])
            if extra or missing:
                problems.append(f"{remote}: {table} differs from hq's rows routed to it "
                                f"(missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]})")
        broken = site.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            problems.append(f"{remote}: rows whose foreign key names no row: {broken[:3]}")
        return problems
    finally:
        hq.close()
        site.close()


def rootless(root: Path) -> int:
    """Orders and lines at the consolidated whose chain reaches no client."""
    conn = sqlite3.connect(root / "hq.db")
    try:
        return conn.execute(ROOTLESS).fetchone()[0]
    finally:
        conn.close()
