"""A consolidated of either backend, for the tests that hold a PostgreSQL
site to a SQLite site's behaviour: the same table ``customer`` (SUBSCRIBE
BY region) in publication ``sales``, remotes ``north1`` (region north) and
``south1`` (region south), and application sessions that know nothing of
fieldsync.  Test modules import the fixture ``consolidated``; a test that
takes it runs once per backend."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from agent.site import Article
from agent.site.database import SiteDatabase
from agent.site.postgres.connect import connect

REGIONS = {"north1": "north", "south1": "south"}
SQLITE_CUSTOMER = "CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, region TEXT, balance REAL)"
POSTGRES_CUSTOMER = ("CREATE TABLE customer (id integer PRIMARY KEY, name text, region text,"
                     " balance double precision)")
COLUMNS = ("id", "name", "region", "balance")


class App:
    """An application's session: each ``run`` is one transaction of
    statements written with ``%s`` placeholders."""

    def __init__(self, conn: Any, sqlite: bool) -> None:
        self._conn = conn
        self._sqlite = sqlite

    def run(self, *statements: tuple[str, tuple]) -> None:
        if self._sqlite:
            self._conn.execute("BEGIN IMMEDIATE")  # waits for the write lock (a scan, another writer)
            try:
                for text, parameters in statements:
                    self._conn.execute(text.replace("%s", "?"), parameters)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
        else:
            with self._conn.transaction():
                for text, parameters in statements:
                    self._conn.execute(text, parameters)

    def rows(self, where: str = "", parameters: tuple = ()) -> dict[tuple, dict]:
        """The table's rows (those ``where`` selects) by key, as column -> value."""
        text = f"SELECT {', '.join(COLUMNS)} FROM customer {where}"
        found = self._conn.execute(text.replace("%s", "?") if self._sqlite else text, parameters).fetchall()
        return {(row[0],): dict(zip(COLUMNS, row)) for row in found}

    def close(self) -> None:
        self._conn.close()


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
