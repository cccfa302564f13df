"""agent.cli.main: the command table, exit codes and one-line errors."""

from __future__ import annotations

import sys

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
