"""`agent run URI --engine spark` on a PostgreSQL consolidated: the Spark
job prepares the same files the agent packs itself, byte for byte
(docs/spark.md; the export reads the log through the site interface, so it
is the same export whatever the backend).

Two copies of one consolidated are made as `copy_site` makes two of a
SQLite file: PostgreSQL's `CREATE DATABASE ... TEMPLATE`, each copy with
its own agent folder holding the same key file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from psycopg import sql

from agent.site import Article, open_site
from agent.site.postgres.connect import connect
from agent.site.postgres.site import PostgresSite
from codec.changes import SchemaChange
from tests.pgserver import PostgresServer, ServerFailed, write_pgpass

from .test_agent_engine import assert_same, local, on_spark, send_phase

REGIONS = ("north", "south", "east")


@pytest.fixture(scope="module")
def postgres():
    try:
        server = PostgresServer().start()
    except ServerFailed as error:
        pytest.fail(str(error), pytrace=False)
    yield server
    server.close()


def consolidated(postgres, folder: Path) -> str:
    """A PostgreSQL consolidated with three remotes (one per region, one of
    them also on a second publication) and a log of a few hundred
    transactions, a column added to orders half-way; returns its URI."""
    name = postgres.create_database()
    uri = postgres.uri(name)
    with connect(uri) as app:
        app.execute("CREATE TABLE orders (id integer PRIMARY KEY, region text NOT NULL, qty integer,"
                     " note text, price numeric(8, 2))")
        app.execute("CREATE TABLE product (sku text PRIMARY KEY, name text, price double precision)")
    from agent.admin import init_site

    site = init_site(uri, name="hq", role="consolidated", address=str(folder / "hq-inbox"), home=folder / "home")
    try:
        site.create_publication("sales", [Article("orders", subscribe_by="region")])
        site.create_publication("catalog", ["product"])
        for index, region in enumerate(REGIONS):
            site.add_remote(f"field{index}", address=str(folder / f"field{index}-inbox"), transport="folder",
                            start=0)
            site.subscribe(f"field{index}", "sales", region)
            if index != 1:
                site.subscribe(f"field{index}", "catalog")
        with connect(uri) as app:
            for batch in range(60):
                with app.transaction():
                    app.execute("INSERT INTO orders SELECT n, (ARRAY['north','south','east','west'])[1 + n %% 4],"
                                " n %% 7, 'batch ' || %s, n * 0.25 FROM generate_series(%s::integer, %s::integer) AS n",
                                (batch, batch * 50, batch * 50 + 49))
                    app.execute("UPDATE orders SET qty = qty + 1, region = 'north' WHERE id %% 11 = %s", (batch % 11,))
                    app.execute("INSERT INTO product VALUES (%s, %s, %s)", (f"sku{batch}", f"product {batch}", 1.5))
                site.scan()
                if batch == 30:  # a schema change half-way: the job carries it as the agent does
                    site.apply_schema(["ALTER TABLE orders ADD COLUMN label text DEFAULT 'none'"])
    finally:
        site.close()
    return uri


def copy_consolidated(postgres, uri: str, folder: Path) -> str:
    """A copy of the consolidated at ``uri`` with its own agent folder (the
    same key file, empty queues)."""
    with PostgresSite.open(uri) as site:
        home = site.home
        source = site.target.dbname
    copy = postgres.new_name("copy")
    with postgres.admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(source)))
    (folder / "keys").mkdir(parents=True, mode=0o700)
    shutil.copy2(home / "keys" / "site.key", folder / "keys" / "site.key")
    copied = postgres.uri(copy)
    with connect(copied) as conn:
        conn.execute("UPDATE fieldsync.identity SET home = %s", (str(folder),))
    return copied


def test_a_spark_batch_of_a_postgresql_consolidated_is_the_agents_own_files(postgres, tmp_path) -> None:
    uri = consolidated(postgres, tmp_path / "world")
    copy = copy_consolidated(postgres, uri, tmp_path / "copy-home")
    reference = send_phase(uri, local())
    spark = send_phase(copy, on_spark())
    assert spark.report.spark_batches == 1 and spark.report.ok, spark.report
    assert reference.report.spark_batches == 0
    assert_same(spark, reference)
    assert sorted(spark.outbound) == ["field0", "field1", "field2"]
    assert all(files for files in spark.outbound.values())
    with open_site(copy) as site:
        assert all(remote.log_sent == site.log_end() > 0 for remote in site.remotes())
        # The range sent holds the schema change (its own log transaction, in the files of both).
        changes = [op.steps for transaction in site.read_log("field0", 0, site.log_end()) for op in transaction.ops
                   if isinstance(op, SchemaChange)]
        assert changes == [(("add_column", "orders", "label", "\"label\" TEXT DEFAULT 'none'"),)]


def test_packing_workers_of_a_postgresql_consolidated_make_the_agents_own_files(postgres, tmp_path) -> None:
    """agent.pack_workers: each worker opens the database again with the
    agent's URI; the files are those one process packs."""
    uri = consolidated(postgres, tmp_path / "world")
    copy = copy_consolidated(postgres, uri, tmp_path / "copy-home")
    reference = send_phase(uri, local(), pack_workers=1)
    workers = send_phase(copy, local(), pack_workers=2, pack_workers_from=0)
    assert workers.report.ok, workers.report
    assert [line for line in workers.logs if line.startswith("packing ")] == [
        "packing 3 sends (backlog 183 log offsets) on 2 workers"]
    assert not any(line.startswith("packing ") for line in reference.logs)
    assert_same(workers, reference)
    assert all(files for files in workers.outbound.values())


