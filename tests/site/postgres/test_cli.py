"""The command line on a PostgreSQL consolidated named by a URI: `agent
init URI --home DIR` and the commands that take DATABASE, against a real
PostgreSQL 15 with a plain role whose password is in a pgpass file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from agent.site import open_site
from agent.site.postgres.connect import connect
from codec.fsutil import temporary_name
from tests.pgserver import write_pgpass


def test_init_with_home_makes_the_site_its_folder_and_its_key_file(agent, app_uri, tmp_path) -> None:
    home = tmp_path / "hq-home"
    code, out, err = agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address",
                           tmp_path / "inbox", "--home", home)
    assert (code, err) == (0, "")
    key = home / "keys" / "site.key"
    assert f"Secret key: {key}" in out
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    with open_site(app_uri) as site:
        assert site.identity.name == "hq" and site.home == home and site.path == app_uri
    # Later commands find the folder from the URI alone.
    code, out, err = agent("key", app_uri, "--path")
    assert (code, out.strip()) == (0, str(key)), err
    assert agent("key", app_uri, "--check")[0] == 0


def test_publications_and_remotes_are_made_from_the_uri(agent, app_uri, tmp_path) -> None:
    assert agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox",
                 "--home", tmp_path / "home")[0] == 0
    code, out, err = agent("publication", "create", app_uri, "sales", "customer@region")
    assert (code, err) == (0, ""), err
    code, out, err = agent("remote", "add", app_uri, "north", "--address", tmp_path / "north",
                           "--subscribe", "sales=north")
    assert (code, err) == (0, ""), err
    with open_site(app_uri) as site:
        assert [publication.name for publication in site.publications()] == ["sales"]
        assert [(item.remote, item.value) for item in site.subscriptions()] == [("north", "north")]


@pytest.mark.parametrize("home", [None, "relative/home"])
def test_init_without_an_absolute_home_is_one_line_and_makes_nothing(agent, app_uri, tmp_path, home,
                                                                     monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    arguments = ["init", app_uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox"]
    code, out, err = agent(*arguments, *(() if home is None else ("--home", home)))
    if home is None:
        assert code == 1 and err.strip().startswith("agent: a PostgreSQL site needs a folder")
    else:
        # The CLI makes a relative --home absolute (the folder the command ran in).
        assert code == 0, err
        with open_site(app_uri) as site:
            assert site.home == tmp_path / "relative" / "home"
        return
    assert len(err.strip().splitlines()) == 1
    with connect(app_uri) as conn:
        assert conn.execute("SELECT to_regclass('fieldsync.site')").fetchone()[0] is None


def test_a_uri_with_a_password_is_refused_without_repeating_it(agent, postgres, tmp_path) -> None:
    uri = f"postgresql://app:hunter2@127.0.0.1:{postgres.port}/sales"
    code, out, err = agent("init", uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox",
                           "--home", tmp_path / "home")
    assert code == 2 and "password" in err and "hunter2" not in err + out
    assert not (tmp_path / "home").exists()


def test_home_is_refused_for_a_sqlite_file(agent, tmp_path) -> None:
    code, out, err = agent("init", tmp_path / "hq.db", "--name", "hq", "--role", "consolidated", "--address",
                           tmp_path / "inbox", "--home", tmp_path / "home")
    assert code == 1 and "--home is for a PostgreSQL site" in err
    assert not (tmp_path / "hq.db").exists() and not (tmp_path / "home").exists()


def test_a_second_agent_on_the_database_is_refused_while_the_first_holds_it(agent, app_uri, tmp_path) -> None:
    assert agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox",
                 "--home", tmp_path / "home")[0] == 0
    with open_site(app_uri) as site, site.agent_lock():
        with open_site(app_uri) as other, pytest.raises(Exception, match="another fieldsync agent is running"):
            with other.agent_lock():
                pass
    with open_site(app_uri) as site, site.agent_lock():  # released with its holder
        pass


def test_an_unreachable_database_is_one_line(agent, tmp_path) -> None:
    code, out, err = agent("publication", "list", "postgresql://app@127.0.0.1:1/sales")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "cannot reach database sales" in err


def test_a_remote_role_is_refused_on_postgresql(agent, app_uri, tmp_path) -> None:
    code, out, err = agent("init", app_uri, "--name", "n1", "--role", "remote", "--address", tmp_path / "inbox",
                           "--home", tmp_path / "home")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert not Path(tmp_path / "home" / "keys" / "site.key").exists()


def test_extract_makes_a_remote_from_the_uri_with_its_key_beside_it(agent, app_uri, tmp_path) -> None:
    """`agent extract URI NAME FILE` as a plain role: the remote's file with
    its subset, its key file beside it, and the consolidated's row of it
    starting at the offset the command names."""
    assert agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox",
                 "--home", tmp_path / "home")[0] == 0
    assert agent("publication", "create", app_uri, "sales", "customer@region")[0] == 0
    assert agent("remote", "add", app_uri, "north", "--address", tmp_path / "north", "--subscribe",
                 "sales=north")[0] == 0
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (2, 'Bo', 'south'), (3, 'Cy', 'north')")
    target = tmp_path / "field" / "north.db"
    target.parent.mkdir()
    code, out, err = agent("extract", app_uri, "north", target)
    assert (code, err) == (0, ""), err
    with open_site(app_uri) as site:
        row = site.remote("north")
    assert f"Consistent at log offset {row.log_sent} of {app_uri}" in " ".join(out.split())
    key = target.parent / "north.db.agent" / "keys" / "site.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    with open_site(target) as remote:
        assert remote.identity.name == "north" and remote.identity.public_key == row.public_key
        assert remote.connection.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall() == [
            (1, "Ann", "north"), (3, "Cy", "north")]
        assert remote.remote("hq").log_received == row.log_sent
    code, out, err = agent("extract", app_uri, "north", target)
    assert code == 1 and "exists already" in err and len(err.strip().splitlines()) == 1


def consolidated_with_north(agent, app_uri: str, tmp_path: Path) -> Path:
    """The newcomer's walk from the CLI alone: hq made at the URI with
    folder inboxes, publication sales by region, remote north subscribed to
    north and extracted; returns north's file."""
    inbox = {name: tmp_path / "inbox" / name for name in ("hq", "north")}
    for folder in inbox.values():
        folder.mkdir(parents=True)
    assert agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", inbox["hq"],
                 "--home", tmp_path / "home")[0] == 0
    assert agent("publication", "create", app_uri, "sales", "customer@region")[0] == 0
    assert agent("remote", "add", app_uri, "north", "--address", inbox["north"], "--subscribe",
                 "sales=north")[0] == 0
    north = tmp_path / "field" / "north.db"
    north.parent.mkdir()
    assert agent("extract", app_uri, "north", north)[0] == 0
    return north


