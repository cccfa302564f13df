"""agent remote add | subscribe | list | remove."""

from __future__ import annotations

import io
import json
import time as time_module
from datetime import time
from pathlib import Path

import pytest

import agent.cli._fleet as fleet_module
from agent.site import SiteDatabase
from tests.sqlfiles import connected
from transports.folder import FolderTransport
from transports.registry import register

from .conftest import Agent, World


@pytest.fixture
def site(tmp_path: Path, agent: Agent) -> Path:
    database = tmp_path / "hq.db"
    agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "hq-inbox")
    with connected(database) as conn:
        conn.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT, name TEXT)")
        conn.execute("CREATE TABLE depot (id INTEGER PRIMARY KEY, zone INTEGER)")
        conn.execute("CREATE TABLE product (sku TEXT PRIMARY KEY, price REAL)")
    agent("publication", "create", database, "territory", "customer@region")
    agent("publication", "create", database, "zones", "depot@zone")
    agent("publication", "create", database, "catalogue", "product")
    return database


def _remote(site: Path, name: str):  # type: ignore[no-untyped-def]
    with SiteDatabase.open(site) as opened:
        return opened.remote(name), opened.subscriptions(name)


def test_add_with_subscriptions_and_schedule(site: Path, agent: Agent, tmp_path: Path) -> None:
    result = agent("remote", "add", site, "north", "--address", tmp_path / "north", "--subscribe", "territory=north",
                   "--subscribe", "zones=7", "--subscribe", "catalogue", "--send-every", "30m")
    assert result.code == 0, result.err
    row, subscriptions = _remote(site, "north")
    assert (row.address, row.transport, row.send_every, row.send_at) == (str(tmp_path / "north"), "folder", 1800, None)
    values = {item.publication: item.value for item in subscriptions}
    # The value takes the type of the SUBSCRIBE BY column: zone is INTEGER.
    assert values == {"territory": "north", "zones": 7, "catalogue": None}
    assert type(values["zones"]) is int
    assert "every 30m" in result.out


def test_an_address_may_hold_any_printable_character(site: Path, agent: Agent, tmp_path: Path) -> None:
    # A no-break space is no control character: a folder may be named so.
    address = str(tmp_path / "north\u00a0inbox")
    result = agent("remote", "add", site, "north", "--address", address)
    assert result.code == 0, result.err
    assert _remote(site, "north")[0].address == address


def test_send_at(site: Path, agent: Agent, tmp_path: Path) -> None:
    assert agent("remote", "add", site, "south", "--address", tmp_path, "--send-at", "18:30").code == 0
    assert _remote(site, "south")[0].send_at == time(18, 30)


def test_send_every_and_send_at_exclude_each_other(site: Path, agent: Agent, tmp_path: Path) -> None:
    result = agent("remote", "add", site, "x", "--address", tmp_path, "--send-every", "1h", "--send-at", "18:30")
    assert result.code == 2 and len(result.err_lines) == 1 and "exclude each other" in result.err


def test_bad_duration_is_a_usage_error_on_one_line(site: Path, agent: Agent, tmp_path: Path) -> None:
    result = agent("remote", "add", site, "x", "--address", tmp_path, "--send-every", "soon")
    assert result.code == 2
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith("agent: invalid value for '--send-every'")
    assert "'soon' is not a duration" in result.err
    with SiteDatabase.open(site) as opened:
        assert opened.remotes() == ()


