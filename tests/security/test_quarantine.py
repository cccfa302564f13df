"""The quarantine under a flood: bounded in files and bytes, deduplicated,
the agent's own (0600), and cheap per refused file (no fsync each).

The issue's finding: 10,000 one-byte files named as messages of a known peer
took 114 s for one run (11 ms of fsyncs each) and left 20,000 quarantine
files.  The run's time is measured by ``benchmarks.hostile_inbox``; here the
fsyncs are counted, which does not depend on the machine's load.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from agent.cli import main
from agent.quarantine import QuarantineLimits, QuarantineStore, read_quarantine
from agent.runner import Agent, RunOptions
from codec.header import Header
from codec.names import Kind, MessageName
from tests.cli.conftest import World, make_world


def _agent(*arguments: object) -> object:
    class Result:
        code = main([str(argument) for argument in arguments])
    return Result


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path, _agent)  # type: ignore[arg-type]


def junk_names(count: int, sender: str = "n1") -> list[str]:
    return [str(MessageName(sender, "hq", Kind.DATA, Header(0, number, number + 1, 0))) for number in range(count)]


def run_hq(world: World, options: RunOptions | None = None) -> object:
    async def once() -> object:
        async with Agent(world.hq, options or RunOptions()) as agent:
            return await agent.run_once()
    return asyncio.run(once())


def test_ten_thousand_junk_files_cost_no_fsync_each_and_stay_within_the_caps(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    for number, name in enumerate(junk_names(10_000)):
        (world.inbox("hq") / name).write_bytes(number.to_bytes(4, "big"))  # all different
    calls = {"fsync": 0}
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def counted(real):  # type: ignore[no-untyped-def]
        def call(fd: int) -> None:
            calls["fsync"] += 1
            real(fd)
        return call

    monkeypatch.setattr(os, "fsync", counted(real_fsync))
    monkeypatch.setattr(os, "fdatasync", counted(real_fdatasync))
    report = run_hq(world)
    assert report.quarantined == 10_000  # type: ignore[attr-defined]
    assert list(world.inbox("hq").iterdir()) == []  # every junk file taken off the inbox
    # The fsyncs of a run do not grow with the junk: the old code made
    # several per file (tens of thousands here).
    assert calls["fsync"] < 100, calls
    entries = read_quarantine(world.root / "hq.db.agent" / "quarantine")
    limits = QuarantineLimits()
    assert len(entries) == limits.peer_files
    # The newest are kept, the oldest dropped.
    assert entries[-1].name == junk_names(10_000)[-1]
    assert report.quarantine_dropped == 10_000 - limits.peer_files  # type: ignore[attr-defined]
    assert len(list((world.root / "hq.db.agent" / "quarantine").iterdir())) == 2 * limits.peer_files


def test_the_run_summary_counts_every_file_and_says_what_was_dropped(world: World,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    for number, name in enumerate(junk_names(30)):
        (world.inbox("hq") / name).write_bytes(number.to_bytes(4, "big"))
    capsys.readouterr()
    assert main(["run", str(world.hq), "--once", "--quarantine-limit", "peer-files=10"]) == 0
    out, err = capsys.readouterr()
    assert "quarantined 30," in out and "30 file(s) quarantined" in out
    assert "20 older quarantined file(s) were dropped" in out
    assert len(read_quarantine(world.root / "hq.db.agent" / "quarantine")) == 10
    # Twenty warnings for single files, then one line for the rest.
    assert len([line for line in err.splitlines() if "WARNING" in line and "quarantined n1." in line]) == 20
    assert "counted, not listed" in err


def test_quarantine_files_are_the_agents_own(world: World) -> None:
    [name] = junk_names(1)
    (world.inbox("hq") / name).write_bytes(b"x" * 100)
    os.chmod(world.inbox("hq") / name, 0o644)
    run_hq(world)
    folder = world.root / "hq.db.agent" / "quarantine"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = list(folder.iterdir())
    assert len(files) == 2
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_one_content_is_stored_once(world: World) -> None:
    for name in junk_names(500):
        (world.inbox("hq") / name).write_bytes(b"\x01")  # the same byte under 500 names
    report = run_hq(world)
    assert report.quarantined == 500  # type: ignore[attr-defined]
    [entry] = read_quarantine(world.root / "hq.db.agent" / "quarantine")
    assert entry.name == junk_names(1)[0] and entry.size == 1


def test_the_total_caps_hold_across_senders(world: World) -> None:
    for sender in ("n1", "n2", "stranger"):
        for number, name in enumerate(junk_names(40, sender)):
            (world.inbox("hq") / name).write_bytes(f"{sender}{number}".encode())
    run_hq(world, RunOptions(quarantine=QuarantineLimits(peer_files=30, total_files=50)))
    entries = read_quarantine(world.root / "hq.db.agent" / "quarantine")
    assert len(entries) == 50
    by_peer: dict[str | None, int] = {}
    for entry in entries:
        by_peer[entry.peer] = by_peer.get(entry.peer, 0) + 1
    assert all(count <= 30 for count in by_peer.values()), by_peer
    assert by_peer.get(None) == 30  # not a peer: its own bucket, and the newest


def test_bytes_caps_and_a_file_over_the_byte_cap_keeps_only_its_record(tmp_path: Path) -> None:
    store = QuarantineStore(tmp_path / "q", QuarantineLimits(peer_bytes=1000, total_bytes=1500), clock=lambda: 1.0)
    store.put("n1", "big", b"b" * 5000, "too big to keep")
    [big] = read_quarantine(tmp_path / "q")
    assert not big.kept and big.size == 5000 and big.name == "big"
    assert len(list((tmp_path / "q").iterdir())) == 1  # the record alone
    store.put("n1", "a", b"a" * 600, "bad")
    store.put("n1", "c", b"c" * 600, "bad")  # n1 would hold 1200 > 1000: "a" goes
    store.put("n2", "d", b"d" * 800, "bad")  # 1400 in all, within 1500
    store.put("n2", "e", b"e" * 200, "bad")  # 1600 > 1500: the oldest go, "big"'s record, then "c"
    assert [entry.name for entry in read_quarantine(tmp_path / "q")] == ["d", "e"]
    assert store.dropped == 3


def test_caps_lowered_since_the_last_run_hold_at_the_next_file(tmp_path: Path) -> None:
    store = QuarantineStore(tmp_path / "q", clock=lambda: 1.0)
    for number in range(20):
        store.put("n1", f"f{number}", number.to_bytes(2, "big"), "bad")
    smaller = QuarantineStore(tmp_path / "q", QuarantineLimits(peer_files=5), clock=lambda: 2.0)
    smaller.put("n1", "new", b"new", "bad")
    names = [entry.name for entry in read_quarantine(tmp_path / "q")]
    assert names == ["f16", "f17", "f18", "f19", "new"]


def test_names_from_senders_never_become_paths(tmp_path: Path) -> None:
    store = QuarantineStore(tmp_path / "q", clock=lambda: 1.0)
    store.put(None, "../../etc/passwd", b"x", "bad")
    store.put(None, ".hidden\nname", b"y", "bad")
    assert {path.parent for path in (tmp_path / "q").rglob("*")} == {tmp_path / "q"}
    assert {entry.name for entry in read_quarantine(tmp_path / "q")} == {"../../etc/passwd", ".hidden\nname"}


@pytest.mark.parametrize("bad", ["peer-files=0", "bytes=5", "peer-files=20000"])
def test_bad_quarantine_limits_are_usage_errors(world: World, bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(world.hq), "--once", "--quarantine-limit", bad]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "quarantine" in err


def test_a_quarantine_from_before_is_made_the_agents_own_when_the_agent_opens(world: World) -> None:
    folder = world.root / "hq.db.agent" / "quarantine"
    folder.mkdir(parents=True, mode=0o755)
    os.chmod(folder, 0o755)
    old = folder / "00000000000000000001-n1.hq.d.x.fsm"
    old.write_bytes(b"old evidence")
    os.chmod(old, 0o644)
    run_hq(world)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(old.stat().st_mode) == 0o600


def test_files_set_aside_when_an_apply_is_refused_are_counted_in_the_summary(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """A group of parts that each verify but do not join into a transaction
    is refused at apply time; the run's summary counts its files (the old
    code said "quarantined 0" and then "3 file(s) quarantined")."""
    from codec.message import compress, frame
    from tests.security.sites import epoch_of, keys_of

    keys, incarnation = keys_of(world.n1)
    epoch = epoch_of(world.hq, "n1")
    headers = [Header(epoch, 0, 0, 0), Header(epoch, 0, 0, 1), Header(epoch, 0, 5, 2)]
    for header in headers:
        chunk = b"\xc1 is never msgpack"
        data = frame(Kind.DATA, header, keys=keys, recipient="hq", incarnation=incarnation,
                     raw_length=len(chunk), compressed=compress(chunk), part=True)
        (world.inbox("hq") / str(MessageName("n1", "hq", Kind.DATA, header))).write_bytes(data)
    capsys.readouterr()
    assert main(["run", str(world.hq), "--once"]) == 0
    out = capsys.readouterr().out
    assert "quarantined 3," in out and "3 file(s) quarantined" in out
    assert len(read_quarantine(world.root / "hq.db.agent" / "quarantine")) == 3
