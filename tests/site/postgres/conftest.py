"""Fixtures for the PostgreSQL site tests: one real PostgreSQL 15 cluster
for the session (tests/pgserver.py), a fresh database per test, and a
connection to it with the fieldsync schema installed.

A cluster that cannot start fails the tests that need it, with its log."""

from __future__ import annotations

import pytest

from agent.site.postgres.connect import connect
from agent.site.postgres.schema import install_schema
from agent.site.postgres.uri import PgTarget, parse_uri
from tests.pgserver import PostgresServer, ServerFailed


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


@pytest.fixture
def site(target):
    """A connection to a database holding the fieldsync schema."""
    conn = connect(target)
    install_schema(conn, target)
    yield conn
    conn.close()


CUSTOMER = ("CREATE TABLE customer (id serial PRIMARY KEY, name text, region text, balance double precision,"
            " photo bytea)")


@pytest.fixture
def hq(target, tmp_path):
    """A PostgreSQL consolidated site named hq, its home in tmp_path, with
    table customer published in publication p."""
    from agent.site.postgres.site import PostgresSite

    app = connect(target)
    app.execute(CUSTOMER)
    app.close()
    site = PostgresSite.init(target, name="hq", role="consolidated", home=tmp_path / "hq-home",
                             address="inbox/hq", transport="folder")
    site.create_publication("p", ["customer"])
    yield site
    site.close()


@pytest.fixture
def app(target):
    """An application's session (autocommit), knowing nothing of fieldsync."""
    conn = connect(target)
    yield conn
    conn.close()