def test_public_key_from_line_and_file(site: Path, agent: Agent, tmp_path: Path) -> None:
    other = tmp_path / "north.db"
    agent("init", other, "--name", "north", "--role", "remote", "--address", tmp_path)
    line = agent("key", other).out.strip()
    assert agent("remote", "add", site, "north", "--address", tmp_path, "--public-key", line).code == 0
    assert _remote(site, "north")[0].public_key == line
    key_file = tmp_path / "north.pub"
    key_file.write_text("\ufeff" + line + "\n# north's key\n", encoding="utf-8")  # saved with a byte-order mark
    agent("remote", "remove", site, "north")
    assert agent("remote", "add", site, "north", "--address", tmp_path, "--public-key-file", key_file).code == 0
    assert _remote(site, "north")[0].public_key == line
    # The key of one site is refused for another.
    result = agent("remote", "add", site, "south", "--address", tmp_path, "--public-key", line)
    assert result.code == 1 and result.err_lines == [
        "agent: --public-key is the key of site 'north', not of 'south'"]
    result = agent("remote", "add", site, "west", "--address", tmp_path, "--public-key", "not a key")
    assert result.code == 1 and len(result.err_lines) == 1 and "public key" in result.err
    # A seal key no secret can be made with (all zeros) is refused as it is given.
    zero = " ".join([*line.split()[:2], "west", line.split()[3], "A" * 43 + "="])
    result = agent("remote", "add", site, "west", "--address", tmp_path, "--public-key", zero)
    assert result.code == 1 and len(result.err_lines) == 1, result.err_lines
    assert "seal public key of west is a low-order X25519 point, not a usable key" in result.err
    with SiteDatabase.open(site) as opened:
        assert "west" not in {remote.name for remote in opened.remotes()}


def test_subscription_mistakes_add_nothing(site: Path, agent: Agent, tmp_path: Path) -> None:
    cases = [
        (("--subscribe", "nosuch=1"), "no publication named 'nosuch'"),
        (("--subscribe", "territory"), "give the value: --subscribe territory=VALUE"),
        (("--subscribe", "catalogue=5"), "has no SUBSCRIBE BY column"),
        (("--subscribe", "zones=seven"), "'seven' is not a number"),
        # SQLite keeps other scripts' digits as text, so they match no INTEGER value.
        (("--subscribe", "zones=\u0663"), "'\u0663' is not a number"),
        (("--subscribe", "zones=1_000"), "'1_000' is not a number"),
    ]
    for arguments, message in cases:
        result = agent("remote", "add", site, "x", "--address", tmp_path, *arguments)
        assert result.code == 1, arguments
        assert len(result.err_lines) == 1 and message in result.err
    with SiteDatabase.open(site) as opened:
        assert opened.remotes() == ()


def test_subscribe_later(site: Path, agent: Agent, tmp_path: Path) -> None:
    agent("remote", "add", site, "north", "--address", tmp_path)
    result = agent("remote", "subscribe", site, "north", "territory=north", "catalogue")
    assert result.code == 0, result.err
    assert {item.publication for item in _remote(site, "north")[1]} == {"territory", "catalogue"}


def test_list_and_remove(site: Path, agent: Agent, tmp_path: Path) -> None:
    assert "no remote users" in agent("remote", "list", site).out
    agent("remote", "add", site, "north", "--address", tmp_path / "n", "--subscribe", "territory=north")
    agent("remote", "add", site, "south", "--address", tmp_path / "s", "--send-at", "06:00")
    listing = agent("remote", "list", site)
    assert listing.code == 0
    for text in ("north", "south", "territory=north", "at 06:00", "on each run", str(tmp_path / "n")):
        assert text in listing.out
    assert agent("remote", "remove", site, "north").code == 0
    with SiteDatabase.open(site) as opened:
        assert [row.name for row in opened.remotes()] == ["south"]
        assert opened.subscriptions("north") == ()


def test_unknown_remote_is_one_line(site: Path, agent: Agent) -> None:
    for arguments in (("remote", "remove", site, "ghost"), ("remote", "subscribe", site, "ghost", "catalogue")):
        result = agent(*arguments)
        assert result.code == 1
        assert len(result.err_lines) == 1
        assert "has no remote named 'ghost'" in result.err and "agent remote add" in result.err


@pytest.mark.parametrize("name", ["", "a b", "../x", "_north", "n" * 49, "nörth"])
def test_a_bad_site_name_is_a_usage_error_on_one_line(site: Path, agent: Agent, tmp_path: Path, name: str) -> None:
    agent("remote", "add", site, "north", "--address", tmp_path)
    rule = (f"invalid site name {name!r}: use 1-48 letters, digits, '_' or '-', starting with a letter or digit")
    for command, argument, more in ((("remote", "add"), "NAME", ("--address", tmp_path / "x")),
                                    (("remote", "set"), "NAME", ("--no-schedule",)),
                                    (("remote", "remove"), "NAME", ()),
                                    (("remote", "subscribe"), "NAME", ("catalogue",)),
                                    (("extract",), "REMOTE", (tmp_path / "x.db",))):
        result = agent(*command, site, name, *more)
        assert result.code == 2, (command, result.err)
        assert result.err_lines == [f"agent: invalid value for '{argument}': {rule} "
                                    f"(see 'agent {' '.join(command)} --help')"]
    with SiteDatabase.open(site) as opened:
        assert [row.name for row in opened.remotes()] == ["north"]
    assert not (tmp_path / "x.db").exists()


