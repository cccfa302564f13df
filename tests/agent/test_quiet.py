"""No message without news (docs/protocol.md, rules 3, 5 and 8) with the
real agent on SQLite files and folder inboxes: an idle run writes nothing,
a change reaches only the peer it is for, and an idle peer kept alive by
heartbeats never holds the log back."""

import random

import pytest

from agent.runner import RunOptions
from agent.site import SiteDatabase

from .world import World, random_rows

pytestmark = pytest.mark.timeout(300)
DAY = 86400.0


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path / "world", options=RunOptions(heartbeat=DAY))
    world.write("hq", *random_rows(random.Random(1), 20, ("f1", "f2")))
    world.extract_all()
    return world


def inbox_counts(world: World) -> dict[str, int]:
    return {site: len(world.inbox_files(site)) for site in ("hq", *world.remotes)}


async def test_an_idle_run_writes_no_file(world):
    await world.settle()
    for site in ("hq", *world.remotes):
        for path in world.inbox_files(site):
            path.unlink()  # controls that settling left
    for site in ("hq", "f1", "f2", "hq"):
        report = await world.run(site)
        assert report.sent == 0 and report.ok, report
    assert inbox_counts(world) == {"hq": 0, "f1": 0, "f2": 0}


async def test_a_change_for_one_remote_writes_only_that_remotes_files(world):
    await world.settle()
    for site in ("hq", *world.remotes):
        for path in world.inbox_files(site):
            path.unlink()
    world.write("hq", ("INSERT INTO customer VALUES (9001, 'f1', 'new at hq', 1.0, x'00')", ()))
    report = await world.run("hq")
    assert report.sent == 1, report
    assert [len(world.inbox_files(site)) for site in ("f1", "f2")] == [1, 0]
    with SiteDatabase.open(world.db("hq")) as hq:
        f2 = hq.remote("f2")
        # f2 was not sent anything, yet the log was read for it and it holds nothing back.
        assert f2.read_through == hq.log_end() and f2.horizon == hq.log_end() and f2.log_sent < hq.log_end()
    await world.settle()
    assert world.rows("f1", "customer", "WHERE id = 9001")


@pytest.mark.slow
async def test_an_idle_remote_for_a_month_is_confirmed_by_heartbeats_and_the_log_truncated(tmp_path):
    """A month of hourly runs (virtual time) with a daily heartbeat; every
    other hour hq gets a change for f1 only.  f2 receives only heartbeats;
    the consolidated's log is truncated as it goes."""
    world = World(tmp_path / "w", options=RunOptions(heartbeat=DAY))
    world.write("hq", *random_rows(random.Random(3), 10, ("f1", "f2")))
    world.extract_all()
    await world.settle(rounds=4)
    f2_files = 0
    for step in range(30 * 24):
        world.clock += 3600 - 3 * 60  # three site runs a step, a minute each
        if step % 2 == 0:
            world.write("hq", ("INSERT INTO customer VALUES (?, 'f1', 'hourly', 1.0, x'00')", (100_000 + step,)))
        await world.run("hq")
        f2_files += len(world.inbox_files("f2"))
        await world.run("f1")
        await world.run("f2")
    with SiteDatabase.open(world.db("hq")) as hq:
        f2 = hq.remote("f2")
        end = hq.log_end()
        assert f2.log_sent < end - 100  # nothing was sent to f2 for a month...
        assert f2.horizon >= end - 10  # ...yet it does not hold the log back
        assert hq.log_start() >= end - 10  # and the log was truncated
    # About one heartbeat a day reached f2, nothing else.
    assert 25 <= f2_files <= 35, f2_files
    world.check_converged()
