"""agent inbox (dbremote -a): waiting, queued and quarantined messages, nothing applied."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from codec.header import Header
from codec.names import Kind, MessageName

from .conftest import Agent, World


def _inbox(agent: Agent, database: Path, *arguments: object) -> dict:
    result = agent("inbox", database, "--json", *arguments)
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_lists_waiting_files_without_taking_them(agent: Agent, world: World) -> None:
    world.execute("n1", "INSERT INTO customer VALUES (500, 'n1', 'from n1')")
    assert agent("run", world.n1, "--once").code == 0
    before = sorted(path.name for path in world.inbox("hq").iterdir())
    listing = _inbox(agent, world.hq)
    assert sorted(item["file"] for item in listing["waiting"]) == before
    kinds = {item["kind"] for item in listing["waiting"]}
    assert kinds == {"data", "control"}
    for item in listing["waiting"]:
        assert item["sender"] == "n1"
        assert item["check"] == "ok, signed by n1, sealed"
        assert item["size"] == (world.inbox("hq") / item["file"]).stat().st_size
        assert item["header"].startswith("(")
    human = agent("inbox", world.hq)
    assert human.code == 0 and "waiting at" in human.out and "ok, signed by n1" in human.out
    # Nothing was taken, applied or acknowledged.
    assert sorted(path.name for path in world.inbox("hq").iterdir()) == before
    assert world.rows("hq", "SELECT id FROM customer WHERE id = 500") == []


def test_lists_a_quarantined_file_with_its_reason(agent: Agent, world: World) -> None:
    name = str(MessageName("n1", "hq", Kind.DATA, Header(1, 0, 9, 0)))
    (world.inbox("hq") / name).write_bytes(b"\x00garbage that claims to come from n1" * 20)
    waiting = _inbox(agent, world.hq)["waiting"]
    assert [(item["file"], item["sender"]) for item in waiting] == [(name, "n1")]
    assert "bad magic" in waiting[0]["check"]
    result = agent("run", world.hq, "--once")
    assert result.code == 0
    assert "1 file(s) quarantined" in result.out
    listing = _inbox(agent, world.hq)
    assert listing["waiting"] == []
    [entry] = listing["quarantine"]
    assert entry["name"] == name and entry["peer"] == "n1"
    assert "bad magic" in entry["reason"]
    assert entry["file"].endswith(name) and entry["at"]
    human = agent("inbox", world.hq)
    assert "quarantine: 1 file(s)" in human.out and "bad magic" in human.out
    status = json.loads(agent("status", world.hq, "--json").out)
    assert status["quarantine"] == 1


def test_shows_messages_taken_in_but_waiting_for_a_lost_one(agent: Agent, world: World) -> None:
    world.execute("n1", "INSERT INTO customer VALUES (501, 'n1', 'first')")
    agent("run", world.n1, "--once")
    first = [path for path in world.inbox("hq").iterdir() if ".d." in path.name]
    world.execute("n1", "INSERT INTO customer VALUES (502, 'n1', 'second')")
    agent("run", world.n1, "--once")
    for path in first:  # lost on the way
        path.unlink()
    assert agent("run", world.hq, "--once").code == 0
    listing = _inbox(agent, world.hq, "--queued-only")
    assert listing["waiting"] is None
    [queued] = listing["queued"]["n1"]
    assert queued["sender"] == "n1" and queued["kind"] == "data"
    assert "taken in, waiting to be applied" in agent("inbox", world.hq, "--queued-only").out
    # The resend request brings the lost message back and both apply.
    for _ in range(3):
        agent("run", world.n1, "--once")
        agent("run", world.hq, "--once")
    assert world.rows("hq", "SELECT id FROM customer WHERE id > 500 ORDER BY id") == [(501,), (502,)]
    assert _inbox(agent, world.hq, "--queued-only")["queued"] == {}


def test_unreachable_address_is_reported_with_exit_1(agent: Agent, world: World) -> None:
    shutil.rmtree(world.inbox("hq"))
    result = agent("inbox", world.hq)
    assert result.code == 1
    assert result.err_lines[-1].startswith("agent: cannot list ")
    assert "Quarantine is empty." in result.out
    assert agent("inbox", world.hq, "--queued-only").code == 0


def test_inbox_of_a_missing_database(tmp_path: Path, agent: Agent) -> None:
    result = agent("inbox", tmp_path / "nope.db")
    assert result.code == 1 and len(result.err_lines) == 1 and "no such site database" in result.err


def test_check_says_why_a_file_will_be_refused(agent: Agent, world: World) -> None:
    stranger = str(MessageName("stranger", "hq", Kind.DATA, Header(1, 0, 9, 0)))
    misrouted = str(MessageName("n1", "n2", Kind.DATA, Header(1, 0, 9, 0)))
    for name in (stranger, misrouted, "holiday-photo.jpg"):
        (world.inbox("hq") / name).write_bytes(b"x" * 300)
    checks = {item["file"]: item["check"] for item in _inbox(agent, world.hq)["waiting"]}
    assert checks[stranger] == "from stranger, which is not a peer of hq"
    assert checks[misrouted] == "addressed to n2, not hq: left where it is"
    assert checks["holiday-photo.jpg"].endswith("not a fieldsync message file name: 'holiday-photo.jpg': left where it is")


def test_transport_options_for_other_transports_are_left_out(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    assert agent("run", world.hq, "--once").code == 0
    # The folder inbox would refuse smtp_host: it is the email transport's.
    result = agent("inbox", world.n1, "-O", "email.smtp_host=mail.example.com", "--json")
    assert result.code == 0, result.err
    assert any(".d." in item["file"] for item in json.loads(result.out)["waiting"])
    result = agent("inbox", world.n1, "-O", "nosuch.x=1")
    assert result.code == 2 and len(result.err_lines) == 1 and "no transport or wrapper named 'nosuch'" in result.err
