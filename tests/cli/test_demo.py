"""agent demo: four sites converge through folder inboxes, and the demo proves it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agent.cli.demo import FIELD_SITES, MARKER, _agent_command, at_rest, compare_sites, remote_rows
from agent.site import SiteDatabase
from tests.sqlfiles import connected

from .conftest import Agent


def test_demo_end_to_end(tmp_path: Path, agent: Agent) -> None:
    folder = tmp_path / "demo"
    result = agent("demo", folder)
    assert result.code == 0, result.out + result.err
    assert "OK: 3 field sites converged with hq" in result.out
    assert "round 1:" in result.out
    for name in FIELD_SITES:
        assert f"{name}: holds exactly its subscribed rows of hq" in result.out
    # Two sites edited the same rows before syncing: hq recorded the conflicts.
    assert "conflicts resolved at hq" in result.out
    # The result is real: the files are there, at rest, and equal.
    assert (folder / MARKER).is_file()
    assert at_rest(remote_rows(folder)) == []
    assert compare_sites(folder) == {name: [] for name in FIELD_SITES}
    with connected(folder / "south.db") as south:
        moved = south.execute("SELECT region FROM customer WHERE id = 104").fetchone()
    assert moved == ("south",)
    with connected(folder / "north.db") as north:
        assert north.execute("SELECT count(*) FROM customer WHERE id = 104").fetchone() == (0,)
        assert north.execute("SELECT count(*) FROM customer WHERE id = 186").fetchone() == (1,)


def test_the_look_around_hint_names_an_agent_the_user_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               agent: Agent) -> None:
    script = Path(sys.executable).parent / "agent"
    assert script.exists()  # the installation's console script
    # Not on the PATH (after scripts/demo): the script's path, from where the user is.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(script.parent.parent)
    assert _agent_command() == f"{script.parent.name}/agent"
    monkeypatch.chdir(tmp_path)
    assert _agent_command() == str(script.absolute())
    result = agent("demo", tmp_path / "demo")
    assert f"Look around: {script.absolute()} status {tmp_path / 'demo' / 'hq.db'}" in result.out
    # On the PATH (an activated environment): plain agent.
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}/usr/bin:/bin")
    assert _agent_command() == "agent"


def test_a_demo_made_in_a_relative_folder_runs_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              agent: Agent) -> None:
    monkeypatch.chdir(tmp_path)
    assert agent("demo", "rel").code == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name in ("hq", *FIELD_SITES):
        result = agent("run", tmp_path / "rel" / f"{name}.db", "--once")
        assert result.code == 0, result.err
    with SiteDatabase.open(tmp_path / "rel" / "north.db") as north:
        assert north.identity.address == str(tmp_path / "rel" / "inbox" / "north")


def test_demo_runs_again_in_its_folder_and_splits_messages(tmp_path: Path, agent: Agent) -> None:
    folder = tmp_path / "demo"
    assert agent("demo", folder).code == 0
    (folder / "leftover.txt").write_text("from the last run")
    result = agent("demo", folder, "-l", "10000", "--seed", "11")
    assert result.code == 0, result.out + result.err
    assert "OK:" in result.out
    assert not (folder / "leftover.txt").exists()


def test_demo_refuses_a_folder_it_did_not_make(tmp_path: Path, agent: Agent) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "thesis.tex").write_text("precious")
    result = agent("demo", folder)
    assert result.code == 1
    assert len(result.err_lines) == 1 and "is not a demo folder" in result.err
    assert (folder / "thesis.tex").read_text() == "precious"
    plain_file = tmp_path / "file"
    plain_file.write_text("x")
    assert agent("demo", plain_file).code in (1, 2)
    assert plain_file.read_text() == "x"


def test_a_demo_that_does_not_converge_fails_with_one_line(tmp_path: Path, agent: Agent) -> None:
    result = agent("demo", tmp_path / "demo", "--rounds", "1")
    assert result.code == 1 and "FAILED: the sites did not converge after 1 rounds" in result.out
    assert result.err_lines == ["agent: the demo's sites did not converge after 1 rounds: see what differs above"]


def test_the_check_finds_a_difference(tmp_path: Path, agent: Agent) -> None:
    folder = tmp_path / "demo"
    assert agent("demo", folder).code == 0
    with connected(folder / "west.db") as west:
        west.execute("DELETE FROM visit WHERE id = (SELECT min(id) FROM visit)")
    differences = compare_sites(folder)
    assert differences["north"] == differences["south"] == []
    [line] = differences["west"]
    assert line.startswith("visit: ") and "missing" in line
    # A change at hq, once scanned into its log, is unconfirmed until the next rounds.
    with connected(folder / "hq.db") as hq:
        hq.execute("UPDATE product SET stock = stock + 1 WHERE sku = 'P-001'")
    with SiteDatabase.open(folder / "hq.db") as site:
        site.scan()
    assert {line.split()[0] for line in at_rest(remote_rows(folder))} == {"hq->north", "hq->south", "hq->west"}
