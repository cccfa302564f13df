"""Fixtures for the PostgreSQL site tests: a connection to the test's
fresh database (tests/site/conftest.py: ``postgres``, one cluster for the
session, ``database`` and ``target``) with the fieldsync schema installed."""

from __future__ import annotations

import pytest

from agent.site.postgres.connect import connect
from agent.site.postgres.schema import install_schema


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
