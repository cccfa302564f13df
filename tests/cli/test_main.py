"""agent.cli.main: the command table, exit codes and one-line errors."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import click
import pytest

import agent.cli as cli_module
from agent.cli import COMMANDS, main

from .conftest import Agent


def test_help_lists_every_command_without_importing_them(agent: Agent) -> None:
    for module, _, _ in COMMANDS.values():
        sys.modules.pop(module, None)
    result = agent("--help")
    assert result.code == 0
    for name in COMMANDS:
        assert name in result.out
    assert not any(module in sys.modules for module, _, _ in COMMANDS.values())


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_loads_and_has_help(agent: Agent, name: str) -> None:
    result = agent(name, "--help")
    assert result.code == 0, result.err
    assert "Usage: agent " + name in result.out


def test_unknown_command_is_a_usage_error_on_one_line(agent: Agent) -> None:
    result = agent("frobnicate")
    assert result.code == 2
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith("agent: ")
    assert "frobnicate" in result.err_lines[0]


def test_group_without_subcommand_shows_its_help(agent: Agent) -> None:
    result = agent("remote")
    assert result.code == 2
    assert "add" in result.err and "remove" in result.err


def test_version(agent: Agent) -> None:
    result = agent("--version")
    assert result.code == 0
    assert result.out.startswith("agent, version ")


@pytest.fixture
def broken_command(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command()
    def broken() -> None:
        raise ZeroDivisionError("boom")

    module = type(sys)("tests_cli_broken")
    module.broken = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tests_cli_broken", module)
    monkeypatch.setitem(COMMANDS, "broken", ("tests_cli_broken", "broken", "fails"))


@pytest.mark.usefixtures("broken_command")
def test_internal_error_is_one_line_asking_for_debug(agent: Agent) -> None:
    result = agent("broken")
    assert result.code == 1
    assert result.err_lines == ["agent: internal error: ZeroDivisionError: boom "
                                "(rerun with --debug for the traceback)"]


@pytest.mark.usefixtures("broken_command")
def test_debug_shows_the_traceback() -> None:
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "broken"])


def test_commands_return_their_exit_code(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    @click.command()
    def half() -> int:
        return 1

    module = type(sys)("tests_cli_half")
    module.half = half  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tests_cli_half", module)
    monkeypatch.setitem(COMMANDS, "half", ("tests_cli_half", "half", "returns 1"))
    assert main(["half"]) == 1


def test_describe_words_site_and_transport_errors_for_users() -> None:
    from agent.site.errors import NotASite
    from transports.errors import TransportUnavailable

    assert cli_module.describe(NotASite("x.db is not a site")) == "x.db is not a site"
    assert cli_module.describe(TransportUnavailable("folder /x is missing")) == "folder /x is missing"


BAD_VALUES = [
    (("remote", "add", "{hq}", "w", "--address", ""), "an address cannot be empty"),
    (("remote", "set", "{hq}", "n1", "--address", " "), "an address cannot be empty"),
    (("init", "{root}/new.db", "--name", "new", "--role", "remote", "--address", ""), "an address cannot be empty"),
    (("run", "{hq}", "--once", "--address", "in\tbox"), "has a control character"),
    (("run", "{hq}", "--once", "--transport", ""), "transport must be a name such as 'folder'"),
    (("publication", "create", "{hq}", "p\n1", "customer"), "publication name must be 1-128 printable characters"),
    (("publication", "add", "{hq}", "p" * 300, "customer"), "got '" + "p" * 40 + "...'"),
    (("inbox", "{hq}", "--transport", "faults+"), "has an empty part"),
    (("init", "{root}/new.db", "--name", "new", "--role", "remote", "--address", "in", "--transport", "Folder"),
     "'Folder' is not a transport name"),
    (("run", "{hq}", "--once", "--address", "in\x7fbox"), "has a control character"),
    (("remote", "set", "{hq}", "n1", "--address", "in\u2028box"), "has a control character"),
    (("init", "{root}/new.db", "--name", "new", "--role", "remote", "--transport", "sftp", "--address",
      "sftp://new:secret@files.example.com/in"), "sftp address sftp://new:***@files.example.com/in holds a password"),
    (("remote", "add", "{hq}", "w", "--transport", "faults+sftp", "--address", "sftp://w:secret@h/in"),
     "holds a password"),
    (("remote", "add", "{hq}", "w", "--transport", "email", "--address", "imaps://w@mail.example.com/IN?x"),
     "has a '?' or '#' part"),
    (("remote", "set", "{hq}", "n1", "--transport", "sftp"),
     "must look like sftp://user@host:port/path, got '{root}/inbox/n1'; give --address with the new transport sftp"),
    (("remote", "add", "{hq}", "w", "--address", "in/w", "--send-every", "9" * 23), "longer than the most"),
    (("remote", "add", "{hq}", "w", "--address", "in/w", "--send-every", "9" * 400), "not a duration"),
    (("run", "{hq}", "-rd", "9" * 400), "not a duration"),
    (("run", "{hq}", "--send-delay", "30s30m"), "not a duration"),
    (("run", "{hq}", "--once", "--receive-delay", "\uff13\uff10"), "not a duration"),
    (("remote", "set", "{hq}", "n1", "--send-every", "\u0663\u0660"), "not a duration"),
    (("remote", "add", "{hq}", "w", "--address", "in/w", "--send-at", "18.30"), "not a time of day"),
    (("run", "{hq}", "--once", "-l", "1g"), "above the maximum of 16777216 bytes"),
    (("run", "{hq}", "--once", "-l", "\uff11\uff12\uff13\uff14\uff15"), "not a size"),
    (("chaos", "--seeds", "\u0663", "--address-template", "{root}"), "'\u0663' is not a whole number"),
    (("run", "{hq}", "--once", "--patience", "1_0"), "'1_0' is not a whole number"),
    (("status", ""), "invalid value for 'DATABASE': the path is empty"),
    (("extract", "{hq}", "n1", ""), "invalid value for 'TARGET': the path is empty"),
    (("chaos", "--seeds", "1", "--address-template", "{nosuch}"), "unknown field {nosuch}"),
    (("chaos", "--seeds", "1", "--address-template", "{"), "write a brace as {{ or }}"),
    (("chaos", "--seeds", "1", "--send-address-template", "{0}"), "unknown field {0}"),
]


@pytest.mark.parametrize(("arguments", "says"), BAD_VALUES,
                         ids=[f"{arguments[0]}-{number}" for number, (arguments, _) in enumerate(BAD_VALUES)])
def test_bad_values_are_one_usage_line_and_change_nothing(agent: Agent, world, arguments, says) -> None:
    before = {path: path.read_bytes() for path in (world.hq, world.n1)}
    filled = [str(world.hq) if argument == "{hq}" else argument.replace("{root}", str(world.root), 1)
              if argument.startswith("{root}") else argument for argument in arguments]
    result = agent(*filled)
    assert (result.code, len(result.err_lines)) == (2, 1), result.err_lines
    assert says.replace("{root}", str(world.root)) in result.err and "internal error" not in result.err, result.err
    assert "secret" not in result.err
    assert {path: path.read_bytes() for path in before} == before
    assert not (world.root / "new.db").exists()


def test_a_control_character_in_an_error_stays_on_its_line(agent: Agent, tmp_path) -> None:
    result = agent("status", tmp_path / "a\nb\x1b[31m.db")
    assert result.code == 1 and len(result.err_lines) == 1, result.err_lines
    assert "a\\nb\\x1b[31m.db" in result.err


def test_a_path_in_the_way_is_named_with_what_to_do(agent: Agent, world) -> None:
    """A file where the agent needs a folder (or the reverse) is one line
    naming it, not a bare 'File exists'."""
    state = world.root / "hq.db.agent" / "state"
    if state.is_dir():
        import shutil
        shutil.rmtree(state)
    state.parent.mkdir(exist_ok=True)
    state.write_text("not a folder")
    result = agent("run", world.hq, "--once")
    assert result.code == 1 and result.err_lines == [
        f"agent: {state} is in the way: it exists and is not the folder the agent needs there; move it aside"]
    assert state.read_text() == "not a folder"
    assert cli_module.describe(IsADirectoryError(21, "Is a directory", "/x")) == (
        "/x is a folder where a file is needed; move it aside")
    assert cli_module.describe(NotADirectoryError(20, "Not a directory", "/x/y")) == (
        "/x/y: a part of this path is a file where a folder is needed; move it aside")
    assert cli_module.describe(OSError(36, "File name too long", "a" * 300)).startswith(
        "a path is too long for the file system: aaa")


def test_a_path_that_is_no_regular_file_says_so(agent: Agent) -> None:
    result = agent("status", "/dev/null")
    assert result.code == 1 and result.err_lines == ["agent: /dev/null is not a regular file, so not a site database"]


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """``folder`` cannot be written to, for root too (immutable), until the end."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(folder)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


