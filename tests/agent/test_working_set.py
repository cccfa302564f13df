"""A batch run builds and steps only the pairs with work (agent.working_set):
each pair with something due is built (a heartbeat, a probe, a file of the
peer, a resend request, a gap waited out), and a pair with nothing due is
neither built nor saved, while the rules go on as before.

On real SQLite files and folder inboxes (tests/agent/world.py), with a
24 h heartbeat and a 1 h confirm timeout; hq's runs are made here so that
the agent's pairs can be looked at."""

from __future__ import annotations

import random

import pytest

from agent.keyfiles import agent_directory
from agent.runner import Agent, RunOptions

from .world import World, data_files, random_rows

HOUR = 3600.0
DAY = 24 * HOUR


@pytest.fixture
def world(tmp_path, monkeypatch):
    # Which subscribers a range concerns is looked up from the first one on
    # (a site of fewer than 16 reads for every subscriber without looking).
    monkeypatch.setattr("agent.site.reading.CONCERN_MIN_SUBSCRIBERS", 1)
    world = World(tmp_path / "world", remotes=("f1", "f2", "f3"),
                  options=RunOptions(heartbeat=DAY, confirm_timeout=HOUR))
    world.extract_all()
    return world


async def run(world: World, site: str = "hq") -> tuple[list[str], list[str]]:
    """One batch run of ``site``: the pairs it built, and those it saved."""
    world.clock += 60.0
    saved: list[str] = []
    async with Agent(world.db(site), world.run_options(site), clock=lambda: world.clock) as agent:
        save = agent.pairs.save

        def counting(peers):
            saved.extend(peer.name for peer in peers)
            save(peers)

        agent.pairs.save = counting  # type: ignore[method-assign]
        await agent.run_once()
        built = sorted(agent.peers)
    world.check_invariants()
    return built, sorted(set(saved))


async def quiet(world: World) -> None:
    """Every stream confirmed, and the last answers taken in: nothing is due."""
    await world.settle()
    for _ in range(2):
        await world.round()
    assert not any(world.inbox_files(site) for site in ("hq", *world.remotes))


def controls(world: World, site: str):
    return [path for path in world.inbox_files(site) if ".c." in path.name]


def log_end(world: World) -> int:
    with world.connect("hq") as conn:
        return conn.execute("SELECT max(commit_offset) FROM fieldsync_log").fetchone()[0]


async def test_a_quiet_fleet_builds_no_pair_and_saves_none(world):
    await quiet(world)
    before, _ = world.remote_rows("hq")
    assert await run(world) == ([], [])
    after, _ = world.remote_rows("hq")
    assert after == before and not any(world.inbox_files(site) for site in ("f1", "f2", "f3"))


async def test_a_change_for_one_remote_builds_that_pair_alone_and_moves_the_others_reads(world):
    await quiet(world)
    world.write("hq", *random_rows(random.Random(5), 3, ("f1",), start=5000))
    built, saved = await run(world)
    assert built == saved == ["f1"]
    assert data_files(world, "f1") and not world.inbox_files("f2") and not world.inbox_files("f3")
    rows, _ = world.remote_rows("hq")
    end = log_end(world)
    for name in ("f2", "f3"):  # read through in one statement: the range held nothing for them
        assert (rows[name].log_send, rows[name].log_read) == (end, end) and rows[name].log_sent < end
    await world.settle()
    world.check_converged()


async def test_every_pair_whose_heartbeat_is_due_is_built_and_sent_one(world):
    await quiet(world)
    world.clock += DAY
    built, _ = await run(world)
    assert built == ["f1", "f2", "f3"]
    assert all(len(controls(world, name)) == 1 for name in ("f1", "f2", "f3"))


async def test_a_pair_whose_probe_is_due_is_built_and_probed(world):
    await quiet(world)
    world.write("hq", *random_rows(random.Random(9), 2, ("f2",), start=3000))
    assert (await run(world))[0] == ["f2"]
    sent_at = world.clock
    await world.run("f2")  # applies and confirms; the confirmation is lost
    for path in controls(world, "hq"):
        path.unlink()
    assert (await run(world))[0] == []  # before the confirm timeout: nothing due
    world.clock = sent_at + HOUR
    assert (await run(world))[0] == ["f2"]
    [probe] = controls(world, "f2")
    await world.run("f2")
    await run(world)
    rows, _ = world.remote_rows("hq")
    assert rows["f2"].confirm_sent == rows["f2"].log_sent