def test_packing_workers_connect_with_the_agents_environment_of_the_moment(postgres, tmp_path, monkeypatch,
                                                                          caplog) -> None:
    """The workers' server keeps the environment it started with; a worker
    connects with the agent's: here the password file is named only after
    the server started (an earlier batch started it), and each worker still
    finds the role's password there and packs its share itself."""
    from agent.admin import init_site as init
    from agent.admin import site_keys
    from agent.outbound import BatchSend, pack_sends
    from agent.pack_workers import pack_due_sends

    first = send_phase(copy_consolidated(postgres, consolidated(postgres, tmp_path / "world"), tmp_path / "first"),
                       local(), pack_workers=2, pack_workers_from=0)  # the server runs from here on
    assert first.report.ok and any(line.startswith("packing 3 sends") for line in first.logs)
    role = postgres.create_role(password="workers-pw")
    database = postgres.create_database(owner=role)
    monkeypatch.setenv("PGPASSFILE", str(write_pgpass(tmp_path / "pgpass",
                                                      [("127.0.0.1", postgres.port, database, role, "workers-pw")])))
    uri = f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"
    with connect(uri) as app:
        app.execute("CREATE TABLE product (sku text PRIMARY KEY, name text, price double precision)")
    site = init(uri, name="hq", role="consolidated", address=str(tmp_path / "hq-inbox"), home=tmp_path / "home")
    with site:
        site.create_publication("catalog", ["product"])
        for name in ("field1", "field2", "field3"):
            site.add_remote(name, address=str(tmp_path / name), transport="folder", start=0)
            site.subscribe(name, "catalog")
        with connect(uri) as app:
            app.execute("INSERT INTO product SELECT 'sku' || n, 'product ' || n, n FROM generate_series(1, 500) AS n")
        site.scan()
        sends = [BatchSend(name, 0, site.log_end(), 0) for name in ("field1", "field2", "field3")]
        keys = site_keys(site)
        alone: list[tuple[int, str]] = []
        pack_sends(site, keys, sends, lambda index, message: alone.append((index, message.name)), max_size=10_000)
        caplog.clear()
        made: list[tuple[int, str]] = []
        outcomes = pack_due_sends(site, keys, sends, lambda index, message: made.append((index, message.name)),
                                  max_size=10_000, workers=2, workers_from=0)
    assert [outcome.error for outcome in outcomes] == [None] * 3
    assert sorted(made) == sorted(alone) and len({index for index, _ in made}) == 3
    assert not [record for record in caplog.records if "could not open" in record.getMessage()]