def test_a_folder_that_cannot_be_written_to_is_named(agent: Agent, tmp_path: Path) -> None:
    """SQLite's own "unable to open database file" names neither the folder
    nor that the file may be fine: a site in a read-only folder says both."""
    folder = tmp_path / "sites"
    folder.mkdir()
    site = folder / "n9.db"
    assert agent("init", site, "--name", "n9", "--role", "remote", "--address", tmp_path / "in").code == 0
    for extra in ("-wal", "-shm"):
        assert not Path(f"{site}{extra}").exists()
    says = (f"agent: {folder / 'new.db'}: cannot open: the folder {folder} is not writable by this user, and SQLite "
            "keeps a database's -wal and -shm files beside it")
    with unwritable(folder):
        made = agent("init", folder / "new.db", "--name", "new", "--role", "remote", "--address", tmp_path / "in")
        # init writes the site's key file (beside the database) first.
        assert made.code == 1 and len(made.err_lines) == 1
        assert made.err_lines[0].startswith(f"agent: cannot write the key file of {folder / 'new.db'}: the folder "
                                            f"{folder} takes no new file ("), made.err_lines
        for command in (("status", site), ("run", site, "--once")):
            result = agent(*command)
            assert result.code == 1 and result.err_lines == [says.replace(str(folder / "new.db"), str(site))], \
                result.err_lines
    assert not (folder / "new.db").exists()
    assert agent("status", site).code == 0
