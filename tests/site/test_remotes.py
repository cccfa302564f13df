"""The remote-user table (agent.site.sqlite.remotes): the checks every backend
passes (tests/site/remote_user_checks.py) on a SQLite site, and what is
SQLite's own (a remote site, apply errors)."""

from __future__ import annotations

import pytest

from agent.site import InvalidSetting, WrongRole
from agent.site.remote_rules import NewRemote
from agent.site.errors import RemoteRejected

from .conftest import CUSTOMER, app_connection, make_site
from .remote_user_checks import NOW, RemoteUserChecks


class SqliteWorld:
    """What the shared checks need of a SQLite site (remote_user_checks.py)."""

    def __init__(self, site) -> None:  # type: ignore[no-untyped-def]
        self.site = site

    def grow_log(self, rows: int = 3) -> int:
        app = app_connection(self.site)
        for _ in range(rows):
            app.execute("INSERT INTO customer (name) VALUES ('x')")
        return self.site.scan()

    def add_apply_error(self, peer: str) -> None:
        self.site.connection.execute("INSERT INTO fieldsync_apply_error (at, peer, peer_commit, problem)"
                                     " VALUES (?, ?, 1, 'a row that was not there')", (NOW.isoformat(), peer))

    def refuse_remote(self, name: str) -> None:
        self.site.connection.execute(
            f"CREATE TRIGGER refuse AFTER INSERT ON fieldsync_remote WHEN new.name = '{name}'"
            " BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END")

    def in_transaction(self) -> bool:
        return self.site.connection.in_transaction


@pytest.fixture
def site(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    site.create_publication("p", ["customer"])
    yield site
    site.close()


class TestRemoteUsers(RemoteUserChecks):
    @pytest.fixture
    def world(self, site):
        return SqliteWorld(site)


def test_a_peer_s_open_apply_errors_are_found_through_the_partial_index(site):
    """(Counting and acknowledging them, on both backends: tests/site/both/test_remotes_extract.py.)"""
    site.add_remote("r1")
    SqliteWorld(site).add_apply_error("r1")
    assert site.open_apply_errors() == {"r1": 1}
    plan = " ".join(str(row) for row in site.connection.execute(
        "EXPLAIN QUERY PLAN SELECT 1 FROM fieldsync_apply_error WHERE peer = 'r1' AND acknowledged_at IS NULL"))
    assert "fieldsync_apply_error_open" in plan


def test_a_remote_site_has_one_peer(tmp_path):
    remote = make_site(tmp_path, "r1", "remote")
    remote.add_remote("hq")
    with pytest.raises(WrongRole, match="one consolidated"):
        remote.add_remote("hq2")
    remote.close()


@pytest.mark.parametrize("bad", [
    {"name": "no spaces"}, {"name": "north", "send_every": 0}, {"name": "north", "send_every": 60, "send_at": "1:00"},
    {"name": "north", "address": 7}, {"name": "north", "subscriptions": (("p", float("nan")),)},
    {"name": "north", "subscriptions": (("p", [1]),)},
])
def test_a_new_remote_is_checked_when_made(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidSetting):
        NewRemote(**bad)


def test_a_remote_site_takes_one_remote_only(tmp_path) -> None:
    remote = make_site(tmp_path, "n1", "remote")
    with pytest.raises(RemoteRejected) as raised:
        remote.add_remotes([NewRemote("hq"), NewRemote("hq2")])
    assert raised.value.index == 1 and isinstance(raised.value.reason, WrongRole)
    remote.add_remotes([NewRemote("hq")])
    assert [row.name for row in remote.remotes()] == ["hq"]
    remote.close()
