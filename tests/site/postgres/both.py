"""A consolidated of either backend, for the tests that hold a PostgreSQL
site to a SQLite site's behaviour: the same table ``customer`` (SUBSCRIBE
BY region) in publication ``sales``, remotes ``north1`` (region north) and
``south1`` (region south), and application sessions that know nothing of
fieldsync.  Test modules import the fixture ``consolidated``; a test that
takes it runs once per backend."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from agent.site import Article
from agent.site.sqlite.database import SiteDatabase
from agent.site.postgres.connect import connect
from tests.site.sessions import App as Session

REGIONS = {"north1": "north", "south1": "south"}
SQLITE_CUSTOMER = "CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, region TEXT, balance REAL)"
POSTGRES_CUSTOMER = ("CREATE TABLE customer (id integer PRIMARY KEY, name text, region text,"
                     " balance double precision)")
COLUMNS = ("id", "name", "region", "balance")


class App(Session):
    """An application's session (tests/site/sessions.py) on the table customer."""

    def rows(self, where: str = "", parameters: tuple = ()) -> dict[tuple, dict]:
        """The table's rows (those ``where`` selects) by key, as column -> value."""
        text = f"SELECT {', '.join(COLUMNS)} FROM customer {where}"
        found = self._conn.execute(self._text(text), parameters).fetchall()
        return {(row[0],): dict(zip(COLUMNS, row)) for row in found}


WRITERS = 4
TRANSACTIONS = 70
SHARED = 40  # rows every writer updates and moves between regions


def write_rows(app: App, number: int, stop: threading.Event, transactions: int = TRANSACTIONS,
               before_last: Callable[[], object] | None = None) -> None:
    """One writer's transactions (an application's): its own rows
    inserted, changed, moved and deleted, and the shared rows 1 to SHARED
    (made by the test) changed and moved by every writer, one a
    transaction (no deadlock); ``stop`` ends it early.  ``before_last`` is
    called before the last transaction (a test waits there for a reader)."""
    rng = random.Random(number)
    mine: list[int] = []
    next_id = number * 100_000
    regions = ("north", "south", "east")
    for left in range(transactions, 0, -1):
        if stop.is_set():
            return
        if left == 1 and before_last is not None:
            before_last()
        choice = rng.random()
        shared = rng.randrange(1, SHARED + 1)
        if choice < 0.3 or not mine:
            statements = []
            for _ in range(rng.randrange(1, 4)):
                next_id += 1
                mine.append(next_id)
                statements.append(("INSERT INTO customer VALUES (%s, %s, %s, %s)",
                                   (next_id, f"n{next_id}", rng.choice(regions), rng.random())))
        elif choice < 0.5:  # a shared row moves to another region
            statements = [("UPDATE customer SET region = %s, balance = %s WHERE id = %s",
                           (rng.choice(regions), rng.random(), shared))]
        elif choice < 0.6:  # a shared row changes within its region, and one of ours moves
            statements = [("UPDATE customer SET name = %s WHERE id = %s", (f"w{number}-{rng.random()}", shared)),
                          ("UPDATE customer SET region = %s WHERE id = %s", (rng.choice(regions), rng.choice(mine)))]
        elif choice < 0.7:  # out of its region and back in one transaction
            row = rng.choice(mine)
            statements = [("UPDATE customer SET region = 'east', name = 'away' WHERE id = %s", (row,)),
                          ("UPDATE customer SET region = %s, name = %s WHERE id = %s",
                           (rng.choice(regions), f"back{row}", row))]
        elif choice < 0.8:  # deleted and inserted again
            row = rng.choice(mine)
            statements = [("DELETE FROM customer WHERE id = %s", (row,)),
                          ("INSERT INTO customer VALUES (%s, %s, %s, %s)", (row, f"again{row}", rng.choice(regions),
                                                                            1.5))]
        elif choice < 0.9:
            row = mine.pop(rng.randrange(len(mine)))
            statements = [("DELETE FROM customer WHERE id = %s", (row,))]
        else:  # inserted, changed and deleted: nothing for anyone
            next_id += 1
            statements = [("INSERT INTO customer VALUES (%s, 'brief', 'north', 0)", (next_id,)),
                          ("UPDATE customer SET region = 'south' WHERE id = %s", (next_id,)),
                          ("DELETE FROM customer WHERE id = %s", (next_id,))]
        app.run(*statements)
        time.sleep(rng.random() * 0.004)  # the cuts and reads meet the writers half-way



def seed(app: App) -> None:
    """The shared rows write_rows changes, half north, half south."""
    app.run(*[("INSERT INTO customer VALUES (%s, %s, %s, %s)", (row, f"s{row}", ("north", "south")[row % 2], 0.0))
              for row in range(1, SHARED + 1)])


@dataclass
class Consolidated:
    backend: str
    site: Any  # a Site
    app: Callable[[], App]  # a new application session


@pytest.fixture(params=["sqlite", "postgresql"])
def consolidated(request, tmp_path):
    sessions: list[App] = []
    if request.param == "sqlite":
        site = SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated", address="inbox/hq",
                                 transport="folder")
        site.connection.execute(SQLITE_CUSTOMER)

        def app() -> App:
            sessions.append(App(sqlite3.connect(site.path, isolation_level=None, timeout=60,
                                                check_same_thread=False), True))
            return sessions[-1]
    else:
        from agent.site.postgres.site import PostgresSite

        target = request.getfixturevalue("target")
        with connect(target) as setup:
            setup.execute(POSTGRES_CUSTOMER)
        site = PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "hq-home",
                                 address="inbox/hq", transport="folder")

        def app() -> App:
            sessions.append(App(connect(target), False))
            return sessions[-1]
    site.create_publication("sales", [Article("customer", subscribe_by="region")])
    for remote, region in REGIONS.items():
        site.add_remote(remote, address=f"inbox/{remote}")
        site.subscribe(remote, "sales", region)
    yield Consolidated(request.param, site, app)
    for session in sessions:
        session.close()
    site.close()
