"""agent init and agent key."""

from __future__ import annotations

from pathlib import Path

from agent.admin import site_keys
from agent.site import SiteDatabase
from codec.keys import PUBLIC_MAGIC, PublicKeys

from .conftest import Agent


def test_init_makes_a_site_and_prints_its_public_key(tmp_path: Path, agent: Agent) -> None:
    database = tmp_path / "hq.db"
    (tmp_path / "inbox").mkdir()
    result = agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "inbox")
    assert result.code == 0, result.err
    with SiteDatabase.open(database) as site:
        assert site.identity.name == "hq"
        assert site.identity.role.value == "consolidated"
        assert site.identity.address == str(tmp_path / "inbox")
        assert site.identity.transport == "folder"
        public = site_keys(site).public
    lines = result.out.splitlines()
    assert public.to_line() in lines
    assert f"Fingerprint: {public.fingerprint}" in lines
    assert "does not exist yet" not in result.out


def test_init_notes_a_missing_inbox_folder(tmp_path: Path, agent: Agent) -> None:
    result = agent("init", tmp_path / "r.db", "--name", "r1", "--role", "remote", "--address", tmp_path / "nowhere")
    assert result.code == 0
    assert "does not exist yet" in result.out


def test_key_prints_the_line_a_peer_needs(tmp_path: Path, agent: Agent) -> None:
    database = tmp_path / "hq.db"
    agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path)
    result = agent("key", database)
    assert result.code == 0
    line = result.out.strip()
    assert line.startswith(PUBLIC_MAGIC)
    assert PublicKeys.from_line(line).site == "hq"
    fingerprint = agent("key", database, "--fingerprint").out.strip()
    assert fingerprint == PublicKeys.from_line(line).fingerprint


def test_init_twice_is_refused_on_one_line(tmp_path: Path, agent: Agent) -> None:
    database = tmp_path / "hq.db"
    agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path)
    result = agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path)
    assert result.code == 1
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith("agent: ") and "already" in result.err_lines[0]


def test_init_bad_role_is_a_usage_error(tmp_path: Path, agent: Agent) -> None:
    result = agent("init", tmp_path / "x.db", "--name", "x", "--role", "boss", "--address", tmp_path)
    assert result.code == 2
    assert len(result.err_lines) == 1 and "--role" in result.err
    assert not (tmp_path / "x.db").exists()


def test_init_bad_name_and_missing_directory(tmp_path: Path, agent: Agent) -> None:
    result = agent("init", tmp_path / "x.db", "--name", "no spaces", "--role", "remote", "--address", tmp_path)
    assert result.code == 2 and len(result.err_lines) == 1 and "invalid site name 'no spaces'" in result.err
    assert not (tmp_path / "x.db").exists()
    result = agent("init", tmp_path / "no" / "x.db", "--name", "x", "--role", "remote", "--address", tmp_path)
    assert result.code == 1
    assert result.err_lines == [f"agent: directory {tmp_path / 'no'} does not exist; create it first"]


def test_init_refuses_a_file_that_is_not_sqlite(tmp_path: Path, agent: Agent) -> None:
    garbage = tmp_path / "notes.txt"
    garbage.write_text("shopping list\n" * 100)
    result = agent("init", garbage, "--name", "x", "--role", "remote", "--address", tmp_path)
    assert result.code == 1
    assert len(result.err_lines) == 1 and str(garbage) in result.err
    assert garbage.read_text() == "shopping list\n" * 100


def test_key_of_a_missing_database(tmp_path: Path, agent: Agent) -> None:
    result = agent("key", tmp_path / "missing.db")
    assert result.code == 1
    assert result.err_lines == [f"agent: {tmp_path / 'missing.db'}: no such site database; check the path, "
                                "or create the site with `agent init`"]