def test_adding_twice_is_refused(site: Path, agent: Agent, tmp_path: Path) -> None:
    agent("remote", "add", site, "north", "--address", tmp_path)
    result = agent("remote", "add", site, "north", "--address", tmp_path)
    assert result.code == 1 and len(result.err_lines) == 1 and "exists already" in result.err


def test_missing_address_is_a_usage_error(site: Path, agent: Agent) -> None:
    result = agent("remote", "add", site, "north")
    assert result.code == 2 and len(result.err_lines) == 1 and "--address" in result.err


def test_set_changes_how_a_remote_is_reached_and_keeps_its_stream(site: Path, agent: Agent, tmp_path: Path) -> None:
    assert agent("remote", "add", site, "north", "--address", tmp_path / "north", "--send-every", "30m").code == 0
    with SiteDatabase.open(site) as opened:
        opened.update_remote("north", log_sent=0, resend_count=2)
    before = _remote(site, "north")[0]
    other = tmp_path / "north.db"
    agent("init", other, "--name", "north", "--role", "remote", "--address", tmp_path)
    line = agent("key", other).out.strip()
    result = agent("remote", "set", site, "north", "--transport", "sftp", "--address", "sftp://sync@127.0.0.1/north",
                   "--public-key", line, "--send-at", "18:30")
    assert result.code == 0, result.err
    after = _remote(site, "north")[0]
    assert (after.transport, after.address, after.public_key) == ("sftp", "sftp://sync@127.0.0.1/north", line)
    assert (after.send_every, after.send_at) == (None, time(18, 30))
    assert "north: transport folder -> sftp" in result.out and "north: schedule every 30m -> at 18:30" in result.out
    # The stream goes on: nothing of the protocol's state changed.
    assert (after.log_sent, after.resend_count, after.peer_incarnation) == (
        before.log_sent, before.resend_count, before.peer_incarnation)
    assert agent("remote", "set", site, "north", "--no-schedule").code == 0
    assert (_remote(site, "north")[0].send_every, _remote(site, "north")[0].send_at) == (None, None)


@pytest.mark.parametrize("arguments, code, text", [
    ((), 2, "nothing to change"),
    (("--send-every", "5m", "--no-schedule"), 2, "exclude each other"),
    (("--transport", "no such"), 2, "is not a transport name"),
    (("--transport", ""), 2, "transport must be a name"),
    (("--transport", "nosuch"), 1, "unknown transport 'nosuch'"),
    (("--transport", "faults"), 1, "is a wrapper; name the transport it wraps"),
    (("--public-key", "not a key"), 1, "public key"),
])
def test_set_mistakes_change_nothing(site: Path, agent: Agent, tmp_path: Path, arguments: tuple, code: int,
                                     text: str) -> None:
    assert agent("remote", "add", site, "north", "--address", tmp_path / "north").code == 0
    before = _remote(site, "north")[0]
    result = agent("remote", "set", site, "north", *arguments)
    assert result.code == code and len(result.err_lines) == 1 and text in result.err, result.err_lines
    assert _remote(site, "north")[0] == before


def test_set_of_an_unknown_remote_is_one_line(site: Path, agent: Agent) -> None:
    result = agent("remote", "set", site, "nobody", "--address", "x")
    assert result.code == 1 and len(result.err_lines) == 1 and "has no remote named 'nobody'" in result.err
    # The site's own name: no advice to add it, which would be refused.
    result = agent("remote", "set", site, "hq", "--address", "x")
    assert result.code == 1 and result.err_lines == [
        f"agent: 'hq' is the name of the site in {site} itself, not one of its remotes (it has no remotes yet)"]


