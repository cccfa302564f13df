"""agent extract (dbxtract)."""

from __future__ import annotations

from pathlib import Path

import pytest

import agent.cli.extract as extract_module
from agent.site import SiteDatabase
from tests.sqlfiles import connected

from .conftest import Agent, World


def test_extract_copies_the_subscribed_rows_and_columns(world: World) -> None:
    assert world.rows("n1", "SELECT * FROM customer ORDER BY id") == world.rows(
        "hq", "SELECT id, region, name FROM customer WHERE region = 'n1' ORDER BY id")
    with connected(world.n1) as conn:  # the unpublished column stays at hq
        assert [row[1] for row in conn.execute("PRAGMA table_info(customer)")] == ["id", "region", "name"]
    with SiteDatabase.open(world.n1) as site, SiteDatabase.open(world.hq) as hq:
        assert site.identity.role.value == "remote"
        assert [row.name for row in site.remotes()] == ["hq"]
        assert hq.remote("n1").public_key == site.identity.public_key


def test_extract_reports_rows_per_table(tmp_path: Path, agent: Agent, world: World) -> None:
    agent("remote", "add", world.hq, "n3", "--address", tmp_path, "--subscribe", "territory=n1")
    result = agent("extract", world.hq, "n3", tmp_path / "n3.db")
    assert result.code == 0, result.err
    assert "customer" in result.out and " 10 " in result.out
    # The secret key is in a file of the agent's beside the database, which
    # holds none (tests/security/test_keys.py checks modes and bytes).
    assert f"{tmp_path / 'n3.db.agent' / 'keys' / 'site.key'} holds n3's secret key" in result.out
    assert (tmp_path / "n3.db.agent" / "keys" / "site.key").stat().st_mode & 0o777 == 0o600
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".n3.db")) == []


def test_extract_with_a_progress_bar(tmp_path: Path, agent: Agent, world: World,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extract_module, "show_progress", lambda out: True)
    agent("remote", "add", world.hq, "n3", "--address", tmp_path, "--subscribe", "territory=n2")
    result = agent("extract", world.hq, "n3", tmp_path / "n3.db")
    assert result.code == 0, result.err
    with connected(tmp_path / "n3.db") as n3:
        assert len(n3.execute("SELECT * FROM customer").fetchall()) == 10


def test_extract_errors_are_one_line(tmp_path: Path, agent: Agent, world: World) -> None:
    result = agent("extract", world.hq, "ghost", tmp_path / "ghost.db")
    assert result.code == 1 and len(result.err_lines) == 1 and "no remote named 'ghost'" in result.err
    assert not (tmp_path / "ghost.db").exists()
    result = agent("extract", world.hq, "n1", world.n2)
    assert result.code == 1 and result.err_lines == [f"agent: {world.n2} exists already; remove it or choose "
                                                     "another path"]
    result = agent("extract", world.n1, "hq", tmp_path / "back.db")
    assert result.code == 1 and len(result.err_lines) == 1
    result = agent("extract", tmp_path / "missing.db", "n1", tmp_path / "x.db")
    assert result.code == 1 and "no such site database" in result.err
    (tmp_path / "nowhere.db").symlink_to(tmp_path / "gone" / "n1.db")  # dangling
    result = agent("extract", world.hq, "n1", tmp_path / "nowhere.db")
    assert result.code == 1 and result.err_lines == [f"agent: {tmp_path / 'nowhere.db'} exists already; remove it "
                                                     "or choose another path"]
    (tmp_path / "notes.txt").write_text("a file")
    result = agent("extract", world.hq, "n1", tmp_path / "notes.txt" / "n1.db")
    assert result.code == 1 and result.err_lines == [
        f"agent: {tmp_path / 'notes.txt'} is not a directory, so {tmp_path / 'notes.txt' / 'n1.db'} cannot be made there"]
    assert agent("run", world.n1, "--once").code == 0  # n1's keys and stream are as they were


def test_extract_into_a_folder_that_takes_no_file_names_the_target(tmp_path: Path, agent: Agent,
                                                                    world: World) -> None:
    # /proc takes no new file, whoever asks (root too, as in CI).
    result = agent("extract", world.hq, "n1", "/proc/n1.db")
    assert result.code == 1
    # The remote's key file is written first, beside the database to be.
    assert result.err_lines == ["agent: cannot write the key file of /proc/n1.db: the folder /proc takes no new "
                                "file (No such file or directory)"]