def test_run_once_sends_a_change_at_postgresql_to_the_extracted_remote(agent, app_uri, tmp_path) -> None:
    """The agent on a PostgreSQL consolidated (`agent run URI --once`,
    sending) and on its SQLite field site: a row written at PostgreSQL by an
    application, and one moved out of the remote's subset, reach the remote."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (4, 'Di', 'north'), (5, 'Ed', 'south')")
        conn.execute("UPDATE customer SET region = 'south' WHERE id = 1")
    code, out, err = agent("run", app_uri, "--once", "--send-only")
    assert (code, err) == (0, ""), err
    code, out, err = agent("run", north, "--once", "-O", "min_age=0")
    assert (code, err) == (0, ""), err
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall() == [
            (4, "Di", "north")]
    with open_site(app_uri) as site:
        assert site.remote("north").log_sent == site.log_end()


def test_run_once_both_ways_between_postgresql_and_a_field_site(agent, app_uri, tmp_path) -> None:
    """A row written at the field site reaches PostgreSQL (applied with the
    remote as origin, not echoed back), and hq's own change reaches the
    field site; both confirm, so the streams come to rest."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    with open_site(north) as remote:
        remote.connection.execute("INSERT INTO customer VALUES (7, 'Flo', 'north')")
    with connect(app_uri) as conn:
        conn.execute("UPDATE customer SET name = 'Ann B.' WHERE id = 1")
    for _ in range(3):  # north sends; hq applies and sends; north applies and confirms; hq hears it
        for site in (north, app_uri):
            code, out, err = agent("run", site, "--once", "-O", "min_age=0")
            assert (code, err) == (0, ""), err
    with connect(app_uri) as conn:
        assert conn.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall() == [
            (1, "Ann B.", "north"), (7, "Flo", "north")]
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall() == [
            (1, "Ann B.", "north"), (7, "Flo", "north")]
        assert remote.remote("hq").log_received > 0
    with open_site(app_uri) as site:
        row = site.remote("north")
        assert row.log_received > 0 and row.confirm_sent == row.log_sent
        assert site.conflicts() == () and site.apply_errors() == ()
    code, out, err = agent("status", app_uri, "--json")
    assert (code, err) == (0, ""), err
    status = json.loads(out)
    assert [peer["name"] for peer in status["remotes"]] == ["north"]


