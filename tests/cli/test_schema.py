"""``agent schema apply`` from the command line (docs/cli.md): what it says,
what it refuses, its exit codes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from .conftest import Agent, World, agent_process, sync


def columns(world: World, site: str, table: str = "customer") -> list[str]:
    return [row[1] for row in world.rows(site, f"PRAGMA table_info({table})")]


def test_a_change_says_what_it_did_and_whom_it_reaches(agent: Agent, world: World) -> None:
    result = agent("schema", "apply", world.hq, "ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT '';"
                   " CREATE INDEX customer_note ON customer (note)",
                   "CREATE TABLE visit (id INTEGER PRIMARY KEY, customer INTEGER, at TEXT)")
    assert result.code == 0, result.err
    assert "added column customer.phone; created index customer_note on customer; created table visit" in result.out
    # customer publishes id, region and name: the new column and an index on note stay at hq.
    assert "changes nothing a remote receives: it stays at hq" in result.out
    assert columns(world, "hq")[-1] == "phone"
    result = agent("schema", "apply", world.hq, "CREATE INDEX customer_name ON customer (name)")
    assert result.code == 0, result.err
    assert "reaches 2 remote(s) that hold customer, in order with the data: n1, n2" in result.out


def test_a_change_that_renames_or_drops_says_the_field_applications_must_be_ready(agent: Agent,
                                                                                  whole: World) -> None:
    added = agent("schema", "apply", whole.hq, "ALTER TABLE customer ADD COLUMN phone TEXT",
                  "CREATE INDEX customer_name ON customer (name)")
    assert added.code == 0, added.err
    assert "must be ready" not in added.out  # nothing an application uses went away
    changed = agent("schema", "apply", whole.hq, "ALTER TABLE customer RENAME COLUMN name TO full_name",
                    "ALTER TABLE customer DROP COLUMN note", "DROP INDEX customer_name")
    assert changed.code == 0, changed.err
    [line] = [line for line in changed.out.splitlines() if "must be ready" in line]
    assert line == ("Applications at the field sites must be ready for it before it reaches them: it renamed column "
                    "customer.name to full_name and dropped column customer.note and dropped index customer_name of "
                    "customer, so their SQL that still names the old ones fails there once it is applied.")


def test_a_rename_that_stays_at_the_consolidated_says_nothing_of_the_field_sites(agent: Agent, world: World) -> None:
    # customer publishes id, region and name: its note column never reaches a remote.
    changed = agent("schema", "apply", world.hq, "ALTER TABLE customer RENAME COLUMN note TO remark")
    assert changed.code == 0, changed.err
    assert "stays at hq" in changed.out and "must be ready" not in changed.out


def test_sql_comes_from_files_too(agent: Agent, world: World, tmp_path: Path) -> None:
    migration = tmp_path / "0002.sql"
    migration.write_text("-- add the visits\nCREATE TABLE visit (id INTEGER PRIMARY KEY, at TEXT);\n")
    result = agent("schema", "apply", world.hq, "--file", migration)
    assert result.code == 0, result.err
    assert "created table visit" in result.out and "changes nothing a remote receives: it stays at hq" in result.out


@pytest.mark.parametrize("arguments, code, problem", [
    (("DROP TABLE customer",), 1, "dropping a published table is refused"),
    (("ALTER TABLE customer DROP COLUMN region",), 1, "needed by its article"),
    (("UPDATE customer SET name = 'x'",), 1, "add --unchecked"),
    (("ALTER TABLE customer ADD COLUMN a TEXT", "ALTER TABLE nowhere ADD COLUMN b"), 1, "no such table: nowhere"),
    ((), 2, "give the SQL to run"),
    (("--file", "/nonexistent/migration.sql"), 1, "cannot read the SQL file"),
])
def test_a_refusal_is_one_line_and_changes_nothing(agent: Agent, world: World, arguments, code, problem) -> None:
    before = columns(world, "hq")
    result = agent("schema", "apply", world.hq, *arguments)
    assert result.code == code and len(result.err_lines) == 1 and problem in result.err, result.err
    assert columns(world, "hq") == before


def test_unchecked_runs_a_data_statement_at_the_consolidated(agent: Agent, world: World) -> None:
    result = agent("schema", "apply", world.hq, "--unchecked", "UPDATE customer SET note = 'checked' WHERE id = 1")
    assert result.code == 0, result.err
    assert "changed no table or index" in result.out
    assert world.rows("hq", "SELECT note FROM customer WHERE id = 1") == [("checked",)]


def test_a_remote_cannot_make_a_schema_change(agent: Agent, world: World) -> None:
    result = agent("schema", "apply", world.n1, "ALTER TABLE customer ADD COLUMN phone TEXT")
    assert result.code == 1 and "made at the consolidated" in result.err


# -- the acceptance scenario, from the CLI alone -----------------------------------------------------------------


def test_a_remote_offline_through_a_new_column_and_a_new_table_catches_up_exactly(agent: Agent, whole: World) -> None:
    world = whole
    world.execute("n1", "UPDATE customer SET name = 'renamed at n1' WHERE id = 1")  # n1 goes offline with it
    for statement in ("INSERT INTO customer VALUES (21, 'n1', 'before the change', NULL)",
                      "CREATE TABLE visit (id INTEGER PRIMARY KEY, customer INTEGER NOT NULL, region TEXT NOT NULL,"
                      " at TEXT)",
                      "INSERT INTO visit VALUES (1, 1, 'n1', 'monday'), (2, 2, 'n2', 'monday')"):
        world.execute("hq", statement)
    changed = agent("schema", "apply", world.hq, "ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT ''",
                    "CREATE INDEX visit_at ON visit (at)")
    assert changed.code == 0, changed.err
    assert "added column customer.phone" in changed.out and "n1, n2" in changed.out
    for statement in ("UPDATE customer SET phone = '555-0101' WHERE id = 1",
                      "INSERT INTO customer VALUES (23, 'n1', 'after the change', NULL, '555-0123')",
                      "INSERT INTO visit VALUES (3, 3, 'n1', 'tuesday')"):
        world.execute("hq", statement)
    published = agent("publication", "add", world.hq, "territory", "visit@region")
    assert published.code == 0, published.err
    world.execute("hq", "INSERT INTO visit VALUES (4, 21, 'n1', 'wednesday')")
    world.execute("hq", "UPDATE visit SET at = 'friday' WHERE id = 1")
    for _ in range(3):  # n1 stays offline through both changes
        for database in (world.hq, world.n2):
            assert agent("run", database, "--once").code == 0
    assert [row[1] for row in world.rows("n2", "PRAGMA table_info(customer)")][-1] == "phone"
    assert world.rows("n1", "SELECT count(*) FROM sqlite_master WHERE name = 'visit'") == [(0,)]
    waiting = sorted(world.inbox("n1").glob("hq.n1.d.*.fsm"))
    # The two changes travel alone in version-3 files, the data around them in version 2.
    versions = [path.read_bytes()[4] for path in waiting]
    assert versions.count(3) == 2 and set(versions) == {2, 3}

    sync(agent, world)  # n1 back: it sends its update in the old shape, then catches up
    for remote in ("n1", "n2"):
        for table in ("customer", "visit"):
            assert world.rows(remote, f"SELECT * FROM {table} ORDER BY id") == world.rows(
                "hq", f"SELECT * FROM {table} WHERE region = '{remote}' ORDER BY id"), (remote, table)
    assert world.rows("hq", "SELECT name, phone FROM customer WHERE id = 1") == [("renamed at n1", "555-0101")]
    assert world.rows("n1", "SELECT id, at FROM visit ORDER BY id") == [(1, "friday"), (3, "tuesday"), (4, "wednesday")]
    assert world.rows("n1", "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'visit'") == [
        ("visit_at",)]
    for site in ("hq", "n1", "n2"):
        assert world.rows(site, "SELECT count(*) FROM fieldsync_apply_error") == [(0,)], site

    world.execute("n1", "UPDATE customer SET phone = '555-0999' WHERE id = 23")
    world.execute("n1", "INSERT INTO visit VALUES (5, 23, 'n1', 'sunday')")
    sync(agent, world)
    assert world.rows("hq", "SELECT phone FROM customer WHERE id = 23") == [("555-0999",)]
    assert world.rows("hq", "SELECT at FROM visit WHERE id = 5") == [("sunday",)]

    before = world.rows("hq", "SELECT sql FROM sqlite_master ORDER BY name")
    refused = agent("schema", "apply", world.hq, "DROP TABLE customer")
    assert refused.code == 1 and len(refused.err_lines) == 1, refused.err
    assert "dropping a published table is refused" in refused.err
    assert world.rows("hq", "SELECT sql FROM sqlite_master ORDER BY name") == before


def test_a_remote_whose_table_was_changed_by_hand_waits_before_the_change_until_mended(agent: Agent,
                                                                                       whole: World) -> None:
    world = whole
    world.execute("n1", "ALTER TABLE customer RENAME COLUMN name TO nom")  # made by hand at n1
    assert agent("schema", "apply", world.hq, "ALTER TABLE customer ADD COLUMN phone TEXT").code == 0
    world.execute("hq", "UPDATE customer SET phone = '555' WHERE id = 1")
    assert agent("run", world.hq, "--once").code == 0
    for _ in range(2):  # each run tries again, and says why in one line
        stopped = agent("run", world.n1, "--once")
        assert stopped.code == 1 and "after it, customer must have the columns" in stopped.err, stopped.err
    status = json.loads(agent("status", world.n1, "--json").out)
    assert status["apply_errors_open"] == 1  # recorded once
    assert "phone" not in [row[1] for row in world.rows("n1", "PRAGMA table_info(customer)")]  # rolled back
    world.execute("n1", "ALTER TABLE customer RENAME COLUMN nom TO name")  # mended
    sync(agent, world)
    assert world.rows("n1", "SELECT id, phone FROM customer WHERE id = 1") == [(1, "555")]


# -- passthrough SQL (docs/site-database.md, "Passthrough") -------------------------------------------------------


def test_passthrough_runs_at_the_named_remote_only_and_its_writes_travel_back(agent: Agent, whole: World) -> None:
    """The statements run at n1 alone, in order with the data, as n1's own
    writes: they reach hq like n1's changes, n2 is untouched, and the sites
    stay converged; both ends record it, and it is no schema version."""
    world = whole
    sync(agent, world)
    world.execute("hq", "UPDATE customer SET note = 'before' WHERE id = 1")  # data before the passthrough
    sent = agent("schema", "apply", world.hq, "--passthrough", "--to", "n1",
                 "UPDATE customer SET note = 'mended at n1' WHERE id = 1; "
                 "INSERT INTO customer VALUES (31, 'n1', 'made at n1', 'passthrough')")
    assert sent.code == 0, sent.err
    assert "Passthrough SQL at offset" in sent.out and "runs at n1 only" in sent.out
    # Nothing ran at hq, and its schema version did not move.
    assert world.rows("hq", "SELECT note FROM customer WHERE id = 1") == [("before",)]
    assert world.rows("hq", "SELECT count(*) FROM customer WHERE id = 31") == [(0,)]
    assert json.loads(agent("status", world.hq, "--json").out)["site"]["schema_version"] is None
    sync(agent, world)
    assert world.rows("n1", "SELECT note FROM customer WHERE id = 1") == [("mended at n1",)]
    # n1's writes came back as its own changes: hq holds them, so does every copy that holds the rows.
    assert world.rows("hq", "SELECT id, note FROM customer WHERE id IN (1, 31) ORDER BY id") == [
        (1, "mended at n1"), (31, "passthrough")]
    for remote in ("n1", "n2"):
        assert world.rows(remote, "SELECT * FROM customer ORDER BY id") == world.rows(
            "hq", f"SELECT * FROM customer WHERE region = '{remote}' ORDER BY id"), remote
    assert world.rows("n2", "SELECT count(*) FROM fieldsync_schema_change WHERE steps LIKE '%passthrough%'") == [(0,)]
    assert world.rows("n1", "SELECT statements FROM fieldsync_schema_change WHERE steps LIKE '%passthrough%'") == [
        (json.dumps(["UPDATE customer SET note = 'mended at n1' WHERE id = 1",
                     "INSERT INTO customer VALUES (31, 'n1', 'made at n1', 'passthrough')"]),)]
    for site in ("hq", "n1", "n2"):
        assert world.rows(site, "SELECT count(*) FROM fieldsync_apply_error") == [(0,)], site
        assert json.loads(agent("status", getattr(world, site), "--json").out)["site"]["schema_version"] is None


@pytest.mark.parametrize("arguments, code, problem", [
    (("--passthrough", "--to", "n1", "ALTER TABLE customer ADD COLUMN phone TEXT"), 1,
     "passthrough carries data statements only"),
    (("--passthrough", "--to", "n1", "DELETE FROM fieldsync_remote"), 1, "the application's own tables only"),
    (("--passthrough", "--to", "n1", "PRAGMA user_version = 3"), 1, "passthrough carries data statements only"),
    (("--passthrough", "--to", "nobody", "DELETE FROM customer WHERE id = 1"), 1, "no remote named 'nobody'"),
    (("--to", "n1", "DELETE FROM customer WHERE id = 1"), 2, "--to names the remotes of --passthrough"),
    (("--passthrough", "DELETE FROM customer WHERE id = 1"), 2, "--passthrough needs the remotes"),
    (("--passthrough", "--unchecked", "--to", "n1", "DELETE FROM customer"), 2, "--unchecked does not apply"),
])
def test_a_passthrough_refusal_is_one_line_and_sends_nothing(agent: Agent, world: World, arguments, code,
                                                            problem) -> None:
    end = world.rows("hq", "SELECT max(commit_offset) FROM fieldsync_log")
    result = agent("schema", "apply", world.hq, *arguments)
    assert result.code == code and len(result.err_lines) == 1 and problem in result.err, result.err
    assert world.rows("hq", "SELECT max(commit_offset) FROM fieldsync_log") == end
    assert world.rows("hq", "SELECT count(*) FROM fieldsync_schema_change") == [(0,)]


def test_a_passthrough_that_fails_at_the_remote_stops_its_stream_there_until_mended(agent: Agent,
                                                                                 whole: World) -> None:
    world = whole
    sync(agent, world)
    world.execute("n1", "CREATE UNIQUE INDEX customer_name_once ON customer (name)")  # made by hand at n1
    taken = world.rows("n1", "SELECT name FROM customer ORDER BY id LIMIT 1")[0][0]
    assert agent("schema", "apply", world.hq, "--passthrough", "--to", "n1",
                 f"INSERT INTO customer VALUES (41, 'n1', '{taken}', NULL)").code == 0
    world.execute("hq", "UPDATE customer SET note = 'after' WHERE region = 'n1'")  # data behind it waits too
    assert agent("run", world.hq, "--once").code == 0
    stopped = agent("run", world.n1, "--once")
    assert stopped.code == 1 and "the passthrough SQL at" in stopped.err and "UNIQUE" in stopped.err, stopped.err
    assert world.rows("n1", "SELECT count(*) FROM customer WHERE id = 41 OR note = 'after'") == [(0,)]
    world.execute("n1", "DROP INDEX customer_name_once")  # mended
    sync(agent, world)
    assert world.rows("n1", "SELECT * FROM customer ORDER BY id") == world.rows(
        "hq", "SELECT * FROM customer WHERE region = 'n1' ORDER BY id")
    assert world.rows("hq", "SELECT name FROM customer WHERE id = 41") == [(taken,)]


@pytest.mark.parametrize("passthrough", [False, True], ids=["schema change", "passthrough"])
def test_a_remote_killed_while_it_applies_a_change_applies_it_once_at_its_next_run(agent: Agent, whole: World,
                                                                                  passthrough: bool) -> None:
    """SIGKILL inside the apply of a change (the crash point
    apply.in-change, after its statements ran, before the commit): nothing
    of it stays, and the next run applies it once, in order."""
    world = whole
    sync(agent, world)
    if passthrough:
        arguments = ("--passthrough", "--to", "n1", "UPDATE customer SET note = 'fixed' WHERE region = 'n1'")
    else:
        arguments = ("ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT 'none'",)
    assert agent("schema", "apply", world.hq, *arguments).code == 0
    world.execute("hq", "UPDATE customer SET name = 'after the change' WHERE region = 'n1'")
    assert agent("run", world.hq, "--once").code == 0
    before = world.rows("n1", "SELECT * FROM customer ORDER BY id")
    with agent_process("run", world.n1, "--once", env={**os.environ, "FIELDSYNC_CRASH": "apply.in-change"}) as killed:
        killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert world.rows("n1", "SELECT * FROM customer ORDER BY id") == before  # rolled back, all of it
    assert world.rows("n1", "SELECT count(*) FROM fieldsync_schema_change WHERE peer IS NOT NULL AND steps <> '[]'"
                      ) == [(0,)]
    sync(agent, world)
    for remote in ("n1", "n2"):
        assert world.rows(remote, "SELECT * FROM customer ORDER BY id") == world.rows(
            "hq", f"SELECT * FROM customer WHERE region = '{remote}' ORDER BY id"), remote
    assert world.rows("n1", "SELECT count(*) FROM fieldsync_schema_change WHERE peer IS NOT NULL AND steps <> '[]'"
                      ) == [(1,)]
    assert world.rows("n1", "SELECT count(*) FROM customer WHERE name = 'after the change'") != [(0,)]
    for site in ("hq", "n1", "n2"):
        assert world.rows(site, "SELECT count(*) FROM fieldsync_apply_error") == [(0,)], site


def test_a_remote_offline_through_a_table_rename_catches_up_exactly(agent: Agent, whole: World) -> None:
    """hq renames a published table with data logged before and after; n1,
    offline through it with an update under the old name, catches up: its
    update reaches hq under the new name, and it writes under the new name."""
    world = whole
    world.execute("n1", "UPDATE customer SET name = 'renamed at n1' WHERE id = 1")  # n1 goes offline with it
    world.execute("hq", "INSERT INTO customer VALUES (21, 'n1', 'before the rename', NULL)")
    world.execute("hq", "UPDATE customer SET note = 'hq, before' WHERE id = 2")
    renamed = agent("schema", "apply", world.hq, "ALTER TABLE customer RENAME TO client")
    assert renamed.code == 0, renamed.err
    assert "renamed table customer to client" in renamed.out and "hold client" in renamed.out
    assert "must be ready" in renamed.out
    world.execute("hq", "INSERT INTO client VALUES (23, 'n1', 'after the rename', NULL)")
    world.execute("hq", "UPDATE client SET note = 'hq, after' WHERE id = 21")
    assert world.rows("hq", "SELECT table_name FROM fieldsync_article") == [("client",)]
    for _ in range(3):  # n1 stays offline through the rename
        for database in (world.hq, world.n2):
            assert agent("run", database, "--once").code == 0
    assert world.rows("n2", "SELECT name FROM sqlite_master WHERE name IN ('customer', 'client')") == [("client",)]

    sync(agent, world)  # n1 back: it sends its update under the old name, then catches up
    for remote in ("n1", "n2"):
        assert world.rows(remote, "SELECT * FROM client ORDER BY id") == world.rows(
            "hq", f"SELECT * FROM client WHERE region = '{remote}' ORDER BY id"), remote
        assert world.rows(remote, "SELECT count(*) FROM sqlite_master WHERE name = 'customer'") == [(0,)]
    assert world.rows("hq", "SELECT name FROM client WHERE id IN (1, 21, 23) ORDER BY id") == [
        ("renamed at n1",), ("before the rename",), ("after the rename",)]
    assert world.rows("hq", "SELECT note FROM client WHERE id IN (2, 21) ORDER BY id") == [("hq, before",),
                                                                                         ("hq, after",)]
    for site in ("hq", "n1", "n2"):
        assert world.rows(site, "SELECT count(*) FROM fieldsync_apply_error") == [(0,)], site

    world.execute("n1", "UPDATE client SET name = 'n1, after the rename' WHERE id = 23")
    world.execute("n1", "INSERT INTO client VALUES (25, 'n1', 'made at n1', NULL)")
    sync(agent, world)
    assert world.rows("hq", "SELECT id, name FROM client WHERE id IN (23, 25) ORDER BY id") == [
        (23, "n1, after the rename"), (25, "made at n1")]
    assert world.rows("n2", "SELECT * FROM client ORDER BY id") == world.rows(
        "hq", "SELECT * FROM client WHERE region = 'n2' ORDER BY id")

    before = world.rows("hq", "SELECT sql FROM sqlite_master ORDER BY name")
    for statement, problem in (("ALTER TABLE client RENAME TO customer", "was the name of a published table"),
                               ("CREATE TABLE customer (id INTEGER PRIMARY KEY)", "was the name of a published table"),
                               ("DROP TABLE client", "dropping a published table is refused")):
        refused = agent("schema", "apply", world.hq, statement)
        assert refused.code == 1 and len(refused.err_lines) == 1 and problem in refused.err, refused.err
    assert world.rows("hq", "SELECT sql FROM sqlite_master ORDER BY name") == before
