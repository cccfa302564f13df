"""A table in two publications (docs/site-database.md, "A table in several
publications"), from the CLI alone on real files: territory publishes a
customer's region and name by region, desk its note by rep; n1 subscribes
to both, n2 to territory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sqlfiles import connected

from .conftest import Agent

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
CUSTOMERS = [(1, "n1", "c1", "note 1", "ann"), (2, "n2", "c2", "note 2", "ann"), (3, "n1", "c3", "note 3", "ann"),
             (4, "n2", "c4", "note 4", "bob"), (5, "n1", "c5", "note 5", "bob")]


def rows(path: Path, query: str = "SELECT * FROM customer ORDER BY id") -> list[tuple]:
    with connected(path) as conn:
        return conn.execute(query).fetchall()


def write(path: Path, statement: str) -> None:
    with connected(path) as conn:
        conn.execute(statement)


@pytest.fixture
def sites(tmp_path: Path, agent: Agent) -> dict[str, Path]:
    paths = {site: tmp_path / f"{site}.db" for site in ("hq", "n1", "n2")}
    for site in paths:
        (tmp_path / "inbox" / site).mkdir(parents=True)
    hq = paths["hq"]
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox" / "hq").code == 0
    with connected(hq) as conn:
        conn.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, note TEXT,"
                     " rep TEXT)")
        conn.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?)", CUSTOMERS)
    assert agent("publication", "create", hq, "territory", "customer:region,name@region").code == 0
    added = agent("publication", "create", hq, "desk", "customer:note@rep")
    assert added.code == 0, added.err
    for remote, subscriptions in {"n1": ["territory=n1", "desk=ann"], "n2": ["territory=n2"]}.items():
        options = [item for subscription in subscriptions for item in ("--subscribe", subscription)]
        assert agent("remote", "add", hq, remote, "--address", tmp_path / "inbox" / remote, *options).code == 0
        assert agent("extract", hq, remote, paths[remote]).code == 0
    return paths


def sync(agent: Agent, sites: dict[str, Path]) -> None:
    for _ in range(3):
        for path in sites.values():
            result = agent("run", path, "--once")
            assert result.code == 0, result.err


def test_two_publications_of_one_table_reach_their_subscribers_once_each_and_one_can_be_left(
        sites: dict[str, Path], agent: Agent) -> None:
    hq, n1, n2 = sites["hq"], sites["n1"], sites["n2"]
    listing = agent("publication", "list", hq)
    assert listing.code == 0 and listing.out.count("customer") == 2
    # n1: its region's rows with region and name, ann's with the note, in one row each.
    assert rows(n1) == [(1, "n1", "c1", "note 1"), (2, None, None, "note 2"), (3, "n1", "c3", "note 3"),
                        (5, "n1", "c5", None)]
    assert rows(n2) == [(2, "n2", "c2"), (4, "n2", "c4")]
    write(hq, "UPDATE customer SET region = 'n2' WHERE id = 1")  # leaves territory for n1; desk keeps it
    write(hq, "UPDATE customer SET rep = 'ann' WHERE id = 5")  # enters desk for n1, which holds it
    write(n2, "UPDATE customer SET name = 'c4 by n2' WHERE id = 4")
    write(n1, "UPDATE customer SET note = 'note 3 by n1' WHERE id = 3")
    sync(agent, sites)
    assert rows(n1) == [(1, None, None, "note 1"), (2, None, None, "note 2"), (3, "n1", "c3", "note 3 by n1"),
                        (5, "n1", "c5", "note 5")]
    assert rows(n2) == [(1, "n2", "c1"), (2, "n2", "c2"), (4, "n2", "c4 by n2")]
    assert rows(hq, "SELECT id, name, note FROM customer WHERE id IN (3, 4) ORDER BY id") == [
        (3, "c3", "note 3 by n1"), (4, "c4 by n2", "note 4")]
    # Leaving desk: the rows only desk kept go, the others lose its note.
    left = agent("remote", "unsubscribe", hq, "n1", "desk=ann")
    assert left.code == 0, left.err
    sync(agent, sites)
    assert rows(n1) == [(3, "n1", "c3", None), (5, "n1", "c5", None)]
    for path in sites.values():
        assert rows(path, "SELECT count(*) FROM fieldsync_apply_error") == [(0,)]


def test_remove_with_a_publication_stops_publishing_the_table_there_alone(
        sites: dict[str, Path], agent: Agent) -> None:
    hq = sites["hq"]
    refused = agent("publication", "remove", hq, "customer", "--publication", "nosuch")
    assert refused.code == 1 and refused.err_lines == [
        f"agent: not published in 'nosuch' of {hq}: 'customer'; nothing was changed (`agent publication list` shows "
        "what is)"]
    removed = agent("publication", "remove", hq, "customer", "--publication", "desk")
    assert removed.code == 0 and removed.out.splitlines() == [
        "Stopped publishing: customer in desk",
        "It reaches 1 extracted remote(s), in order with the data, which stop capturing it there and keep their "
        "rows: n1"]
    document = json.loads(agent("publication", "list", hq, "--json").out)
    assert {item["name"]: [article["table"] for article in item["articles"]]
            for item in document["publications"]} == {"desk": [], "territory": ["customer"]}
    write(hq, "UPDATE customer SET name = 'c3 again' WHERE id = 3")  # still captured for territory
    sync(agent, sites)
    assert rows(sites["n1"], "SELECT name FROM customer WHERE id = 3") == [("c3 again",)]
    # n1's article of desk went too; its copy, published whole, stays captured through territory's.
    listed = json.loads(agent("publication", "list", sites["n1"], "--json").out)
    assert {item["name"]: [article["table"] for article in item["articles"]]
            for item in listed["publications"]} == {"desk": [], "territory": ["customer"]}
    write(sites["n1"], "UPDATE customer SET name = 'c3 by n1' WHERE id = 3")
    sync(agent, sites)
    assert rows(hq, "SELECT name FROM customer WHERE id = 3") == [("c3 by n1",)]
    for path in sites.values():
        assert rows(path, "SELECT count(*) FROM fieldsync_apply_error") == [(0,)]


def test_a_dropped_publication_reaches_a_remote_it_leaves_with_no_subscription(
        sites: dict[str, Path], agent: Agent) -> None:
    """docs/cli.md ("agent publication") shows this command and what it prints."""
    hq, n1, n2 = sites["hq"], sites["n1"], sites["n2"]
    dropped = agent("publication", "drop", hq, "territory")
    shown = DOC.read_text().split("$ agent publication drop hq.db territory\n", 1)[1].split("```", 1)[0]
    assert dropped.code == 0 and dropped.out.splitlines() == shown.splitlines() == [
        "Dropped publication territory",
        "It reaches 2 extracted remote(s), in order with the data, which stop capturing it there and keep their "
        "rows: n1, n2"]
    sync(agent, sites)
    for path, left in ((n1, {"desk": ["customer"]}), (n2, {})):
        listed = json.loads(agent("publication", "list", path, "--json").out)
        assert {item["name"]: [article["table"] for article in item["articles"]]
                for item in listed["publications"] if item["articles"]} == left, path
    # n2 keeps its rows and no longer sends its changes to them; n1 still sends desk's.
    write(n2, "UPDATE customer SET name = 'c4 by n2' WHERE id = 4")
    write(n1, "UPDATE customer SET note = 'note 5 by n1' WHERE id = 1")
    sync(agent, sites)
    assert rows(n2) == [(2, "n2", "c2"), (4, "n2", "c4 by n2")]
    assert rows(hq, "SELECT id, name, note FROM customer WHERE id IN (1, 4) ORDER BY id") == [
        (1, "c1", "note 5 by n1"), (4, "c4", "note 4")]
    for path in sites.values():
        assert rows(path, "SELECT count(*) FROM fieldsync_apply_error") == [(0,)]