def test_a_publication_dropped_at_postgresql_reaches_the_field_site_which_stops_sending(
        agent, app_uri, tmp_path) -> None:
    """`agent publication drop` at PostgreSQL goes to north through its
    stream (docs/site-database.md, "Removing an article"): north keeps its
    rows and stops capturing customer; what it wrote before it applied the
    removal is dropped at hq with no apply error, and what it writes after
    is not sent."""
    north = consolidated_with_north(agent, app_uri, tmp_path)
    with open_site(north) as remote:
        remote.connection.execute("UPDATE customer SET name = 'before' WHERE id = 1")
    code, out, err = agent("run", north, "--once", "-O", "min_age=0")  # sent before it knows
    assert (code, err) == (0, ""), err
    code, out, err = agent("publication", "drop", app_uri, "sales")
    assert code == 0 and out.splitlines()[-1].endswith(": north"), (out, err)
    for _ in range(2):
        for site in (app_uri, north):
            code, out, err = agent("run", site, "--once", "-O", "min_age=0")
            assert (code, err) == (0, ""), err
    with open_site(north) as remote:
        assert remote.publications()[0].articles == ()
        assert remote.connection.execute("SELECT id, name FROM customer").fetchall() == [(1, "before")]
        remote.connection.execute("UPDATE customer SET name = 'after' WHERE id = 1")
    for site in (north, app_uri):
        code, out, err = agent("run", site, "--once", "-O", "min_age=0")
        assert (code, err) == (0, ""), err
    with connect(app_uri) as conn:
        assert conn.execute("SELECT id, name FROM customer").fetchall() == [(1, "Ann")]
    with open_site(app_uri) as site:
        assert site.apply_errors() == () and site.remote("north").log_received > 0


def test_orders_follow_their_customer_from_the_command_line(agent, app_uri, tmp_path) -> None:
    """`customer@region orders@->customer` at PostgreSQL, as the agent's
    own role (no superuser): an order goes with its customer to north, and
    leaves it when the customer moves south."""
    with connect(app_uri) as conn:
        conn.execute("CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer REFERENCES customer (id),"
                     " note text)")
        conn.execute("INSERT INTO orders VALUES (10, 1, 'Ann''s')")
    inbox = {name: tmp_path / "inbox" / name for name in ("hq", "north")}
    for folder in inbox.values():
        folder.mkdir(parents=True)
    assert agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", inbox["hq"],
                 "--home", tmp_path / "home")[0] == 0
    code, out, err = agent("publication", "create", app_uri, "sales", "customer@region", "orders@->customer")
    assert (code, err) == (0, ""), err
    assert agent("remote", "add", app_uri, "north", "--address", inbox["north"], "--subscribe",
                 "sales=north")[0] == 0
    north = tmp_path / "north.db"
    assert agent("extract", app_uri, "north", north)[0] == 0
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT id, customer_id FROM orders").fetchall() == [(10, 1)]
    with connect(app_uri) as conn:
        conn.execute("UPDATE customer SET region = 'south' WHERE id = 1")
    for site in (app_uri, north):
        code, out, err = agent("run", site, "--once", "-O", "min_age=0")
        assert (code, err) == (0, ""), err
    with open_site(north) as remote:
        assert remote.connection.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
        assert remote.connection.execute("SELECT count(*) FROM customer").fetchone()[0] == 0


