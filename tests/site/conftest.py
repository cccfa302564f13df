"""Shared fixtures for the site database tests: real SQLite files under
tmp_path, application connections that know nothing of fieldsync, and a
one-round replication helper."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from agent.site import Article, SiteDatabase
from agent.site.postgres.uri import PgTarget, parse_uri
from codec.errors import InvalidValue
from codec.ops import Run, Transaction, to_runs
from tests.pgserver import PostgresServer, ServerFailed

CUSTOMER = ("CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, region TEXT, balance REAL,"
            " photo BLOB, extra)")
# Key order (line_no, order_id) differs from column order on purpose.
LINE = ("CREATE TABLE line (order_id INTEGER NOT NULL, line_no INTEGER NOT NULL, sku TEXT NOT NULL, qty INTEGER,"
        " PRIMARY KEY (line_no, order_id)) WITHOUT ROWID")


# PostgreSQL for the tests of a PostgreSQL site (tests/site/postgres/) and of
# both backends (tests/site/both/): one cluster for the session, a fresh
# database for each test.  A cluster that cannot start fails them, with its log.

@pytest.fixture(scope="session")
def postgres():
    try:
        server = PostgresServer().start()  # cleans up after itself when it fails
    except ServerFailed as error:
        pytest.fail(str(error), pytrace=False)
    yield server
    server.close()


@pytest.fixture
def database(postgres) -> str:
    name = postgres.create_database()
    yield name
    postgres.drop_database(name)


@pytest.fixture
def target(postgres, database) -> PgTarget:
    """The test's database, as the agent is given it (the superuser, trusted)."""
    return parse_uri(postgres.uri(database))


def app_connection(site_or_path: SiteDatabase | str | Path) -> sqlite3.Connection:
    """A plain application connection: autocommit, explicit BEGIN/COMMIT."""
    path = site_or_path.path if isinstance(site_or_path, SiteDatabase) else str(site_or_path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    return conn


def table_rows(site_or_conn: SiteDatabase | sqlite3.Connection, table: str, where: str = "") -> list[tuple]:
    conn = site_or_conn.connection if isinstance(site_or_conn, SiteDatabase) else site_or_conn
    return conn.execute(f"SELECT * FROM {table} {where} ORDER BY 1, 2").fetchall()


def make_site(directory: Path, name: str, role: str = "consolidated", *schema: str) -> SiteDatabase:
    site = SiteDatabase.init(directory / f"{name}.db", name=name, role=role, address=f"{name}@example.org",
                             transport="folder")
    for statement in schema:
        site.connection.execute(statement)
    return site


# The form decoded transactions reach the apply path in: "operations" (a
# version-1 message, or any caller of SiteDatabase.apply) or "runs" (a
# version-2 message as the agent decodes it).  Every site test that applies
# through these helpers (decoded, replicate, tests/site/applying.py) runs in
# both; the others read no decoded transaction and run once.
_FORM = {"runs": False}
_APPLYING_HELPERS = ("decoded", "replicate", "applying")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "decoded_form" not in metafunc.fixturenames:
        return
    source = Path(metafunc.module.__file__).read_text(encoding="utf-8")
    applies = any(re.search(rf"\b{helper}\b", source) for helper in _APPLYING_HELPERS)
    metafunc.parametrize("decoded_form", ["operations", "runs"] if applies else ["operations"], indirect=True)


@pytest.fixture(autouse=True)
def decoded_form(request):
    form = getattr(request, "param", "operations")
    _FORM["runs"] = form == "runs"
    yield form
    _FORM["runs"] = False


def decoded(transaction: Transaction) -> Transaction:
    """``transaction`` in the form of this test run: with runs, its
    operations as the runs of a version-2 message (rows as tuples); an
    operation no run can carry (a malformed one) stays as it is."""
    if not _FORM["runs"]:
        return transaction
    ops: list = []
    for op in transaction.ops:
        try:
            [run] = to_runs([op])
        except InvalidValue:
            ops.append(op)
            continue
        last = ops[-1] if ops else None
        if type(last) is Run and last[:5] == run[:5] and len(last.rows) < 1000:
            ops[-1] = last._replace(rows=last.rows + tuple(run.rows))
        else:
            ops.append(run._replace(rows=tuple(run.rows)))
    return Transaction._trusted(transaction.commit, transaction.origin, tuple(ops), transaction.applied)


def replicate(publisher: SiteDatabase, subscriber: SiteDatabase):
    """One protocol round from publisher to subscriber, done by hand: scan,
    read after log_sent, apply with log_received = end, confirm."""
    name = subscriber.identity.name
    end = publisher.scan()
    start = publisher.remote(name).log_sent
    transactions = [decoded(transaction) for transaction in publisher.read_log(name, start, end)]
    result = subscriber.apply(publisher.identity.name, transactions, log_received=end)
    publisher.record_send(name, log_sent=end)
    publisher.update_remote(name, confirm_sent=end)
    subscriber.update_remote(publisher.identity.name, confirm_received=end)
    return result


@pytest.fixture
def hq(tmp_path: Path):
    """A consolidated site with customer (SUBSCRIBE BY region) and line published."""
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER, LINE)
    site.create_publication("sales", [Article("customer", subscribe_by="region"), Article("line")])
    yield site
    site.close()


ORDERS = "CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT NOT NULL, qty INTEGER, note TEXT)"
REGIONS = {"r1": "north", "r2": "south"}


def orders_world(tmp_path, rows: int):
    """hq with ``rows`` orders and the remotes of REGIONS made by extraction;
    ids 3, 6, 9, ... are north (r1), 1, 4, 7, ... south (r2), the rest east.
    Returns (hq, {name: remote}); the caller closes them."""
    hq = make_site(tmp_path, "hq", "consolidated", ORDERS)
    hq.create_publication("orders", [Article("orders", subscribe_by="region")])
    app = app_connection(hq)
    app.execute("BEGIN")
    for row_id in range(1, rows + 1):
        app.execute("INSERT INTO orders VALUES (?, ?, 1, 'seed')", (row_id, ["north", "south", "east"][row_id % 3]))
    app.execute("COMMIT")
    return hq, extracted(hq, tmp_path, "orders", REGIONS)


def extracted(hq: SiteDatabase, directory: Path, publication: str, values: dict[str, object]
              ) -> dict[str, SiteDatabase]:
    """Remotes added at ``hq``, each subscribed to ``publication`` with its
    value, extracted into ``directory`` and opened (the caller closes them)."""
    remotes = {}
    for name, value in values.items():
        hq.add_remote(name)
        hq.subscribe(name, publication, value)
        hq.extract(name, directory / f"{name}.db")
        remotes[name] = SiteDatabase.open(directory / f"{name}.db")
    return remotes
