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
  client's rep (:func:`routed`).
* The consolidated is a SQLite file or a PostgreSQL database
  (``agent chaos --consolidated``): its rows are read through a
  ``rows(table, columns)`` of the caller's (agent.chaos.sites), as they
  travel, so one check serves both.  The PostgreSQL tables are
  ``PG_SCHEMA``, the same keys and actions in its types.
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
PG_SCHEMA = [
    "CREATE TABLE client (id bigint PRIMARY KEY, rep text NOT NULL, name text)",
    "CREATE TABLE orders (id bigint PRIMARY KEY, client_id bigint NOT NULL REFERENCES client (id), note text)",
    "CREATE INDEX orders_client ON orders (client_id)",
    "CREATE TABLE order_line (id bigint PRIMARY KEY,"
    " order_id bigint NOT NULL REFERENCES orders (id) ON DELETE CASCADE, qty bigint NOT NULL)",
    "CREATE INDEX order_line_order ON order_line (order_id)",
]
ARTICLES = [Article("client", subscribe_by="rep"), Article("orders", follows="client"),
            Article("order_line", follows="orders")]
TABLES = ("client", "orders", "order_line")
# Each table's columns, whole: a row is (key, what it hangs from, a value).
COLUMNS = {"client": ("id", "rep", "name"), "orders": ("id", "client_id", "note"),
           "order_line": ("id", "order_id", "qty")}
UNSUBSCRIBED = "hq"
# A site's rows of a table (``columns``), as they travel: agent.chaos.sites.Sites.rows of one site.
Rows = Callable[[str, tuple[str, ...]], list[tuple]]


def reps(remotes: list[str]) -> list[str]:
    """The values a client's rep takes: each remote's, and one no remote gets."""
    return [*remotes, UNSUBSCRIBED]


def populate(remotes: list[str]) -> list[tuple[str, tuple]]:
    """The statements (``?`` placeholders) of the rows the remotes get at
    extraction: two clients per rep, with orders and lines."""
    statements: list[tuple[str, tuple]] = []
    number = 0
    for rep in reps(remotes):
        for _ in range(2):
            number += 1
            client = -number  # negative: never a key the run's counter gives
            statements.append(("INSERT INTO client VALUES (?, ?, ?)", (client, rep, f"client {client}")))
            statements.append(("INSERT INTO orders VALUES (?, ?, ?)", (client * 10, client, f"order {client * 10}")))
            statements += [("INSERT INTO order_line VALUES (?, ?, ?)", (client * 100 - line, client * 10, line))
                           for line in range(2)]
    return statements


@dataclass(slots=True)
class Held:
    """The chain's rows a site holds: client -> rep, order -> client, line -> order."""

    clients: dict[int, str] = field(default_factory=dict)
    orders: dict[int, int] = field(default_factory=dict)
    lines: dict[int, int] = field(default_factory=dict)

    @classmethod
    def read(cls, rows: Rows, rep: str | None) -> "Held":
        """What a site holds (``rows``: its rows of a table); ``rep``: only
        that rep's clients and the rows under them (a remote writes only there)."""
        held = cls(dict(rows("client", ("id", "rep"))), dict(rows("orders", ("id", "client_id"))),
                   dict(rows("order_line", ("id", "order_id"))))
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

    def writes(self, site: str, rows: Rows) -> list[tuple[str, tuple]]:
        """One transaction's statements at ``site`` (the consolidated:
        ``hq``), whose rows of a table ``rows`` gives."""
        rng = self.rng
        at_hq = site == "hq"
        held = Held.read(rows, None if at_hq else site)
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


def routed(hq: Rows) -> tuple[dict[str, dict[str, list[tuple]]], int]:
    """The consolidated's rows of the chain by the rep they route to, each
    table's sorted, found by following each row's foreign keys up to its
    client; and how many orders and lines reach no client (they go to nobody)."""
    found = {table: hq(table, COLUMNS[table]) for table in TABLES}
    rep_of = {client: rep for client, rep, _ in found["client"]}
    client_of = {order: client for order, client, _ in found["orders"]}
    by_rep: dict[str, dict[str, list[tuple]]] = {}
    rootless = 0
    for table in TABLES:
        for row in found[table]:
            if table == "client":
                rep = row[1]
            elif table == "orders":
                rep = rep_of.get(row[1])
            else:
                rep = rep_of.get(client_of.get(row[1]))  # type: ignore[arg-type]
            if rep is None:
                rootless += 1
                continue
            by_rep.setdefault(rep, {name: [] for name in TABLES})[table].append(row)
    for tables in by_rep.values():
        for rows in tables.values():
            rows.sort()
    return by_rep, rootless


def held(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    return {table: sorted(conn.execute(f"SELECT {', '.join(COLUMNS[table])} FROM {table}").fetchall())
            for table in TABLES}


def differences(wanted: dict[str, list[tuple]], path: Path, remote: str) -> list[str]:
    """How the chain of ``remote`` (its SQLite file ``path``) differs from
    ``wanted``, the consolidated's rows that route to it (:func:`routed`)."""
    site = sqlite3.connect(path)
    try:
        found = held(site)
        problems = []
        for table in TABLES:
            extra = set(found[table]) - set(wanted.get(table, ()))
            missing = set(wanted.get(table, ())) - set(found[table])
            if extra or missing:
                problems.append(f"{remote}: {table} differs from hq's rows routed to it "
                                f"(missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]})")
        broken = site.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            problems.append(f"{remote}: rows whose foreign key names no row: {broken[:3]}")
        return problems
    finally:
        site.close()