def test_a_wrong_password_is_one_line_and_changes_nothing(agent, app_uri, postgres, tmp_path, monkeypatch) -> None:
    role = app_uri.split("//")[1].split("@")[0]
    database = app_uri.rsplit("/", 1)[1]
    monkeypatch.setenv("PGPASSFILE", str(write_pgpass(tmp_path / "wrong", [("127.0.0.1", postgres.port, database,
                                                                             role, "not-the-password")])))
    code, out, err = agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox",
                           "--home", tmp_path / "home")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"refused role {role}" in err and "not-the-password" not in err
    assert not (tmp_path / "home" / "keys" / "site.key").exists()


def test_a_missing_privilege_is_one_line_and_changes_nothing(agent, postgres, tmp_path, monkeypatch) -> None:
    """A role that may connect but not create the fieldsync schema."""
    role = postgres.create_role(password="pw")
    database = postgres.create_database()  # owned by the superuser: no CREATE for the role
    monkeypatch.setenv("PGPASSFILE", str(write_pgpass(tmp_path / "pgpass",
                                                      [("127.0.0.1", postgres.port, database, role, "pw")])))
    uri = f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"
    code, out, err = agent("init", uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox",
                           "--home", tmp_path / "home")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"role {role} lacks a privilege" in err and database in err
    with postgres.admin(database) as conn:
        assert conn.execute("SELECT to_regnamespace('fieldsync')").fetchone()[0] is None


def test_an_unsupported_column_type_is_one_line_naming_table_and_column(agent, app_uri, tmp_path) -> None:
    assert agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox",
                 "--home", tmp_path / "home")[0] == 0
    with connect(app_uri) as conn:
        conn.execute("CREATE TABLE parcel (id integer PRIMARY KEY, outline polygon)")
    code, out, err = agent("publication", "create", app_uri, "land", "parcel")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "table parcel: column outline has type polygon" in err
    with open_site(app_uri) as site:
        assert site.publications() == ()


def test_a_second_agent_run_on_the_database_is_one_line_and_exit_1(agent, app_uri, tmp_path) -> None:
    north = consolidated_with_north(agent, app_uri, tmp_path)
    assert north.exists()
    with open_site(app_uri) as holder, holder.agent_lock():
        code, out, err = agent("run", app_uri, "--once")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "another fieldsync agent is running on database" in err
    assert agent("run", app_uri, "--once")[0] == 0  # once the first has stopped


def _statements_reading(log: Path, start: int, table: str) -> list[str]:
    """The statements the server logged after byte ``start`` of its log
    that read ``table`` (log_statement = all)."""
    text = log.read_bytes()[start:].decode("utf-8", "replace")
    return [line for line in text.splitlines() if "LOG:" in line and f'FROM "public"."{table}"' in line]


