"""``agent schema apply`` from the command line (docs/cli.md): what it says,
what it refuses, its exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Agent, World


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