def test_add_and_init_refuse_an_unknown_transport(site: Path, agent: Agent, tmp_path: Path) -> None:
    """Stored now, used at every run: an unknown name would stop them all."""
    result = agent("remote", "add", site, "west", "--address", tmp_path, "--transport", "nosuch")
    assert result.code == 1 and len(result.err_lines) == 1 and "unknown transport 'nosuch'" in result.err
    with SiteDatabase.open(site) as opened:
        assert "west" not in {remote.name for remote in opened.remotes()}
    result = agent("init", tmp_path / "new.db", "--name", "new", "--role", "remote", "--address", tmp_path,
                   "--transport", "faults+nosuch")
    assert result.code == 1 and len(result.err_lines) == 1 and "unknown transport 'nosuch'" in result.err
    assert not (tmp_path / "new.db").exists()


def test_a_remote_cannot_be_sent_to_at_the_sites_own_inbox(agent: Agent, world: World) -> None:
    own = world.root / "inbox" / "hq"
    for command in (("remote", "add", world.hq, "n3", "--address", own),
                    ("remote", "set", world.hq, "n1", "--address", f"{own}/")):
        result = agent(*command)
        assert result.code == 1 and result.err_lines == [
            f"agent: {command[-1]} is this site's own inbox (hq reads it): give {command[3]}'s inbox"], result.err
    with SiteDatabase.open(world.hq) as site:
        assert [remote.name for remote in site.remotes()] == ["n1", "n2"]
        assert site.remote("n1").address == str(world.root / "inbox" / "n1")


class _NeedsItsOptions(FolderTransport):
    """A plugin that cannot be built without an option only a run gives it."""

    def __init__(self, *, region: str) -> None:
        super().__init__()
        self.region = region

    def check_address(self, address: str) -> str:
        raise AssertionError("not to be asked without its options")


