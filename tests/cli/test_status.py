"""agent status: the remote-user table, queues, errors and log end."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

from agent.site import RemoteUser, SiteDatabase
from tests.sqlfiles import connected

from .conftest import Agent, World, sync

REMOTE_KEYS = [field.name for field in dataclasses.fields(RemoteUser)] + [
    "fingerprint", "sending_due", "inbound_queue", "outbound_queue"]


def _status(agent: Agent, database: Path) -> dict:
    result = agent("status", database, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_json_after_a_real_replication(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new at hq', 'x')")
    world.execute("n1", "INSERT INTO customer VALUES (200, 'n1', 'new at n1')")
    sync(agent, world)
    hq = _status(agent, world.hq)
    assert list(hq) == ["format", "database", "site", "log_end", "remotes", "queues", "spool", "quarantine",
                        "conflicts", "apply_errors", "missing_tables"]
    assert hq["spool"]["ok"] and hq["spool"]["messages"] == 0 and hq["spool"]["in_doubt"] == 0
    assert 0 < hq["spool"]["restart_span_bytes"] <= hq["spool"]["log_bytes"]
    assert hq["format"] == "fieldsync.status/1"
    assert hq["database"] == str(world.hq.resolve())
    with SiteDatabase.open(world.hq) as site:
        identity = site.identity
        log_end = site.log_end()
        rows = {row.name: row for row in site.remotes()}
    assert hq["site"]["name"] == "hq" and hq["site"]["role"] == "consolidated"
    assert hq["site"]["public_key"] == identity.public_key
    assert hq["log_end"] == log_end > 0
    assert [row["name"] for row in hq["remotes"]] == ["n1", "n2"]
    for row in hq["remotes"]:
        assert list(row) == REMOTE_KEYS
        stored = rows[row["name"]]
        for column in ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
                       "rereceive_count", "send_count", "receive_count", "address", "transport", "public_key",
                       "last_error"):
            assert row[column] == getattr(stored, column), column
        # At rest: everything sent is confirmed, up to the log end.
        assert row["confirm_sent"] == row["log_sent"] == log_end
        assert row["send_count"] > 0 and row["last_sent_at"].endswith("+00:00")
        assert row["sending_due"] is False
        assert len(row["peer_incarnation"]) == 36
    n1_row = next(row for row in hq["remotes"] if row["name"] == "n1")
    n1 = _status(agent, world.n1)
    assert n1["site"]["role"] == "remote"
    [hq_row] = n1["remotes"]
    assert hq_row["name"] == "hq"
    # Each side's received offset is the other side's sent offset.
    assert hq_row["log_received"] == hq["log_end"] and n1_row["log_received"] == n1["log_end"]
    assert hq_row["peer_incarnation"] == hq["site"]["incarnation"]
    assert {entry["peer"] for entry in hq["queues"]} == {"n1", "n2"}
    assert (hq["quarantine"], hq["conflicts"], hq["apply_errors"]) == (0, 0, 0)


def test_json_counts_conflicts_errors_and_transport_errors(agent: Agent, world: World) -> None:
    world.execute("hq", "UPDATE customer SET name = 'hq says' WHERE id = 1")
    world.execute("n1", "UPDATE customer SET name = 'n1 says' WHERE id = 1")
    world.execute("n1", "INSERT INTO customer VALUES (2, 'n1', 'clashes with hq row 2')")  # 2 is n2's row at hq
    agent("run", world.n1, "--once")
    agent("run", world.hq, "--once")
    status = _status(agent, world.hq)
    assert status["conflicts"] == 1 and status["apply_errors"] == 1
    shutil.rmtree(world.inbox("n2"))
    world.execute("hq", "INSERT INTO customer VALUES (300, 'n2', 'for n2', 'x')")
    assert agent("run", world.hq, "--once").code == 1
    rows = {row["name"]: row for row in _status(agent, world.hq)["remotes"]}
    assert rows["n2"]["last_error"] and rows["n2"]["last_error_at"]
    assert rows["n2"]["outbound_queue"] >= 1
    assert rows["n1"]["last_error"] is None


def test_human_output(agent: Agent, world: World) -> None:
    sync(agent, world, rounds=1)
    result = agent("status", world.hq)
    assert result.code == 0
    for text in ("hq (consolidated)", "log end", "sending", "receiving", "link", "confirm_sent", "log_received",
                 "n1", "n2", "on each run"):
        assert text in result.out


def test_status_of_a_site_without_remotes(tmp_path: Path, agent: Agent) -> None:
    agent("init", tmp_path / "lonely.db", "--name", "lonely", "--role", "consolidated", "--address", tmp_path)
    assert "no remote users" in agent("status", tmp_path / "lonely.db").out
    assert _status(agent, tmp_path / "lonely.db")["remotes"] == []


def test_status_errors(tmp_path: Path, agent: Agent) -> None:
    result = agent("status", tmp_path / "nope.db", "--json")
    assert result.code == 1 and len(result.err_lines) == 1 and result.out == ""
    text = tmp_path / "text.db"
    text.write_text("not sqlite " * 100)
    result = agent("status", text)
    assert result.code == 1 and len(result.err_lines) == 1 and "SQLite database" in result.err
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).execute("CREATE TABLE t (x)").connection.close()
    result = agent("status", plain)
    assert result.code == 1 and len(result.err_lines) == 1 and "not a fieldsync site" in result.err


def test_brackets_in_names_and_values_print_as_they_are(agent, tmp_path) -> None:
    """Addresses, subscription values and paths are the users': rich markup
    in them ([/x] would not even parse) prints as written, everywhere."""
    folder = tmp_path / "[bold]sites"
    folder.mkdir()
    hq = folder / "hq.db"
    result = agent("init", hq, "--name", "hq", "--role", "consolidated", "--address", "in/[/x]")
    assert result.code == 0 and "Inbox: in/[/x] (folder)" in result.out, result.err
    with connected(hq) as conn:
        conn.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT)")
    assert agent("publication", "create", hq, "territory", "customer@region").code == 0
    result = agent("remote", "add", hq, "west", "--address", "in/[red]w", "--subscribe", "territory=[/x]")
    assert result.code == 0 and "in/[red]w" in result.out, result.err
    for command in (("status", hq), ("remote", "list", hq), ("publication", "list", hq), ("inbox", hq)):
        result = agent(*command)
        assert result.code in (0, 1) and "internal error" not in result.err, (command, result.err)
        assert "[/x]" in result.out or command[0] == "inbox", (command, result.out)
    status = agent("status", hq)
    assert f"hq (consolidated) in {hq}" in status.out and "in/[/x]" in status.out
    listed = agent("remote", "list", hq).out
    assert "in/[red]w" in listed and "territory=[/x]" in listed
