"""agent extract (dbxtract)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

import agent.cli.extract as extract_module
from agent.site import SiteDatabase
from tests.sqlfiles import connected

from .conftest import AGENT_COMMAND, Agent, World


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


def test_a_copy_a_killed_extraction_left_is_removed_by_the_next(tmp_path: Path, agent: Agent,
                                                                world: World) -> None:
    """Killed once its copy is made under the temporary name, before the
    consolidated switched over: the hidden copy stays behind, and so do the
    key file and its claim, which no process holds any more.  The next
    extraction of the same target removes all three, says so, and makes
    the copy with a key file of its own."""
    agent("remote", "add", world.hq, "n3", "--address", tmp_path, "--subscribe", "territory=n1")
    killed = subprocess.run([*AGENT_COMMAND, "extract", str(world.hq), "n3", str(tmp_path / "n3.db")],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "FIELDSYNC_CRASH": "extract.copy-made"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [left] = [path.name for path in tmp_path.iterdir() if path.name.startswith(".n3.db.")]
    assert left.endswith(".tmp") and not (tmp_path / "n3.db").exists()
    keys = tmp_path / "n3.db.agent" / "keys"
    assert sorted(path.name for path in keys.iterdir()) == ["site.key", "site.key.making"]
    abandoned_key = (keys / "site.key").read_bytes()
    result = agent("extract", world.hq, "n3", tmp_path / "n3.db")
    assert result.code == 0, result.err
    assert f"Removed {tmp_path / left}, left by an extraction that did not finish." in result.out
    assert f"Removed {keys / 'site.key'}, left by an extraction that did not finish." in result.out
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".n3.db")] == []
    assert sorted(path.name for path in keys.iterdir()) == ["site.key"]
    assert (keys / "site.key").read_bytes() != abandoned_key
    with connected(tmp_path / "n3.db") as n3:
        assert len(n3.execute("SELECT * FROM customer").fetchall()) == 10
    with SiteDatabase.open(tmp_path / "n3.db") as n3_site, SiteDatabase.open(world.hq) as hq:
        assert hq.remote("n3").public_key == n3_site.identity.public_key
    assert agent("run", tmp_path / "n3.db", "--once").code == 0


def test_a_key_file_no_killed_extraction_left_stays_in_the_way(tmp_path: Path, agent: Agent,
                                                               world: World) -> None:
    """A key file with no claim beside it (a site's, whose database was
    moved away alone) is never removed: one line names the folder."""
    agent("remote", "add", world.hq, "n3", "--address", tmp_path, "--subscribe", "territory=n1")
    assert agent("extract", world.hq, "n3", tmp_path / "n3.db").code == 0
    key = (tmp_path / "n3.db.agent" / "keys" / "site.key").read_bytes()
    (tmp_path / "n3.db").rename(tmp_path / "moved.db")
    result = agent("extract", world.hq, "n3", tmp_path / "n3.db")
    assert result.code == 1 and "move the folder" in result.err and len(result.err_lines) == 1
    assert (tmp_path / "n3.db.agent" / "keys" / "site.key").read_bytes() == key


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


# -- many remotes into a folder -------------------------------------------------------------


def _add_fleet(agent: Agent, world: World, tmp_path: Path, *names: str) -> Path:
    fleet = tmp_path / "fleet.csv"
    fleet.write_text("name,address,subscribe\n" + "".join(
        f"{name},{tmp_path / 'inbox' / name},territory={'n1' if number % 2 else 'n2'}\n"
        for number, name in enumerate(names)))
    assert agent("remote", "add", world.hq, "--from", fleet).code == 0
    return fleet


def _customers(path: Path) -> list[tuple]:
    with connected(path) as conn:
        return conn.execute("SELECT id FROM customer ORDER BY id").fetchall()


def test_extract_many_into_a_folder(tmp_path: Path, agent: Agent, world: World) -> None:
    fleet = _add_fleet(agent, world, tmp_path, "m0", "m1", "m2")
    into = tmp_path / "fleet"
    into.mkdir()
    result = agent("extract", world.hq, "--from", fleet, "--into", into)
    assert result.code == 0, result.err
    assert "Extracted 3 remotes into" in result.out and "m1: " in result.out
    assert sorted(path.name for path in into.iterdir()) == ["m0.db", "m0.db.agent", "m1.db", "m1.db.agent",
                                                             "m2.db", "m2.db.agent"]
    assert _customers(into / "m0.db") == world.rows("hq", "SELECT id FROM customer WHERE region = 'n2' ORDER BY id")
    assert _customers(into / "m1.db") == world.rows("hq", "SELECT id FROM customer WHERE region = 'n1' ORDER BY id")
    with SiteDatabase.open(into / "m2.db") as m2, SiteDatabase.open(world.hq) as hq:
        assert m2.identity.name == "m2" and hq.remote("m2").public_key == m2.identity.public_key
    # Each extracted remote replicates: a change at hq reaches m1 through its inbox.
    (tmp_path / "inbox" / "m1").mkdir(parents=True)
    world.execute("hq", "INSERT INTO customer VALUES (500, 'n1', 'for m1', 'x')")
    assert agent("run", world.hq, "--once").code == 1  # the other new remotes have no inbox folder
    assert agent("run", into / "m1.db", "--once").code == 0
    assert (500,) in _customers(into / "m1.db")


def test_extract_named_remotes_and_all(tmp_path: Path, agent: Agent, world: World) -> None:
    _add_fleet(agent, world, tmp_path, "m0", "m1")
    (tmp_path / "some").mkdir()
    result = agent("extract", world.hq, "m1", "n1", "--into", tmp_path / "some")
    assert result.code == 0, result.err
    assert sorted(path.name for path in (tmp_path / "some").glob("*.db")) == ["m1.db", "n1.db"]
    (tmp_path / "all").mkdir()
    result = agent("extract", world.hq, "--all", "--into", tmp_path / "all")
    assert result.code == 0, result.err
    assert sorted(path.name for path in (tmp_path / "all").glob("*.db")) == ["m0.db", "m1.db", "n1.db", "n2.db"]
    names = tmp_path / "names.txt"
    names.write_text("# the northern sites\nm0\n\nn2\n")
    (tmp_path / "listed").mkdir()
    result = agent("extract", world.hq, "--from", names, "--into", tmp_path / "listed")
    assert result.code == 0, result.err
    assert sorted(path.name for path in (tmp_path / "listed").glob("*.db")) == ["m0.db", "n2.db"]


def test_a_target_in_the_way_or_an_unknown_remote_extracts_nothing(tmp_path: Path, agent: Agent,
                                                                    world: World) -> None:
    _add_fleet(agent, world, tmp_path, "m0", "m1", "m2")
    into = tmp_path / "fleet"
    into.mkdir()
    (into / "m1.db").write_text("in the way")
    result = agent("extract", world.hq, "--all", "--into", into)
    assert result.code == 1 and len(result.err_lines) == 1
    assert f"{into / 'm1.db'} exists already" in result.err and "--skip-existing" in result.err
    assert sorted(path.name for path in into.iterdir()) == ["m1.db"]
    result = agent("extract", world.hq, "m0", "ghost", "--into", into)
    assert result.code == 1 and "no remote named 'ghost'" in result.err
    assert sorted(path.name for path in into.iterdir()) == ["m1.db"]
    result = agent("extract", world.hq, "--all", "--into", into, "--skip-existing")
    assert result.code == 0, result.err
    assert "Left out 1 remotes" in result.out and "Extracted 4 remotes" in result.out
    assert (into / "m1.db").read_text() == "in the way"


def test_a_failure_stops_the_run_and_says_what_was_done(tmp_path: Path, agent: Agent, world: World,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.site.sqlite.database import SiteDatabase

    _add_fleet(agent, world, tmp_path, "m0", "m1", "m2")
    real = SiteDatabase.extract

    def failing(site, remote, target, **options):  # type: ignore[no-untyped-def]
        if remote == "m1":
            raise OSError(28, "No space left on device")
        return real(site, remote, target, **options)

    monkeypatch.setattr(SiteDatabase, "extract", failing)
    into = tmp_path / "fleet"
    into.mkdir()
    result = agent("extract", world.hq, "m0", "m1", "m2", "--into", into)
    assert result.code == 1 and len(result.err_lines) == 1
    assert "extracting m1" in result.err and "1 of 3 remotes were extracted" in result.err
    assert sorted(path.name for path in into.glob("*.db")) == ["m0.db"]
    # The key files written before the run: m0's stays with its copy, the others' are gone.
    assert sorted(path.name for path in into.iterdir()) == ["m0.db", "m0.db.agent"]
    monkeypatch.setattr(SiteDatabase, "extract", real)
    result = agent("extract", world.hq, "m0", "m1", "m2", "--into", into, "--skip-existing")
    assert result.code == 0, result.err
    assert sorted(path.name for path in into.glob("*.db")) == ["m0.db", "m1.db", "m2.db"]


def test_a_killed_run_into_a_folder_is_finished_by_the_same_command(tmp_path: Path, agent: Agent,
                                                                     world: World) -> None:
    """Every key file is written before the first copy: a run killed in its
    first copy leaves all of them, each with its claim.  The same command
    with --skip-existing removes them, says so, and extracts every remote."""
    _add_fleet(agent, world, tmp_path, "m0", "m1", "m2")
    into = tmp_path / "fleet"
    into.mkdir()
    command = [*AGENT_COMMAND, "extract", str(world.hq), "m0", "m1", "m2", "--into", str(into)]
    killed = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "FIELDSYNC_CRASH": "extract.copy-made"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(path.name for path in into.glob("*.agent/keys/*")) == ["site.key"] * 3 + ["site.key.making"] * 3
    result = agent("extract", world.hq, "m0", "m1", "m2", "--into", into, "--skip-existing")
    assert result.code == 0, result.err
    for name in ("m0", "m1", "m2"):
        assert f"Removed {into / f'{name}.db.agent' / 'keys' / 'site.key'}, left by an extraction" in result.out
    assert sorted(path.name for path in into.iterdir()) == ["m0.db", "m0.db.agent", "m1.db", "m1.db.agent",
                                                           "m2.db", "m2.db.agent"]
    assert sorted(path.name for path in into.glob("*.agent/keys/*")) == ["site.key"] * 3
    with SiteDatabase.open(into / "m2.db") as m2, SiteDatabase.open(world.hq) as hq:
        assert hq.remote("m2").public_key == m2.identity.public_key


@pytest.mark.parametrize("arguments, says", [
    (("--all",), "give --into"),
    (("n1",), "give REMOTE and TARGET"),
    (("n1", "a.db", "b.db"), "give REMOTE and TARGET"),
    (("n1", "--all", "--into", "."), "one way"),
    (("--into", "."), "one way"),
    (("n1", "n1", "--into", "."), "n1 is named twice"),
    (("n 1", "--into", "."), "invalid value for 'REMOTE'"),
    (("--all", "--format", "csv", "--into", "."), "give --from as well"),
])
def test_extract_usage_errors(agent: Agent, world: World, arguments: tuple[str, ...], says: str) -> None:
    result = agent("extract", world.hq, *arguments)
    assert result.code == 2 and len(result.err_lines) == 1 and says in result.err, result.err


def test_extract_many_progress_only_on_a_terminal(tmp_path: Path, agent: Agent, world: World,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _add_fleet(agent, world, tmp_path, "m0", "m1")
    (tmp_path / "a").mkdir()
    result = agent("extract", world.hq, "--all", "--into", tmp_path / "a")
    assert result.code == 0 and "━" not in result.out
    monkeypatch.setattr(extract_module, "show_progress", lambda out: True)
    (tmp_path / "b").mkdir()
    result = agent("extract", world.hq, "--all", "--into", tmp_path / "b")
    assert result.code == 0, result.err
    assert len(list((tmp_path / "b").glob("*.db"))) == 4
