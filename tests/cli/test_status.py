"""agent status: the remote-user table, queues, errors and log end."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sqlite3
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest

import agent.cli.status as status_module

from agent.site import RemoteUser, SiteDatabase
from tests.sqlfiles import connected

from .conftest import Agent, World, sync

REMOTE_KEYS = [field.name for field in dataclasses.fields(RemoteUser)] + [
    "fingerprint", "sending_due", "inbound_queue", "outbound_queue", "lag", "control_sent_at_iso", "heard_at_iso",
    "data_sent_at_iso", "apply_errors_open", "in_error", "schema_current"]


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
                        "conflicts", "apply_errors", "missing_tables", "apply_errors_open"]
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
        # At rest: everything sent is confirmed, and the log was read for each peer to its end.
        assert row["confirm_sent"] == row["log_sent"] and rows[row["name"]].horizon == log_end
        if row["name"] == "n1":  # n2 had nothing new: it was sent no message (docs/protocol.md, rule 5)
            assert row["send_count"] > 0 and row["last_sent_at"].endswith("+00:00")
        assert row["sending_due"] is False and row["lag"] == 0
        assert len(row["peer_incarnation"]) == 36
    n1_row = next(row for row in hq["remotes"] if row["name"] == "n1")
    n1 = _status(agent, world.n1)
    assert n1["site"]["role"] == "remote"
    [hq_row] = n1["remotes"]
    assert hq_row["name"] == "hq"
    # Each side's received offset is the other side's sent offset.
    assert hq_row["log_received"] == n1_row["log_sent"] and n1_row["log_received"] == hq_row["log_sent"]
    assert hq_row["log_sent"] <= n1["log_end"] and n1_row["log_sent"] <= hq["log_end"]
    assert hq_row["peer_incarnation"] == hq["site"]["incarnation"]
    assert hq["queues"] == []  # at rest nothing is queued, and an empty queue is not listed
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
    for command in (("status", hq), ("remote", "list", hq), ("publication", "list", hq, "--subscribers"),
                    ("inbox", hq)):
        result = agent(*command)
        assert result.code in (0, 1) and "internal error" not in result.err, (command, result.err)
        assert "[/x]" in result.out or command[0] == "inbox", (command, result.out)
    status = agent("status", hq)
    assert f"hq (consolidated) in {hq}" in status.out and "in/[/x]" in status.out
    listed = agent("remote", "list", hq).out
    assert "in/[red]w" in listed and "territory=[/x]" in listed


# -- a fleet's view: --json written row by row, --json-lines, filters ---------------------


def test_json_is_the_documented_document_written_a_remote_at_a_time(agent: Agent, world: World) -> None:
    """The output of --json is byte for byte json.dumps(indent=2) of the
    whole document, as before it was written row by row."""
    sync(agent, world, rounds=1)
    result = agent("status", world.hq, "--json")
    assert result.code == 0, result.err
    assert result.out == json.dumps(json.loads(result.out), indent=2, ensure_ascii=False) + "\n"
    assert result.out == json.dumps(status_module.collect_status(world.hq), indent=2, ensure_ascii=False) + "\n"
    lonely = agent("status", world.n1, "--lagging", "--json")
    assert lonely.out == json.dumps(json.loads(lonely.out), indent=2, ensure_ascii=False) + "\n"


def _parts(rows: Iterator[list]) -> status_module.StatusParts:
    return status_module.StatusParts({"format": status_module.FORMAT, "log_end": 7}, rows,
                                     {"queues": [], "quarantine": 0}, total=3, keys=("name",))


def _rows_then_failure() -> Iterator[list]:
    yield ["n1"]
    yield ["n2"]
    raise RuntimeError("the third row could not be read")


@pytest.mark.parametrize("writer", [status_module.write_lines, status_module.write_document])
def test_each_remote_is_written_as_soon_as_it_is_read(writer) -> None:  # type: ignore[no-untyped-def]
    written: list[str] = []
    with pytest.raises(RuntimeError):
        writer(written.append, _parts(_rows_then_failure()))
    text = "".join(written)
    assert '"n1"' in text and '"n2"' in text  # out before the third row was asked for


@pytest.mark.parametrize("c_encoder", [True, False], ids=["C encoder", "JSONEncoder.encode"])
def test_rows_are_written_as_json_dumps_writes_them_whatever_their_values(c_encoder, monkeypatch) -> None:
    """Each row is written from a template of its keys filled with its
    values' JSON texts: byte for byte what json.dumps writes, for text with
    line breaks, quotes, braces and ``%``, keys that need quoting or are not
    ASCII, and values json writes over several lines (lists, objects)."""
    assert status_module._C_VALUES is not None  # CPython's
    if not c_encoder:
        monkeypatch.setattr(status_module, "_C_VALUES", None)
    keys = ("name", "100%", "naïve \"key\"", "note", "flag", "number", "nested")
    rows = [["n1", 1.5, None, 'line\nbreak "quoted" %s %(x)s },\n{\u2028\x01', True, float("inf"), "}\n    {"],
            ["n2", -0.0, 10**20, "ü", False, float("nan"), [1, [2, "a\nb"]]],
            ["n3", 0, "%", "\\", None, 1e-7, ""],
            ["n4", 1, 2, "", None, 3, {"a": None}],
            ["n5", 1, 2, "", None, 3, []]]
    tail = {"queues": [{"peer": "n1", "inbound": 1, "outbound": 0}], "quarantine": 0}

    def parts() -> status_module.StatusParts:
        return status_module.StatusParts({"format": status_module.FORMAT, "log_end": 7}, iter(rows), tail,
                                          total=5, keys=keys)

    written: list[str] = []
    assert status_module.write_document(written.append, parts()) == 5
    document = {"format": status_module.FORMAT, "log_end": 7, "remotes": [dict(zip(keys, row)) for row in rows],
                **tail}
    assert "".join(written) == json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    written.clear()
    assert status_module.write_lines(written.append, parts()) == 5
    lines = "".join(written).split("\n")  # (not splitlines: U+2028 ends no line of JSON Lines)
    assert lines[1:-2] == [json.dumps({"kind": "remote", **dict(zip(keys, row))}, ensure_ascii=False,
                                      separators=(",", ":")) for row in rows]


def test_json_lines(agent: Agent, world: World) -> None:
    sync(agent, world, rounds=1)
    result = agent("status", world.hq, "--json-lines")
    assert result.code == 0, result.err
    lines = [json.loads(line) for line in result.out.splitlines()]
    site, *remotes, end = lines
    document = _status(agent, world.hq)
    assert site == {"kind": "site", **{key: value for key, value in document.items()
                                       if key not in ("remotes", "queues", "format", "spool")},
                    "format": "fieldsync.status-lines/1", "spool": site["spool"]}
    assert list(site)[:3] == ["kind", "format", "database"]
    assert [{key: value for key, value in row.items() if key != "kind"} for row in remotes] == document["remotes"]
    assert all(row["kind"] == "remote" for row in remotes)
    assert end == {"kind": "end", "remotes": 2, "of": 2}
    assert agent("status", world.hq, "--json", "--json-lines").code == 2


def _lines(agent: Agent, database: Path, *filters: str) -> list[str]:
    result = agent("status", database, "--json-lines", *filters)
    assert result.code == 0, result.err
    *_, end = [json.loads(line) for line in result.out.splitlines()]
    names = [row["name"] for row in map(json.loads, result.out.splitlines()) if row["kind"] == "remote"]
    assert end["remotes"] == len(names) and end["of"] == 2
    document = _status(agent, database) if not filters else json.loads(agent("status", database, "--json",
                                                                             *filters).out)
    assert [row["name"] for row in document["remotes"]] == names  # --json filters alike
    return names


def test_lagging_peers(agent: Agent, world: World) -> None:
    sync(agent, world)
    assert _lines(agent, world.hq, "--lagging") == []
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n2', 'for n2', 'x')")
    assert agent("run", world.hq, "--once").code == 0
    # n2 was sent the row and has not confirmed it; the range held nothing
    # for n1, which was sent nothing and holds nothing back (rule 8).
    assert _lines(agent, world.hq, "--lagging") == ["n2"]
    for database in (world.n1, world.hq):
        assert agent("run", database, "--once").code == 0
    assert _lines(agent, world.hq, "--lagging") == ["n2"]
    row = json.loads(agent("status", world.hq, "--json").out)["remotes"][1]
    assert row["name"] == "n2" and row["lag"] == row["log_sent"] - row["confirm_sent"] > 0
    human = agent("status", world.hq, "--lagging").out
    assert "1 of 2 remotes: --lagging" in human and "n2" in human
    assert "│ n1 " not in human


def test_silent_peers(agent: Agent, world: World) -> None:
    world.execute("n1", "INSERT INTO customer VALUES (200, 'n1', 'from n1')")
    sync(agent, world)
    # n2 never sent data, only control messages, and was added long ago: it
    # was heard from all the same (a site that only receives is alive).
    long_ago = datetime.now(timezone.utc) - timedelta(days=4)
    world.execute("hq", "UPDATE fieldsync_remote SET created_at = ? WHERE name = 'n2'", (long_ago.isoformat(),))
    assert world.rows("hq", "SELECT last_received_at FROM fieldsync_remote WHERE name = 'n2'") == [(None,)]
    assert _lines(agent, world.hq, "--silent-for", "3d") == []
    world.execute("hq", "UPDATE fieldsync_remote SET heard_at = ? WHERE name = 'n1'", (long_ago.timestamp(),))
    # n2 as if never heard from: it counts from when it was added.
    world.execute("hq", "UPDATE fieldsync_remote SET heard_at = NULL WHERE name = 'n2'")
    assert _lines(agent, world.hq, "--silent-for", "3d") == ["n1", "n2"]
    assert _lines(agent, world.hq, "--silent-for", "4d1h") == []
    assert _lines(agent, world.hq, "--silent-for", "97h") == []
    assert _lines(agent, world.hq, "--silent-for", "1d") == ["n1", "n2"]
    recently = datetime.now(timezone.utc) - timedelta(hours=1)
    world.execute("hq", "UPDATE fieldsync_remote SET heard_at = ? WHERE name = 'n2'", (recently.timestamp(),))
    assert _lines(agent, world.hq, "--silent-for", "1d") == ["n1"]
    # A row not heard from since layout 7 goes by its last data message.
    world.execute("hq", "UPDATE fieldsync_remote SET heard_at = NULL, last_received_at = ? WHERE name = 'n1'",
                  (recently.isoformat(),))
    assert _lines(agent, world.hq, "--silent-for", "1d") == []
    for bad in ("soon", "0", "400d", "3d3d"):
        result = agent("status", world.hq, "--silent-for", bad)
        assert result.code == 2 and "--silent-for" in result.err, bad


def test_peers_with_errors_and_filters_together(agent: Agent, world: World) -> None:
    sync(agent, world)
    assert _lines(agent, world.hq, "--errors") == []
    world.execute("n1", "INSERT INTO customer VALUES (2, 'n1', 'clashes with hq row 2')")  # an apply error at hq
    for database in (world.n1, world.hq):
        agent("run", database, "--once")
    assert _lines(agent, world.hq, "--errors") == ["n1"]
    shutil.rmtree(world.inbox("n2"))
    world.execute("hq", "INSERT INTO customer VALUES (300, 'n2', 'for n2', 'x')")
    assert agent("run", world.hq, "--once").code == 1  # n2's inbox is gone: a transport error
    assert _lines(agent, world.hq, "--errors") == ["n1", "n2"]
    assert _lines(agent, world.hq, "--errors", "--lagging") == ["n1", "n2"]
    world.execute("hq", "UPDATE fieldsync_remote SET heard_at = ?",
                  ((datetime.now(timezone.utc) - timedelta(days=10)).timestamp(),))
    world.execute("hq", "UPDATE fieldsync_remote SET heard_at = NULL, last_received_at = NULL, created_at = ?"
                  " WHERE name = 'n2'", (datetime.now(timezone.utc).isoformat(),))
    assert _lines(agent, world.hq, "--errors", "--silent-for", "3d") == ["n1"]


def test_json_of_ten_thousand_remotes_within_two_seconds(tmp_path: Path, agent: Agent) -> None:
    from agent.site.remote_rules import NewRemote

    database = tmp_path / "hq.db"
    assert agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "in").code == 0
    with SiteDatabase.open(database) as site:
        site.add_remotes([NewRemote(f"site{number:05d}", address=f"inbox/{number}", transport="folder")
                          for number in range(10000)])
    for option in ("--json", "--json-lines"):
        # The command's own time: the CPU this process spent on it.  The clock on the wall also counts the
        # time the machine gave to others (the suite's other pytest-xdist worker, two cores shared), which
        # is no part of what status costs; it is bounded to show the command waits on nothing.
        started, cpu_started = time.monotonic(), time.process_time()
        result = agent("status", database, option)
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
        assert result.code == 0 and result.out.count('"name": "site') + result.out.count('"name":"site') == 10000
        assert cpu < 2, (option, cpu, elapsed)
        assert elapsed < 6, (option, cpu, elapsed)


def test_json_makes_no_remote_user_of_a_row(agent: Agent, world: World, monkeypatch) -> None:
    """At a hundred thousand remotes a RemoteUser made per row was most of
    what status cost: its rows come as plain values, straight from SQLite."""
    import agent.site.sqlite.remotes as sqlite_remotes

    sync(agent, world, rounds=1)
    expected = agent("status", world.hq, "--json").out

    def refused(values: tuple) -> RemoteUser:
        raise AssertionError("a RemoteUser was made of a row")

    monkeypatch.setattr(sqlite_remotes, "_row", refused)
    for option in ("--json", "--json-lines"):
        result = agent("status", world.hq, option)
        assert result.code == 0, result.err
    assert agent("status", world.hq, "--json").out == expected


# -- --errors: the peers in error now ----------------------------------------------------------


def _rows(agent: Agent, database: Path) -> dict[str, dict]:
    return {row["name"]: row for row in _status(agent, database)["remotes"]}


def test_errors_lists_the_peers_in_error_now_and_keeps_the_history(agent: Agent, world: World) -> None:
    """The issue's case: an inbox folder went away and came back, and an
    apply error of another peer was acknowledged: neither is listed any
    more, and both are still counted."""
    sync(agent, world)
    world.execute("n1", "INSERT INTO customer VALUES (2, 'n1', 'clashes with hq row 2')")  # an apply error at hq
    for database in (world.n1, world.hq):
        agent("run", database, "--once")
    shutil.rmtree(world.inbox("n2"))
    world.execute("hq", "INSERT INTO customer VALUES (300, 'n2', 'for n2', 'x')")
    assert agent("run", world.hq, "--once").code == 1  # n2's inbox is gone: a transport error
    assert _lines(agent, world.hq, "--errors") == ["n1", "n2"]
    rows = _rows(agent, world.hq)
    assert rows["n2"]["in_error"] and rows["n2"]["error_count"] == 1
    assert rows["n2"]["error_seen_at"] == rows["n2"]["last_error_at"]
    assert (rows["n1"]["in_error"], rows["n1"]["apply_errors_open"], rows["n1"]["last_error"]) == (True, 1, None)

    world.inbox("n2").mkdir()  # the folder came back: the queued files go out at the next run
    assert agent("run", world.hq, "--once").code == 0
    assert _lines(agent, world.hq, "--errors") == ["n1"]
    n2 = _rows(agent, world.hq)["n2"]
    assert (n2["in_error"], n2["last_error"], n2["last_error_at"], n2["outbound_queue"]) == (False, None, None, 0)
    assert n2["error_count"] == 1 and n2["error_seen_at"] is not None  # the history stays
    human = agent("status", world.hq).out
    assert "1 recorded" in human and "1 apply error not acknowledged" in human

    result = agent("remote", "ack-errors", world.hq, "n1")
    assert result.code == 0 and "Acknowledged 1 apply error of n1" in result.out
    assert _lines(agent, world.hq, "--errors") == []
    status = _status(agent, world.hq)
    assert (status["apply_errors"], status["apply_errors_open"]) == (1, 0)  # kept as history
    with SiteDatabase.open(world.hq) as site:
        (error,) = site.apply_errors()
    assert error.peer == "n1" and error.acknowledged_at is not None

    # A new apply error after the acknowledgement puts the peer in error again.
    world.execute("n1", "INSERT INTO customer VALUES (4, 'n1', 'clashes with hq row 4')")
    for database in (world.n1, world.hq):
        agent("run", database, "--once")
    assert _lines(agent, world.hq, "--errors") == ["n1"]
    assert _rows(agent, world.hq)["n1"]["apply_errors_open"] == 1


def test_a_message_received_from_the_peer_ends_its_transport_error(agent: Agent, world: World) -> None:
    sync(agent, world)
    with SiteDatabase.open(world.hq) as site:
        site.record_transport_error("n2", "SMTP 421 try again later")
    assert _lines(agent, world.hq, "--errors") == ["n2"]
    sent_before = _rows(agent, world.hq)["n2"]["send_count"]
    world.execute("n2", "INSERT INTO customer VALUES (400, 'n2', 'from n2')")
    assert agent("run", world.n2, "--once").code == 0
    assert agent("run", world.hq, "--once", "--receive-only").code == 0
    n2 = _rows(agent, world.hq)["n2"]
    assert n2["send_count"] == sent_before  # nothing went to n2: the receive ended the error
    assert (n2["last_error"], n2["in_error"], n2["error_count"]) == (None, False, 1)
    assert _lines(agent, world.hq, "--errors") == []


def _copy(source: Path, target: Path) -> None:
    with connected(source) as conn, connected(target) as copy:
        conn.backup(copy)


def test_a_stopped_stream_stays_listed_until_the_stream_runs_again(agent: Agent, world: World,
                                                                  tmp_path: Path) -> None:
    """n1 is restored from an older copy (a new incarnation id): hq stops
    its stream.  Sending to n1 still works, and does not end that; the
    re-extracted n1 does, once hq hears from it."""
    sync(agent, world)
    backup = tmp_path / "n1-backup.db"
    _copy(world.n1, backup)
    sync(agent, world, rounds=1)
    _copy(backup, world.n1)  # restored: the agent gives it a new incarnation at its next run
    world.execute("n1", "INSERT INTO customer VALUES (500, 'n1', 'after the restore')")
    agent("run", world.n1, "--once")
    assert agent("run", world.hq, "--once").code == 1
    assert _lines(agent, world.hq, "--errors") == ["n1"]
    n1 = _rows(agent, world.hq)["n1"]
    assert "stream is stopped" in n1["stream_stopped"] and n1["stream_stopped_at"]
    assert (n1["last_error"], n1["error_count"], n1["in_error"]) == (None, 1, True)
    assert "stream stopped" in agent("status", world.hq, "--errors").out

    sent = n1["send_count"]
    world.execute("hq", "INSERT INTO customer VALUES (600, 'n1', 'for n1', 'x')")
    agent("run", world.hq, "--once")
    n1 = _rows(agent, world.hq)["n1"]
    assert n1["send_count"] > sent and n1["stream_stopped"]  # a successful send does not end it
    assert _lines(agent, world.hq, "--errors") == ["n1"]

    # n1 is extracted again, in place of the restored copy.
    world.n1.unlink()
    for leftover in tmp_path.glob("n1.db-*"):
        leftover.unlink()
    shutil.rmtree(tmp_path / "n1.db.agent")
    assert agent("extract", world.hq, "n1", world.n1).code == 0
    assert _lines(agent, world.hq, "--errors") == ["n1"]  # extracted, not yet heard from
    assert agent("run", world.n1, "--once").code == 0
    assert agent("run", world.hq, "--once").code == 0
    n1 = _rows(agent, world.hq)["n1"]
    assert (n1["stream_stopped"], n1["stream_stopped_at"], n1["in_error"]) == (None, None, False)
    assert n1["error_count"] >= 1 and n1["error_seen_at"]
    assert _lines(agent, world.hq, "--errors") == []


CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _documented_keys() -> tuple[set[str], set[str]]:
    """The keys docs/cli.md's table of fieldsync.status/1 names: at the top
    level, and of an item of ``remotes``."""
    text = CLI_DOC.read_text()
    table = text[text.index("| key | type | meaning |"):]
    table = table[:table.index("\n\n")]
    top: set[str] = set()
    remote: set[str] = set()
    for line in table.splitlines()[2:]:
        names = re.findall(r"`([^`]+)`", line.split(" | ")[0])
        if names[0].startswith("remotes[]."):
            remote.update(name.removeprefix("remotes[].") for name in names)
        else:
            top.update(name.split(".")[0] for name in names)
    return top, remote


def test_the_doc_lists_every_key_of_the_status_document(agent: Agent, world: World) -> None:
    top, remote = _documented_keys()
    status = _status(agent, world.hq)
    assert set(status) == top
    assert set(status["remotes"][0]) == remote
    filters = CLI_DOC.read_text()
    assert "| `--errors` | it is in error *now*" in filters and "agent remote ack-errors DB NAME" in filters


def test_a_fleet_gets_a_summary_and_the_peers_that_need_attention(agent: Agent, tmp_path: Path) -> None:
    """Plain status at a fleet: a line of counts (at rest, lagging, silent,
    in error) and the rows of the peers that need attention; --all shows
    every peer."""
    hq = tmp_path / "hq.db"
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "in").code == 0
    fleet = tmp_path / "fleet.csv"
    fleet.write_text("name,address\n" + "".join(f"depot{n:02d},{tmp_path / f'd{n}'}\n" for n in range(30)))
    assert agent("remote", "add", hq, "--from", fleet).code == 0
    with SiteDatabase.open(hq) as site:
        site.update_remote("depot07", heard_at=time.time())  # heard from just now: at rest
        site.update_remote("depot08", heard_at=time.time() - 3 * 86400)  # silent for three days
        site.update_remote("depot09", heard_at=time.time(), last_error="cannot send to folder: it does not exist")
    result = agent("status", hq)
    assert result.code == 0
    # Rows made just now were heard of at their creation: at rest until their heartbeat passes.
    assert "30 peers: 28 at rest · 0 lagging · 1 silent · 1 in error" in result.out, result.out
    assert "the 2 that need attention below" in result.out
    assert "depot08" in result.out and "depot09" in result.out and "depot07" not in result.out
    every = agent("status", hq, "--all")
    assert all(f"depot{n:02d}" in every.out for n in range(30))


def test_the_agents_clock_keys_come_in_iso_8601_too(agent: Agent, world: World) -> None:
    with SiteDatabase.open(world.hq) as site:
        site.update_remote("n1", heard_at=1795239284.75)
        # One moment stamped on several peers (a run's), and moments of their own.
        site.update_remote("n2", heard_at=1795239284.75, control_sent_at=1795239284.0000005,
                           data_sent_at=-0.5)
        site.update_remote("n1", control_sent_at=1795239284.0000015)
    rows = {row["name"]: row for row in _status(agent, world.hq)["remotes"]}
    assert rows["n1"]["heard_at"] == 1795239284.75
    assert rows["n1"]["heard_at_iso"] == rows["n2"]["heard_at_iso"] == "2026-11-21T05:34:44.750000+00:00"
    assert rows["n1"]["data_sent_at"] is None and rows["n1"]["data_sent_at_iso"] is None
    assert rows["n2"]["data_sent_at_iso"] == "1969-12-31T23:59:59.500000+00:00"
    for row in rows.values():
        for key in status_module.CLOCK_KEYS:
            assert row[f"{key}_iso"] == (None if row[key] is None else datetime.fromtimestamp(
                row[key], timezone.utc).isoformat()), (row["name"], key)


# -- the spool's figures: its summary, or its log read in full ---------------------------------


def _spool_folder(database: Path) -> Path:
    from agent.runner import agent_directory

    return agent_directory(database) / "spool"


def _check_figures(database: Path) -> dict:
    from agent.cli._spool import spool_check, spool_summary

    return spool_summary(database, spool_check(database))


def test_status_reads_the_spools_summary_which_says_what_a_full_check_says(agent: Agent, world: World) -> None:
    sync(agent, world, rounds=1)
    world.execute("hq", "INSERT INTO customer VALUES (301, 'n1', 'queued for n1', 'x')")
    shutil.rmtree(world.inbox("n1"))  # the message stays queued at hq
    agent("run", world.hq, "--once")
    status = _status(agent, world.hq)
    spool = status["spool"]
    assert (spool["source"], spool["summary_problem"]) == ("summary", None)
    assert spool["messages"] >= 1 and spool["oldest_message_age_s"] is not None
    check = _check_figures(world.hq)
    for key in ("ok", "messages", "restart_span_bytes", "log_bytes", "segments", "in_doubt", "problems"):
        assert spool[key] == check[key], key
    assert abs(spool["oldest_message_age_s"] - check["oldest_message_age_s"]) < 5
    assert [entry for entry in status["queues"] if entry["outbound"]] == [{"peer": "n1", "inbound": 0,
                                                                          "outbound": spool["messages"]}]
    assert "read from the log" not in agent("status", world.hq).out


def test_a_stale_summary_makes_status_read_the_log_and_say_so(agent: Agent, world: World) -> None:
    """The agent killed after a write to its log, before the summary's: the
    summary names an end the log has left, and status reads the log."""
    sync(agent, world, rounds=1)
    summary = _spool_folder(world.hq) / "summary"
    old = summary.read_bytes()
    world.execute("hq", "INSERT INTO customer VALUES (302, 'n1', 'for n1', 'x')")
    agent("run", world.hq, "--once")
    summary.write_bytes(old)
    status = _status(agent, world.hq)
    assert status["spool"]["source"] == "check" and "stale" in status["spool"]["summary_problem"]
    assert {key: value for key, value in status["spool"].items() if key not in ("source", "summary_problem")} \
        == _check_figures(world.hq)
    result = agent("status", world.hq)
    assert result.code == 0 and "· read from the log:" in result.out and "stale" in result.out
    assert result.err == ""  # a summary behind the log is no error
    agent("run", world.hq, "--once")  # an idle run's open finds it stale and brings it up to date
    assert _status(agent, world.hq)["spool"]["source"] == "summary"


@pytest.mark.parametrize("damage", [b"", b"FSSUMRY1" + b"\xff" * 200])
def test_a_damaged_summary_gives_one_line_and_status_reads_the_log(agent: Agent, world: World, damage) -> None:
    sync(agent, world, rounds=1)
    (_spool_folder(world.hq) / "summary").write_bytes(damage)
    for options in (("--json",), ()):
        result = agent("status", world.hq, *options)
        assert result.code == 0, result.err
        [line] = result.err.strip().splitlines()
        assert "unreadable spool summary" in line and "read the spool's log instead" in line
    status = _status(agent, world.hq)
    assert status["spool"]["source"] == "check" and status["spool"]["ok"]
    assert status["spool"]["summary_problem"].endswith(")")
