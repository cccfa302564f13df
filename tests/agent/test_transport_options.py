"""Which transport gets which --transport-option (agent.transport_options)."""

from __future__ import annotations

import pytest

from agent.errors import UsageError
from agent.transport_options import TransportOptions
from transports.folder import FolderTransport

OPTIONS = TransportOptions.from_items([
    (None, "stale_temp_age", 600),
    ("sftp", "key_file", "/etc/fieldsync/id"),
    ("email", "smtp_host", "mail.example.com"),
    ("faults", "seed", 7),
])


@pytest.mark.parametrize("spec, own, inner, wrappers", [
    # Plain options are the site's own transport's, and so any of its plugin's.
    ("folder", "folder", {"stale_temp_age": 600}, {}),
    ("faults+folder", "folder", {"stale_temp_age": 600}, {"faults": {"seed": 7}}),
    ("folder", "faults+folder", {"stale_temp_age": 600}, {}),
    # Another plugin gets only what is named for it.
    ("sftp", "folder", {"key_file": "/etc/fieldsync/id"}, {}),
    ("email", "folder", {"smtp_host": "mail.example.com"}, {}),
    ("faults+sftp", "folder", {"key_file": "/etc/fieldsync/id"}, {"faults": {"seed": 7}}),
    # Named options add to the plain ones of the own transport.
    ("email", "email", {"stale_temp_age": 600, "smtp_host": "mail.example.com"}, {}),
])
def test_options_go_to_the_transports_they_name(spec, own, inner, wrappers):
    assert OPTIONS.for_spec(spec, own=own) == (inner, wrappers)


def test_a_named_option_wins_over_a_plain_one():
    options = TransportOptions.from_items([(None, "min_age", 1.0), ("folder", "min_age", 2.0)])
    assert options.for_spec("folder", own="folder") == ({"min_age": 2.0}, {})


async def test_create_leaves_out_the_options_of_other_transports():
    # The folder transport would refuse smtp_host.
    built = TransportOptions.from_items([(None, "smtp_host", "x")]).create("folder", own="email")
    assert isinstance(built, FolderTransport)
    await built.aclose()


def test_an_unknown_prefix_is_one_line():
    with pytest.raises(UsageError, match=r"^--transport-option sfpt\.key_file: there is no transport or wrapper "
                                         r"named 'sfpt'; known: .*\bsftp\b"):
        TransportOptions.from_items([("sfpt", "key_file", "x")]).check_names()
    OPTIONS.check_names()  # every prefix above is known


def test_stored_options_come_first_then_a_peers_own_then_the_runs():
    site = TransportOptions.from_stored({"min_age": "1", "sftp.key_file": "/etc/fieldsync/id", "stale_temp_age": "60"})
    peer = TransportOptions.from_stored({"min_age": "2", "max_file_size": "64m"}, plugin="folder")
    run = TransportOptions.from_items([(None, "stale_temp_age", "90")])
    layered = run.over(peer.over(site))
    assert layered.for_spec("folder", own="folder") == (
        {"min_age": "2", "stale_temp_age": "90", "max_file_size": "64m"}, {})
    assert layered.for_spec("sftp", own="folder")[0] == {"key_file": "/etc/fieldsync/id"}


async def test_the_agent_builds_a_peers_transport_with_its_own_stored_options(tmp_path):
    from agent.admin import init_site
    from agent.runner import Agent, RunOptions

    (tmp_path / "in").mkdir()
    with init_site(tmp_path / "hq.db", name="hq", role="consolidated", address=str(tmp_path / "in"),
                   transport="folder") as site:
        site.add_remote("north", address=str(tmp_path / "north"), transport="folder")
        site.add_remote("south", address=str(tmp_path / "south"), transport="folder")
        site.set_transport(options={"min_age": "1", "stale_temp_age": "60"})
        site.set_transport(peer="north", options={"min_age": "2"})
    options = RunOptions(transport_options={"stale_temp_age": "90"})
    async with Agent(tmp_path / "hq.db", options) as agent:
        own, north, south = agent.transport_for(None), agent.transport_for("folder", "north"), \
            agent.transport_for("folder", "south")
        assert own is south and north is not own  # one transport per spec, and one per peer with options
        assert (own.min_age, own.stale_temp_age) == (1.0, 90.0)
        assert (north.min_age, north.stale_temp_age) == (2.0, 90.0)
