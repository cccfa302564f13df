"""The site suite both backends run (the way tests/transports/conformance.py
holds every transport to one behaviour): each test here takes ``backend``
and runs once on a SQLite consolidated and once on a PostgreSQL one.

``backend`` is a consolidated named hq holding the application's tables
``customer`` (id, name, region, balance, photo) and ``line`` (its key
(line_no, order_id) in another order than its columns), declared as each
database declares them, and nothing published yet; ``backend.app()`` is an
application's session that knows nothing of fieldsync, its statements
written with ``%s`` placeholders.  The PostgreSQL side runs on the
session's one cluster (tests/site/conftest.py), a new database a test.

What one backend does not do is said in one place, NOT_ON_POSTGRESQL:
a test marked ``@pytest.mark.sqlite_only("passthrough")`` runs on SQLite,
and on PostgreSQL first checks that the reason still holds (so the list
stays exact) and is then reported as skipped with that reason.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from agent.site.sqlite.database import SiteDatabase
from codec.ops import Operation
from tests.site.sessions import App


# What the PostgreSQL consolidated does not do yet (docs/postgres.md, "The
# site"): the reason a marked test does not run there, and the check that it
# still holds.  Empty: every test here runs on both.
NOT_ON_POSTGRESQL: dict[str, tuple[str, Callable[[], bool]]] = {}

SQLITE_TABLES = (
    "CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, region TEXT, balance REAL, photo BLOB)",
    "CREATE TABLE line (order_id INTEGER NOT NULL, line_no INTEGER NOT NULL, sku TEXT NOT NULL, qty INTEGER,"
    " PRIMARY KEY (line_no, order_id)) WITHOUT ROWID",
)
POSTGRES_TABLES = (
    "CREATE TABLE customer (id integer PRIMARY KEY, name text, region text, balance double precision, photo bytea)",
    "CREATE TABLE line (order_id integer NOT NULL, line_no integer NOT NULL, sku text NOT NULL, qty integer,"
    " PRIMARY KEY (line_no, order_id))",
)


@dataclass
class Backend:
    name: str  # "sqlite" or "postgresql"
    site: Any  # the consolidated, a Site
    _connect: Callable[[], App]
    _sessions: list[App] = field(default_factory=list)

    @property
    def error(self) -> type[Exception]:
        """What the database's driver raises for a failed statement."""
        if self.name == "sqlite":
            return sqlite3.Error
        import psycopg

        return psycopg.Error

    def app(self) -> App:
        """A new application session."""
        self._sessions.append(self._connect())
        return self._sessions[-1]

    def rows(self, table: str, columns: str = "*", where: str = "") -> list[tuple]:
        """The table's rows, ordered by their first two columns."""
        session = self._sessions[0] if self._sessions else self.app()
        order = "1, 2" if columns == "*" or "," in columns else "1"
        return session.query(f"SELECT {columns} FROM {table} {where} ORDER BY {order}")

    def read_ops(self, remote: str, after: int = 0) -> list[Operation]:
        """Scan, then every operation ``remote`` reads after ``after``."""
        end = self.site.scan()
        return [op for transaction in self.site.read_log(remote, after, end) for op in transaction.ops]

    def close(self) -> None:
        for session in self._sessions:
            session.close()
        self.site.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only(reason): not on a PostgreSQL consolidated (NOT_ON_POSTGRESQL)")


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path) -> Backend:
    marker = request.node.get_closest_marker("sqlite_only")
    if request.param == "postgresql" and marker is not None:
        reason, still_holds = NOT_ON_POSTGRESQL[marker.args[0]]
        assert still_holds(), f"NOT_ON_POSTGRESQL[{marker.args[0]!r}] no longer holds: run the test on PostgreSQL"
        pytest.skip(f"not on PostgreSQL: {reason}")
    if request.param == "sqlite":
        site = SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated", address="inbox/hq",
                                 transport="folder")
        for statement in SQLITE_TABLES:
            site.connection.execute(statement)

        def connect_app() -> App:
            return App(sqlite3.connect(site.path, isolation_level=None, timeout=60, check_same_thread=False), True)
    else:
        from agent.site.postgres.connect import connect
        from agent.site.postgres.site import PostgresSite

        target = request.getfixturevalue("target")
        with connect(target) as setup:
            for statement in POSTGRES_TABLES:
                setup.execute(statement)
        site = PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "hq-home",
                                 address="inbox/hq", transport="folder")

        def connect_app() -> App:
            return App(connect(target), False)
    made = Backend(request.param, site, connect_app)
    yield made
    made.close()
