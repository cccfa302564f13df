"""Remotes' errors and status, the metrics' rows, extraction of SQLite
remotes and schema changes, on both backends.  (The remote-user table
itself, its fleet filters and counts: tests/site/remote_user_checks.py,
run by tests/site/test_remotes.py and tests/site/postgres/test_remotes.py.)"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone

import pytest

from agent.metrics import read_site
from agent.site import Article, ExtractionError, RemoteKeys
from agent.site.sqlite.database import SiteDatabase
from agent.site.extraction import Extraction
from codec.ops import Operation, Transaction

LATER = datetime(2026, 6, 1, 9, 0, tzinfo=timezone.utc)
REGIONS = {"north1": "north", "south1": "south", "north2": "north"}


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("sales", [Article("customer", columns=["name", "region"], subscribe_by="region"),
                                      Article("line")])
    for remote, region in REGIONS.items():
        site.add_remote(remote, address=f"inbox/{remote}")
        site.subscribe(remote, "sales", region)
    backend.app().run(*[("INSERT INTO customer (id, name, region, balance) VALUES (%s, %s, %s, 1.5)",
                         (row_id, f"c{row_id}", ("north", "south", "east")[row_id % 3]))
                        for row_id in range(1, 31)],
                      "INSERT INTO line VALUES (1, 1, 'sku-1', 2)")
    return site


def _missing_row(peer: str, commit: int) -> list[Transaction]:
    return [Transaction(commit, peer, (Operation.update("customer", (999,), {"name": "x"}, {"name": "y"}),))]


def test_the_remotes_names_are_the_rows_names_in_order_without_reading_the_rows(hq):
    hq.add_remote("a-last-added", address="inbox/a")
    assert hq.remote_names() == tuple(remote.name for remote in hq.remotes()) == (
        "a-last-added", "north1", "north2", "south1")
    hq.remove_remote("north2")
    assert hq.remote_names() == ("a-last-added", "north1", "south1")


def test_apply_errors_count_until_acknowledged_and_stay_as_history(hq):
    hq.apply("north1", _missing_row("north1", 3) + _missing_row("north1", 4), log_received=4)
    hq.apply("south1", _missing_row("south1", 2), log_received=2)
    assert hq.open_apply_errors() == {"north1": 2, "south1": 1}
    first = hq.apply_errors()[0].id
    assert hq.acknowledge_apply_errors("north1", through=first, now=LATER) == 1
    assert hq.open_apply_errors() == {"north1": 1, "south1": 1}
    assert hq.acknowledge_apply_errors("north1", now=LATER) == 1
    assert hq.acknowledge_apply_errors("north1", now=LATER) == 0
    assert hq.open_apply_errors() == {"south1": 1}
    errors = hq.apply_errors()
    assert [(error.peer, error.acknowledged_at) for error in errors] == [
        ("north1", LATER), ("north1", LATER), ("south1", None)]
    assert [error.peer for error in hq.apply_errors(after_id=errors[1].id)] == ["south1"]
    assert hq.counts() == {"remotes": 3, "conflicts": 0, "apply_errors": 3}


def test_the_metrics_rows_and_counts_say_what_happened(backend, hq):
    """What `agent status` and the metrics read: the log end, each remote's
    offsets and whether it is in error, conflicts and apply errors by peer."""
    end = hq.scan()
    hq.record_send("north1", log_sent=end)
    hq.apply("south1", _missing_row("south1", 2), log_received=2)
    backend.app().execute("UPDATE customer SET name = 'hq edit' WHERE id = 1")  # id 1 is south
    hq.apply("south1", [Transaction(5, "south1", (
        Operation.update("customer", (1,), {"name": "c1"}, {"name": "south edit"}),))], log_received=5)
    rows = read_site(hq.path)
    assert (rows.site, rows.conflicts, rows.apply_errors) == ("hq", {"south1": 1}, {"south1": 1})
    assert rows.log_end == hq.log_end() >= end
    by_name = {row[0]: row for row in rows.remotes}
    assert set(by_name) == set(REGIONS)
    assert by_name["north1"][1:4] == (end, 0, 0)
    assert by_name["south1"][3] == 5 and by_name["south1"][9] and not by_name["north1"][9]
    assert hq.counts() == {"remotes": 3, "conflicts": 1, "apply_errors": 1}


def _held(path) -> list[tuple]:  # type: ignore[no-untyped-def]
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT id, name, region FROM customer ORDER BY id").fetchall()


def _subset(backend, region: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    return backend.rows("customer", "id, name, region", f"WHERE region = '{region}'")


def test_an_extracted_remote_holds_its_subset_and_follows_the_log_after_its_point(backend, hq, tmp_path):
    result = hq.extract("north1", tmp_path / "north1.db", keys=RemoteKeys(public_key="north1-key"))
    assert _held(result.path) == _subset(backend, "north")
    assert result.rows == {"customer": 10, "line": 1}
    row = hq.remote("north1")
    assert row.log_sent == row.confirm_sent == result.offset and row.public_key == "north1-key"
    assert row.peer_incarnation == result.incarnation
    app = backend.app()
    app.execute("UPDATE customer SET region = 'south' WHERE id = 3")        # leaves north
    app.execute("UPDATE customer SET region = 'north' WHERE id = 1")        # enters north
    app.execute("INSERT INTO customer (id, name, region) VALUES (100, 'new', 'north')")
    end = hq.scan()
    with SiteDatabase.open(result.path) as remote:
        assert remote.identity.name == "north1" and remote.identity.public_key == "north1-key"
        assert remote.remote("hq").log_received == result.offset
        remote.apply("hq", list(hq.read_log("north1", result.offset, end)), log_received=end)
        assert remote.apply_errors() == () and remote.conflicts() == ()
    assert _held(result.path) == _subset(backend, "north")
    with pytest.raises(ExtractionError, match="exists already"):
        hq.extract("north1", result.path)


def test_many_remotes_are_extracted_at_one_point_each_with_its_subset(backend, hq, tmp_path):
    results = list(hq.extract_many([Extraction(name, tmp_path / f"{name}.db") for name in REGIONS]))
    assert [result.remote for result in results] == list(REGIONS)
    for result, region in zip(results, REGIONS.values()):
        assert _held(result.path) == _subset(backend, region), result.remote
        assert hq.remote(result.remote).log_sent == result.offset
    if backend.name == "postgresql":  # one point for all (a SQLite consolidated extracts them in turn)
        assert len({result.offset for result in results}) == 1


def test_a_schema_change_is_logged_for_the_remotes_holding_the_table(backend, hq, tmp_path):
    backend.app().execute("CREATE TABLE note (id integer PRIMARY KEY, body text)")
    hq.add_article("sales", "note")
    hq.extract("north1", tmp_path / "north1.db")
    result = hq.apply_schema(["ALTER TABLE note ADD COLUMN author TEXT"])
    assert result.published == ("note",) and result.subscribers == ("north1",)
    end = hq.scan()
    assert end > hq.remote("north1").log_sent  # the change is in north1's stream


def test_a_second_agent_on_the_site_is_one_line_and_exit_1(backend, hq, tmp_path, monkeypatch, capsys):
    """What a running agent holds (the site's agent lock and its spool)
    keeps a second `agent run` off the site, whichever refuses first: on
    PostgreSQL the database's advisory lock, on SQLite the spool's lock."""
    from agent.cli import main
    from agent.keyfiles import save_site_keys
    from agent.queues import open_queues
    from codec.keys import SiteKeys

    monkeypatch.chdir(tmp_path)
    for site in ("hq", *REGIONS):
        (tmp_path / "inbox" / site).mkdir(parents=True)
    save_site_keys(hq.path, SiteKeys.generate("hq"), home=None if backend.name == "sqlite" else hq.home)
    path = str(hq.path)
    capsys.readouterr()
    with hq.agent_lock():
        queues = open_queues(path)
        try:
            code = main(["run", path, "--once"])
        finally:
            queues.close()
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert ("another fieldsync agent is running on database" if backend.name == "postgresql"
            else "the spool is open in another object of this process") in err
    assert main(["run", path, "--once"]) == 0, capsys.readouterr().err  # once the first has stopped


def test_many_remotes_get_the_rows_one_extraction_would_give_each(backend, hq, tmp_path):
    """Numbers as SUBSCRIBE BY values: 9.0 selects the integer 9, as the
    log's readers select; a remote of two values gets both subsets, one of
    none gets no table."""
    app = backend.app()
    app.execute("CREATE TABLE parcel (id integer PRIMARY KEY, zone integer, note text)")
    app.run(*[("INSERT INTO parcel VALUES (%s, %s, %s)", (row_id, row_id % 4 + 6, f"p{row_id}"))
              for row_id in range(1, 41)])
    hq.create_publication("land", [Article("parcel", subscribe_by="zone")])
    wanted = {"z7": [7], "z9": [9.0], "z79": [7, 9], "none": []}
    for name, values in wanted.items():
        hq.add_remote(name)
        for value in values:
            hq.subscribe(name, "land", value)
    results = {result.remote: result for result in hq.extract_many(
        [Extraction(name, tmp_path / f"{name}.db") for name in wanted])}
    for name, values in wanted.items():
        with sqlite3.connect(results[name].path) as conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE name = 'parcel'")]
            held = conn.execute("SELECT id, zone, note FROM parcel ORDER BY id").fetchall() if tables else []
        expected = [row for row in backend.rows("parcel", "id, zone, note") if row[1] in values]
        assert held == expected and bool(tables) == bool(values), name
        assert results[name].rows == ({"parcel": len(expected)} if values else {})