async def test_a_pair_a_file_arrives_from_is_built(world):
    await quiet(world)
    world.write("f3", *random_rows(random.Random(3), 1, ("f3",), start=7000))
    await world.run("f3")
    built, _ = await run(world)
    assert built == ["f3"]
    assert world.rows("hq", "customer", "WHERE id = 7000")


async def test_a_gap_waited_out_is_polled_again_with_nothing_queued_and_a_resend_is_asked_for(world):
    """f1 learns from a probe that hq sent beyond what arrived (the data was
    lost): its next run, with nothing in its inbox and nothing queued,
    still builds the pair (its PEER.poll file), asks for a resend, and hq
    builds the pair the request comes from and resends."""
    await quiet(world)
    world.write("hq", *random_rows(random.Random(11), 4, ("f1",), start=4000))
    await run(world)
    sent_at = world.clock
    for path in world.inbox_files("f1"):
        path.unlink()  # the data is lost
    world.clock = sent_at + HOUR
    await run(world)  # the probe, carrying hq's log_sent
    assert controls(world, "f1")
    await world.run("f1")  # a gap: patience (1) starts
    assert (agent_directory(world.db("f1")) / "state" / "hq.poll").exists()
    assert not world.inbox_files("f1")
    built, _ = await run(world, "f1")
    assert built == ["hq"]
    [request] = controls(world, "hq")  # a resend request (its rereceive_count grew)
    built, _ = await run(world)
    assert "f1" in built
    rows, _ = world.remote_rows("hq")
    assert rows["f1"].resend_count >= 1
    await world.settle()
    assert len(world.rows("f1", "customer", "WHERE id >= 4000")) == 4
    assert not (agent_directory(world.db("f1")) / "state" / "hq.poll").exists()
    world.check_converged()


async def test_pairs_at_different_read_positions_are_each_read_through_the_range(world):
    """The database gives the reads due by group of equal positions: every
    group the range holds nothing for is moved, each from its own place."""
    await quiet(world)
    world.write("hq", *random_rows(random.Random(6), 3, ("f2",), start=6000))
    await run(world)  # f2 is sent its rows; f3's read moves past them, with nothing sent
    await quiet(world)
    rows, _ = world.remote_rows("hq")
    positions = {name: (rows[name].log_send, rows[name].log_sent, rows[name].log_read) for name in ("f2", "f3")}
    assert positions["f2"] != positions["f3"] and rows["f2"].log_read == rows["f3"].log_read
    world.write("hq", *random_rows(random.Random(7), 3, ("f1",), start=7000))
    built, _ = await run(world)
    assert built == ["f1"]
    rows, _ = world.remote_rows("hq")
    end = log_end(world)
    for name in ("f2", "f3"):
        assert (rows[name].log_send, rows[name].log_read) == (end, end), name
        assert rows[name].log_sent == positions[name][1]  # nothing sent
    await world.settle()
    world.check_converged()


def stored_rows(world: World, names: tuple[str, ...]) -> dict[str, tuple]:
    """hq's remote-user rows of ``names`` as stored, every column."""
    with world.connect("hq") as conn:
        return {row[0]: row for row in conn.execute(
            f"SELECT * FROM fieldsync_remote WHERE name IN ({', '.join('?' * len(names))})", names)}


async def test_the_pairs_a_range_holds_nothing_for_follow_the_common_read_position_unwritten(world):
    """A pair moved through a range that held nothing for it follows the
    common read position from then on: the next such range moves it with
    one write of the site row, its own row as it was, where the agent reads
    the positions a move of the row would have written.  The pair a change
    is for leaves it (its send moves its own positions), and rejoins it
    when a later range holds nothing for it."""
    await quiet(world)
    world.write("hq", *random_rows(random.Random(21), 3, ("f1",), start=8000))
    assert (await run(world))[0] == ["f1"]  # f2 and f3 join the common position at the log end
    await quiet(world)
    joined = stored_rows(world, ("f2", "f3"))
    with world.connect("hq") as conn:
        assert conn.execute("SELECT name FROM fieldsync_remote WHERE follows_common ORDER BY name").fetchall() == [
            ("f2",), ("f3",)]
    world.write("hq", *random_rows(random.Random(22), 3, ("f1",), start=9000))
    assert (await run(world))[0] == ["f1"]
    end = log_end(world)
    assert stored_rows(world, ("f2", "f3")) == joined  # not written
    with world.connect("hq") as conn:
        assert conn.execute("SELECT common_read FROM fieldsync_site").fetchone() == (end,)
        stored = dict(conn.execute("SELECT name, log_read FROM fieldsync_remote WHERE name IN ('f2', 'f3')"))
    rows, _ = world.remote_rows("hq")
    for name in ("f2", "f3"):
        assert (rows[name].log_send, rows[name].log_read) == (end, end) and stored[name] < end, name
        assert rows[name].log_sent == joined[name][2]  # nothing sent (the column after log_send)
    # A change for f2 alone: f2 leaves the common position, sends, and its row is its own.
    await quiet(world)
    world.write("hq", *random_rows(random.Random(23), 2, ("f2",), start=9500))
    assert (await run(world))[0] == ["f2"]
    with world.connect("hq") as conn:
        following = dict(conn.execute("SELECT name, follows_common FROM fieldsync_remote"))
    assert following == {"f1": 1, "f2": 0, "f3": 1}
    await world.settle()
    world.check_converged()
    assert len(world.rows("f2", "customer", "WHERE id >= 9500")) == 2