def test_extract_into_a_folder_reads_each_table_once_for_every_remote(agent, app_uri, postgres, tmp_path) -> None:
    """`agent extract URI --all --into FOLDER` of five remotes reads
    customer (SUBSCRIBE BY region) and product (every row) once each, as
    the server's statement log shows; every remote gets exactly its subset
    at one log offset, and after a round of runs each holds exactly its
    subset of the rows written meanwhile."""
    subscribers = {"n1": ["north"], "n2": ["north"], "s1": ["south"], "ew": ["east", "west"], "none": []}
    inbox = {name: tmp_path / "inbox" / name for name in ["hq", *subscribers]}
    for folder in inbox.values():
        folder.mkdir(parents=True)
    with connect(app_uri) as conn:
        conn.execute("CREATE TABLE product (sku text PRIMARY KEY, price numeric(8, 2))")
        conn.execute("INSERT INTO product VALUES ('a', 1.50), ('b', 2)")
        conn.execute("INSERT INTO customer SELECT i, 'c' || i, (ARRAY['north', 'south', 'east', 'west', 'far'])"
                     "[1 + i % 5] FROM generate_series(2, 60) AS i")
    assert agent("init", app_uri, "--name", "hq", "--role", "consolidated", "--address", inbox["hq"],
                 "--home", tmp_path / "home")[0] == 0
    assert agent("publication", "create", app_uri, "sales", "customer@region", "product")[0] == 0
    for name, values in subscribers.items():
        subscribe = [argument for value in values for argument in ("--subscribe", f"sales={value}")]
        code, out, err = agent("remote", "add", app_uri, name, "--address", inbox[name], *subscribe)
        assert (code, err) == (0, ""), err
    database = app_uri.rsplit("/", 1)[1]
    with postgres.admin() as admin:
        admin.execute(f'ALTER DATABASE "{database}" SET log_statement = \'all\'')
    start = postgres.log.stat().st_size
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    # A staging file a killed extraction left (no process holds it): removed, and said.
    left = fleet / temporary_name("fieldsync-staging.db")
    left.write_bytes(b"half a staging file")
    Path(f"{left}-journal").write_bytes(b"x")
    code, out, err = agent("extract", app_uri, "--all", "--into", fleet)
    assert (code, err) == (0, ""), err
    assert f"Removed {left}, left by an extraction that did not finish." in out
    assert len(_statements_reading(postgres.log, start, "customer")) == 1
    assert len(_statements_reading(postgres.log, start, "product")) == 1
    assert sorted(path.name for path in fleet.iterdir()) == sorted(
        f"{name}.db{suffix}" for name in subscribers for suffix in ("", ".agent"))  # no staging file left

    def expected(values: list[str]) -> list[tuple]:
        with connect(app_uri) as conn:
            return conn.execute("SELECT id, name, region FROM customer WHERE region = ANY(%s) ORDER BY id",
                                (values,)).fetchall()

    def held(name: str) -> list[tuple]:
        with open_site(fleet / f"{name}.db") as remote:
            return remote.connection.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall()

    with open_site(app_uri) as site:
        [offset] = {site.remote(name).log_sent for name in subscribers}  # one point for all
    for name, values in subscribers.items():
        with open_site(fleet / f"{name}.db") as remote:
            assert remote.remote("hq").log_received == offset
            tables = remote.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT"
                                               " LIKE 'fieldsync%' ORDER BY name").fetchall()
            if not values:  # subscribed to nothing: no table
                assert tables == []
                continue
            assert tables == [("customer",), ("product",)]
            products = remote.connection.execute("SELECT sku, price FROM product ORDER BY sku").fetchall()
            assert products == [("a", "1.50"), ("b", "2.00")]  # numeric travels as its text (docs/postgres.md)
        assert held(name) == expected(values), name
    with connect(app_uri) as conn:
        conn.execute("INSERT INTO customer VALUES (100, 'new', 'north'), (101, 'new', 'west')")
        conn.execute("UPDATE customer SET region = 'south' WHERE id = 5")  # a north row moves south
        conn.execute("DELETE FROM customer WHERE id = 7")
    for _ in range(2):
        for site in (app_uri, *(fleet / f"{name}.db" for name in subscribers)):
            code, out, err = agent("run", site, "--once", "-O", "min_age=0")
            assert (code, err) == (0, ""), err
    for name, values in subscribers.items():
        if values:
            assert held(name) == expected(values), name
