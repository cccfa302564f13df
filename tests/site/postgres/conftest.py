"""Fixtures for the PostgreSQL site tests: a connection to the test's
fresh database (tests/site/conftest.py: ``postgres``, one cluster for the
session, ``database`` and ``target``) with the fieldsync schema installed;
the command line (``agent``) and an application's database owned by a
plain role (``app_uri``)."""

from __future__ import annotations

import pytest

from agent.cli import main
from agent.site.postgres.connect import connect
from agent.site.postgres.schema import install_schema
from tests.pgserver import write_pgpass


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


@pytest.fixture
def agent(capsys):
    def run(*arguments: object) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(argument) for argument in arguments])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def app_uri(postgres, tmp_path, monkeypatch) -> str:
    """A database owned by a plain role (no superuser) that logs in with a
    password from the pgpass file PGPASSFILE names, holding table customer."""
    role, password = postgres.create_role(password="s3cret-pw"), "s3cret-pw"
    database = postgres.create_database(owner=role)
    monkeypatch.setenv("PGPASSFILE", str(write_pgpass(tmp_path / "pgpass",
                                                      [("127.0.0.1", postgres.port, database, role, password)])))
    uri = f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"
    with connect(uri) as conn:
        conn.execute("CREATE TABLE customer (id integer PRIMARY KEY, name text, region text)")
        conn.execute("INSERT INTO customer VALUES (1, 'Ann', 'north')")
    return uri