def test_an_address_is_checked_by_its_transport_when_that_can_be_built_without_options(
        site: Path, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    import transports.registry as registry_module

    monkeypatch.setattr(registry_module, "_registry", dict(registry_module._registry))
    monkeypatch.setattr(registry_module, "_loaded", dict(registry_module._loaded))
    register("needy", _NeedsItsOptions)
    result = agent("remote", "add", site, "west", "--transport", "needy", "--address", "anything://at/all")
    assert result.code == 0, result.err
    assert _remote(site, "west")[0].address == "anything://at/all"
    # A built-in one is asked, and its refusal stores nothing.
    result = agent("remote", "set", site, "west", "--transport", "sftp", "--address", "sftp://west@files/in?x")
    assert result.code == 2 and len(result.err_lines) == 1 and "has a '?' or '#' part" in result.err
    assert (_remote(site, "west")[0].transport, _remote(site, "west")[0].address) == ("needy", "anything://at/all")


# -- remote add --from FILE: a fleet at once ------------------------------------------


def _names(site: Path) -> list[str]:
    with SiteDatabase.open(site) as opened:
        return [row.name for row in opened.remotes()]


def test_add_from_csv(site: Path, agent: Agent, tmp_path: Path) -> None:
    fleet = tmp_path / "remotes.csv"
    fleet.write_text("name,address,transport,subscribe,subscribe,send_every,send_at\n"
                     "north,inbox/north,folder,territory=north,zones=7,30m,\n"
                     "# a comment line\n"
                     '"south","inbox/so,uth",,catalogue,,,18:30\n'
                     "\n")
    result = agent("remote", "add", site, "--from", fleet)
    assert result.code == 0, result.err
    assert "Added 2 remotes" in result.out and "3 subscriptions" in result.out
    north, north_subscriptions = _remote(site, "north")
    south, south_subscriptions = _remote(site, "south")
    assert (north.address, north.transport, north.send_every, north.send_at) == ("inbox/north", "folder", 1800, None)
    assert (south.address, south.transport, south.send_every, south.send_at) == ("inbox/so,uth", "folder", None,
                                                                                 time(18, 30))
    values = {item.publication: item.value for item in north_subscriptions}
    assert values == {"territory": "north", "zones": 7} and type(values["zones"]) is int
    assert [(item.publication, item.value) for item in south_subscriptions] == [("catalogue", None)]


def test_add_from_json_lines(site: Path, agent: Agent, tmp_path: Path) -> None:
    key = _public_key(tmp_path, agent, "east")
    fleet = tmp_path / "remotes.jsonl"
    fleet.write_text(
        '{"name": "west", "address": "inbox/west", "subscribe": ["catalogue", "zones=8"], "send_every": 600}\n'
        "\n"
        + json.dumps({"name": "east", "address": "inbox/east", "transport": "folder", "subscribe": "territory=east",
                      "send_every": "1h", "send_at": None, "public_key": key}) + "\n")
    result = agent("remote", "add", site, "--from", fleet)
    assert result.code == 0, result.err
    west, west_subscriptions = _remote(site, "west")
    east, east_subscriptions = _remote(site, "east")
    assert (west.send_every, east.send_every, east.public_key) == (600, 3600, key)
    assert [(item.publication, item.value) for item in west_subscriptions] == [("catalogue", None), ("zones", 8)]
    assert [(item.publication, item.value) for item in east_subscriptions] == [("territory", "east")]


def _public_key(tmp_path: Path, agent: Agent, name: str) -> str:
    database = tmp_path / f"{name}.db"
    assert agent("init", database, "--name", name, "--role", "remote", "--address", tmp_path / name).code == 0
    return agent("key", database).out.strip()


def test_add_from_stdin_with_a_format(site: Path, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("name,address\nnorth,inbox/north\n"))
    result = agent("remote", "add", site, "--from", "-", "--format", "csv")
    assert result.code == 0, result.err
    assert _names(site) == ["north"]
    assert "Added 1 remote to " in result.out and "with 0 subscriptions" in result.out, result.out


@pytest.mark.parametrize("text, code, line, says", [
    ("name,address,send_at\nn1,inbox/n1,\nn2,inbox/n2,\nn3,inbox/n3,25:00\n", 2, 4, "send_at: '25:00' is not a time"),
    ("name,address\nn1,inbox/n1\nn 2,inbox/n2\n", 2, 3, "name"),
    ("name,address\nn1,inbox/n1\nn2,\n", 2, 3, "no address"),
    ("name,address,send_every,send_at\nn1,inbox/n1,5m,18:30\n", 2, 2, "exclude each other"),
    ("name,address,subscribe\nn1,inbox/n1,zones=seven\n", 1, 2, "'seven' is not a number"),
    ("name,address,subscribe\nn1,inbox/n1,nosuch\n", 1, 2, "no publication named 'nosuch'"),
    ("name,address\nn1,inbox/n1\nn2,inbox/n2\nn1,inbox/other\n", 2, 4, "n1 is on line 2 already"),
    ("name,address\nn1,inbox/n1\nhq,inbox/x\n", 1, 3, "its own remote"),
    ("name,address\nn1,inbox/n1\ntaken,inbox/t\n", 1, 3, "exists already"),
    ("name,address,region\nn1,inbox/n1,north\n", 2, 1, "unknown column 'region'"),
    ("name,address\nn1,inbox/n1,extra\n", 2, 2, "3 cells, but the header has 2"),
    ("name,address,transport\nn1,inbox/n1,Folder\n", 2, 2, "transport"),
    ("name,address,transport\nn1,inbox/n1,nosuch\n", 1, 2, "nosuch"),
    ("name,address\nn1,{root}/hq-inbox\n", 1, 2, "own inbox"),
])
def test_a_bad_line_adds_nothing_and_names_the_file_and_line(site: Path, agent: Agent, tmp_path: Path, text: str,
                                                             code: int, line: int, says: str) -> None:
    agent("remote", "add", site, "taken", "--address", tmp_path / "taken")
    fleet = tmp_path / "fleet.csv"
    fleet.write_text(text.replace("{root}", str(tmp_path)))
    result = agent("remote", "add", site, "--from", fleet)
    assert result.code == code, result.err
    assert len(result.err_lines) == 1
    assert f"{fleet}, line {line}" in result.err and says in result.err
    assert result.err.rstrip().endswith("nothing was added")
    assert _names(site) == ["taken"]


@pytest.mark.parametrize("line, says", [
    ('{"name": "n1", "address": "inbox/n1"', "not JSON"),
    ('["n1", "inbox/n1"]', "a list where an object is needed"),
    ('{"name": "n1", "address": "inbox/n1", "zone": 7}', "unknown key 'zone'"),
    ('{"name": "n1", "address": "inbox/n1", "subscribe": [7]}', "subscribe is a text or a list of texts"),
    ('{"name": "n1", "address": ["inbox/n1"]}', "address must be text"),
    ('{"name": "n1", "address": "inbox/n1", "send_every": true}', "send_every must be text"),
    ('{"name": "n1", "address": "inbox/n1", "send_every": "soon"}', "send_every: 'soon' is not a duration"),
])
def test_a_bad_json_line_adds_nothing(site: Path, agent: Agent, tmp_path: Path, line: str, says: str) -> None:
    fleet = tmp_path / "fleet.jsonl"
    fleet.write_text('{"name": "n0", "address": "inbox/n0"}\n\n' + line + "\n")
    result = agent("remote", "add", site, "--from", fleet)
    assert result.code == 2, result.err
    assert len(result.err_lines) == 1 and f"{fleet}, line 3" in result.err and says in result.err
    assert _names(site) == []


def test_a_public_key_of_another_site_names_its_line(site: Path, agent: Agent, tmp_path: Path) -> None:
    key = _public_key(tmp_path, agent, "east")
    fleet = tmp_path / "fleet.jsonl"
    fleet.write_text(json.dumps({"name": "west", "address": "inbox/west", "public_key": key}) + "\n")
    result = agent("remote", "add", site, "--from", fleet)
    assert result.code == 1 and f"{fleet}, line 1 (west)" in result.err and "not of 'west'" in result.err
    assert _names(site) == []


@pytest.mark.parametrize("arguments", [
    ("north",), ("--address", "inbox/x"), ("--subscribe", "catalogue"), ("--send-every", "5m"),
    ("--transport", "folder"),
])
def test_from_excludes_the_options_of_one_remote(site: Path, agent: Agent, tmp_path: Path,
                                                 arguments: tuple[str, ...]) -> None:
    fleet = tmp_path / "fleet.csv"
    fleet.write_text("name,address\nn1,inbox/n1\n")
    result = agent("remote", "add", site, "--from", fleet, *arguments)
    assert result.code == 2 and "--from FILE takes every remote from the file" in result.err
    assert _names(site) == []


def test_empty_and_missing_fleet_files(site: Path, agent: Agent, tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("name,address\n")
    result = agent("remote", "add", site, "--from", empty)
    assert result.code == 2 and "holds no remotes" in result.err
    result = agent("remote", "add", site, "--from", tmp_path / "nosuch.csv")
    assert result.code == 1 and "cannot read" in result.err
    result = agent("remote", "add", site, "--format", "csv")
    assert result.code == 2 and "give --from as well" in result.err


def test_ten_thousand_remotes_in_one_command(site: Path, agent: Agent, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.csv"
    fleet.write_text("name,address,subscribe,subscribe\n" + "".join(
        f"site{number:05d},inbox/site{number:05d},catalogue,territory=r{number % 50}\n" for number in range(10000)))
    started = time_module.monotonic()
    result = agent("remote", "add", site, "--from", fleet)
    elapsed = time_module.monotonic() - started
    assert result.code == 0, result.err
    assert "Added 10000 remotes" in result.out and "20000 subscriptions" in result.out
    with SiteDatabase.open(site) as opened:
        assert len(opened.remotes()) == 10000 and len(opened.subscriptions()) == 20000
    assert elapsed < 30  # the target; it takes well under a second here


def test_progress_bars_only_on_a_terminal(site: Path, agent: Agent, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = tmp_path / "fleet.csv"
    fleet.write_text("name,address\n" + "".join(f"n{number},inbox/n{number}\n" for number in range(50)))
    result = agent("remote", "add", site, "--from", fleet)
    assert result.code == 0 and "━" not in result.out  # not a terminal: no bar
    monkeypatch.setattr(fleet_module, "show_progress", lambda out: True)
    (tmp_path / "more.csv").write_text("name,address\n" + "".join(f"m{number},inbox/m{number}\n"
                                                                  for number in range(50)))
    result = agent("remote", "add", site, "--from", tmp_path / "more.csv")
    assert result.code == 0, result.err
    assert len(_names(site)) == 100


# -- ack-errors --------------------------------------------------------------------------------


def _apply_error(database: Path, peer: str) -> None:
    with connected(database) as conn:
        conn.execute("INSERT INTO fieldsync_apply_error (at, peer, peer_commit, problem)"
                     " VALUES ('2026-03-01T12:00:00+00:00', ?, 1, 'UNIQUE constraint failed')", (peer,))


def _open_errors(database: Path) -> dict[str, int]:
    with SiteDatabase.open(database) as opened:
        return opened.open_apply_errors()


def test_ack_errors_acknowledges_what_was_read_and_keeps_the_rows(site: Path, agent: Agent, tmp_path: Path) -> None:
    assert agent("remote", "add", site, "r1", "--address", tmp_path / "r1").code == 0
    assert agent("remote", "add", site, "r2", "--address", tmp_path / "r2").code == 0
    for peer in ("r1", "r1", "r2", "r1"):
        _apply_error(site, peer)
    result = agent("remote", "ack-errors", site, "r1", "--through", "2")  # errors 1 and 2: the ones read
    assert result.code == 0 and "Acknowledged 2 apply errors of r1" in result.out
    assert _open_errors(site) == {"r1": 1, "r2": 1}
    assert agent("remote", "ack-errors", site, "r1").code == 0
    assert _open_errors(site) == {"r2": 1}
    result = agent("remote", "ack-errors", site, "r1")
    assert result.code == 0 and "r1 has no apply errors to acknowledge" in result.out
    with SiteDatabase.open(site) as opened:
        assert len(opened.apply_errors()) == 4  # history


def test_ack_errors_of_a_removed_remote_and_of_an_unknown_name(site: Path, agent: Agent, tmp_path: Path) -> None:
    assert agent("remote", "add", site, "r1", "--address", tmp_path / "r1").code == 0
    _apply_error(site, "gone")
    assert agent("remote", "ack-errors", site, "gone").code == 0  # its rows outlive the remote
    assert _open_errors(site) == {}
    result = agent("remote", "ack-errors", site, "nobody")
    assert result.code == 1 and len(result.err_lines) == 1 and "no remote named 'nobody'" in result.err
    result = agent("remote", "ack-errors", site, "r1", "--through", "0")
    assert result.code == 2 and "--through" in result.err


def test_a_second_remote_on_one_inbox_is_accepted_with_one_warning(site: Path, agent: Agent, tmp_path: Path) -> None:
    """A shared inbox works (each agent takes only its own files) but is
    more often a slip: add, set and --from say so in one line naming the
    remotes at that address; --shared-inbox says it is meant."""
    assert agent("remote", "add", site, "north", "--address", tmp_path / "box").err == ""
    result = agent("remote", "add", site, "south", "--address", tmp_path / "box")
    assert result.code == 0 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"warning: {tmp_path / 'box'} is the inbox of north, south:")
    assert "--shared-inbox" in result.err_lines[0]
    assert agent("remote", "add", site, "east", "--address", tmp_path / "box", "--shared-inbox").err == ""
    assert agent("remote", "add", site, "west", "--address", tmp_path / "west").err == ""
    result = agent("remote", "set", site, "west", "--address", str(tmp_path / "box") + "/")  # the same folder
    assert result.code == 0 and result.err_lines == [
        f"warning: {tmp_path / 'box'}/ is the inbox of east, north, south, west: each agent takes only its own "
        "files there; if that was not meant, give each remote its own address (--shared-inbox silences this)"]
    fleet = tmp_path / "fleet.csv"
    fleet.write_text(f"name,address\nn1,{tmp_path / 'pair'}\nn2,{tmp_path / 'pair'}\nn3,{tmp_path / 'own'}\n")
    result = agent("remote", "add", site, "--from", fleet)
    assert result.code == 0 and len(result.err_lines) == 1 and "is the inbox of n1, n2:" in result.err, result.err
    assert "Added 3 remotes" in result.out


def test_an_unknown_remote_is_one_line_with_the_closest_names(site: Path, agent: Agent, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.csv"
    fleet.write_text("name,address\n" + "".join(f"depot{n:03d},{tmp_path / f'd{n}'}\n" for n in range(200)))
    assert agent("remote", "add", site, "--from", fleet).code == 0
    result = agent("remote", "set", site, "depot1000", "--heartbeat", "1h")
    # One short line, not 200 names: counted without the database's path, which it names twice and whose
    # length is pytest's (longer under pytest-xdist, popen-gwN/ in it).
    assert result.code == 1 and len(result.err_lines) == 1 and len(result.err.replace(str(site), "")) < 180, \
        result.err
    assert "it has 200 remotes; the closest: depot100" in result.err