@pytest.mark.parametrize("seed", range(4))
async def test_pairs_joining_and_leaving_the_common_read_position_under_lost_files_and_crashes_converge(
        world, monkeypatch, seed):
    """Batch runs, each a new agent, with changes for one remote or two at
    a time: the others join the common read position and move with it,
    while the files of a remote are lost now and then (its gap is waited
    out and a resend sets the stream back) and hq's runs crash at random
    points; every site still ends with every row, each once."""
    from agent import crashpoints
    from agent.site.sqlite.database import SiteDatabase

    moves = {"joined": 0, "left": 0}
    move_reads = SiteDatabase.move_reads

    def counted(self, end, *, leave, join):  # type: ignore[no-untyped-def]
        moves["joined"] += len(join)
        moves["left"] += len(leave)
        move_reads(self, end, leave=leave, join=join)

    monkeypatch.setattr(SiteDatabase, "move_reads", counted)
    rng = random.Random(f"common-read:{seed}")
    remotes = ("f1", "f2", "f3")
    await quiet(world)
    for step in range(24):
        targets = tuple(rng.sample(remotes, rng.choice((1, 1, 1, 2))))
        world.write("hq", *random_rows(rng, rng.randint(1, 3), targets, start=20_000 + 10 * step))
        if rng.random() < 0.2:
            crashpoints.arm(rng.choice(crashpoints.POINTS), rng.randint(0, 3))
        try:
            await run(world)
        except crashpoints.Crash:
            pass
        finally:
            crashpoints.disarm()
        for remote in remotes:
            if rng.random() < 0.15:
                for path in world.inbox_files(remote):
                    path.unlink()  # lost
            if rng.random() < 0.5:
                world.clock += rng.choice((60.0, HOUR))
                await world.run(remote)
    await world.settle(rounds=20)
    world.check_converged()
    assert moves["joined"] > 0 and moves["left"] > 0, moves
    for remote in remotes:
        assert len(world.rows(remote, "customer", "WHERE id >= 20000")) == len(
            world.rows("hq", "customer", "WHERE id >= 20000 AND region = ?", (remote,))), remote


async def test_a_follower_a_range_concerns_keeps_its_range_when_the_run_dies_before_it_sends(world, monkeypatch):
    """f2 follows the common read position when a change for it comes; the
    run moves the position past the change and dies while packing, before
    f2's send moved anything of its own: f2 left the position before it
    moved, so the next run still reads the change for it."""
    from agent import crashpoints, preparing

    await quiet(world)
    world.write("hq", *random_rows(random.Random(31), 2, ("f1",), start=30_000))
    await run(world)  # f2 and f3 join the common read position
    await quiet(world)
    world.write("hq", *random_rows(random.Random(32), 3, ("f2",), start=31_000))
    pack = preparing.pack_due_sends

    def dies(*args, **options):  # type: ignore[no-untyped-def]
        raise crashpoints.Crash("packing")

    monkeypatch.setattr(preparing, "pack_due_sends", dies)
    with pytest.raises(crashpoints.Crash):
        await run(world)
    monkeypatch.setattr(preparing, "pack_due_sends", pack)
    with world.connect("hq") as conn:
        assert conn.execute("SELECT follows_common FROM fieldsync_remote WHERE name = 'f2'").fetchone() == (0,)
        assert conn.execute("SELECT common_read FROM fieldsync_site").fetchone() == (log_end(world),)
    await world.settle()
    world.check_converged()
    assert len(world.rows("f2", "customer", "WHERE id >= 31000")) == 3
