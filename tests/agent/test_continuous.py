"""Continuous mode: agents polling on their own, schedules, clean shutdown."""

import asyncio
import contextlib
import logging
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from agent.keyfiles import agent_directory
from agent.runner import Agent, Problems, RunOptions
from agent.schedule import TruncationSchedule
from agent.site import SiteDatabase
from agent.site.sqlite.log import HORIZON_SQL
from agent.spool._summary import SummaryStale, read_summary

from .world import World, random_rows

pytestmark = pytest.mark.timeout(120)

FAST = RunOptions(receive_delay=0.05, send_delay=0.05, heartbeat=0.1)


async def test_continuous_agents_replicate_until_stopped(tmp_path):
    world = World(tmp_path / "w", remotes=("f1",), options=FAST)
    world.write("hq", *random_rows(random.Random(1), 10, ("f1",)))
    world.extract_all()
    stop = asyncio.Event()
    async with Agent(world.db("hq"), FAST, batch=False) as hq, Agent(world.db("f1"), FAST, batch=False) as f1:
        tasks = [asyncio.create_task(hq.run_forever(stop)), asyncio.create_task(f1.run_forever(stop))]
        world.write("hq", *random_rows(random.Random(2), 25, ("f1",), start=100))
        world.write("f1", ("INSERT INTO ledger VALUES ('f1-1', 'f1', 5)", ()))
        deadline = time.monotonic() + 30

        def done() -> bool:
            return (world.quiescent() and len(world.rows("f1", "customer")) == 35
                    and world.rows("hq", "ledger") != [])

        while time.monotonic() < deadline and not done():
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
    assert world.quiescent()
    world.check_converged()
    assert world.rows("hq", "ledger") == [("f1-1", "f1", 5)]


async def test_send_every_holds_sends_back_until_due(tmp_path):
    world = World(tmp_path / "w", remotes=("f1",), options=FAST)
    world.extract_all()
    with SiteDatabase.open(world.db("hq")) as hq:
        hq.update_remote("f1", send_every=3600)
    stop = asyncio.Event()
    async with Agent(world.db("hq"), FAST, batch=False) as hq:
        task = asyncio.create_task(hq.run_forever(stop))
        await asyncio.sleep(0.3)  # the first cycle sends (nothing sent before)
        world.write("hq", *random_rows(random.Random(3), 5, ("f1",), start=500))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    with SiteDatabase.open(world.db("hq")) as hq:
        row = hq.remote("f1")
        assert row.log_sent < hq.log_end(), "the hourly schedule should hold the new rows back"


def test_sigterm_stops_a_continuous_run_cleanly(tmp_path):
    world = World(tmp_path / "w", remotes=("f1",))
    world.extract_all()
    world.write("hq", *random_rows(random.Random(4), 5, ("f1",), start=900))
    process = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", str(world.db("hq")),
                                "--receive-delay", "0.1", "--send-delay", "0.1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(".d." in p.name for p in world.inbox("f1").iterdir()):
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert any(".d." in p.name for p in world.inbox("f1").iterdir())


def test_a_continuous_run_lists_each_problem_once_when_stopped(tmp_path):
    """A peer unreachable at every cycle: the run's report keeps the problem
    once with its count (it must not grow with the cycles), the stop lists
    it on one line, and a run stopped by a signal exits 0."""
    world = World(tmp_path / "w", remotes=("f1",))
    world.extract_all()
    world.write("hq", *random_rows(random.Random(5), 3, ("f1",), start=950))
    world.inbox("f1").rmdir()  # the peer's share is not mounted
    process = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", str(world.db("hq")),
                                "--receive-delay", "0.05", "--send-delay", "0.05"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # many cycles
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    listed = [line for line in err.splitlines() if line.startswith("agent: transport error: sending to f1")]
    assert len(listed) == 1, err
    times = int(listed[0].rpartition("(")[2].split()[0])
    assert times > 3, listed
    # ... while the log had it at each cycle, as it happened.
    assert sum("sending to f1" in line and "WARNING" in line for line in err.splitlines()) == times


def test_a_runs_problems_are_kept_once_each_and_bounded():
    problems = Problems()
    for cycle in range(1000):
        problems.append("sending to f1: unreachable")
        problems.append(f"receiving: odd problem {cycle % 150}")
    assert problems[:2] == ["sending to f1: unreachable", "receiving: odd problem 0"]
    assert len(problems) == Problems.LIMIT and problems.counts["sending to f1: unreachable"] == 1000
    assert problems.counts["receiving: odd problem 0"] == 7  # cycles 0, 150, ..., 900
    assert problems.not_kept == sum(1 for cycle in range(1000) if cycle % 150 >= Problems.LIMIT - 1)


async def test_a_file_not_for_the_site_is_left_and_logged_once(tmp_path):
    """Polled again and again, a foreign file stays in the inbox and gets one
    warning, not one per poll."""
    world = World(tmp_path / "w", remotes=("f1",), options=FAST)
    world.extract_all()
    stray = world.inbox("hq") / "holiday-photo.jpg"
    stray.write_bytes(b"\xff\xd8 not a message")
    stop = asyncio.Event()
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("fieldsync.agent")
    logger.addHandler(handler)
    try:
        async with Agent(world.db("hq"), FAST, batch=False) as hq:
            task = asyncio.create_task(hq.run_forever(stop))
            await asyncio.sleep(0.6)  # about a dozen polls
            stop.set()
            await asyncio.wait_for(task, timeout=10)
            assert hq.report.left_in_inbox == 1
    finally:
        logger.removeHandler(handler)
    assert stray.read_bytes() == b"\xff\xd8 not a message"
    assert len([record for record in records if "holiday-photo.jpg" in record.getMessage()]) == 1


async def test_a_continuous_consolidated_truncates_its_log_as_peers_confirm(tmp_path):
    """Rule 8 in continuous mode: while hq writes and f1 confirms, hq's log
    is cut at the horizon as it moves (here at most every 0.2 s instead of
    every 10 s), and at rest holds at most 2 entries at or below it."""
    world = World(tmp_path / "w", remotes=("f1",), options=FAST)
    world.extract_all()
    stop = asyncio.Event()
    cuts = []
    async with Agent(world.db("hq"), FAST, batch=False) as hq, Agent(world.db("f1"), FAST, batch=False) as f1:
        hq._truncation = TruncationSchedule(every=0.2)
        tasks = [asyncio.create_task(hq.run_forever(stop)), asyncio.create_task(f1.run_forever(stop))]
        for batch in range(12):
            world.write("hq", *random_rows(random.Random(40 + batch), 5, ("f1",), start=2000 + 10 * batch))
            await asyncio.sleep(0.15)
            with SiteDatabase.open(world.db("hq")) as db:
                cuts.append(db.log_start())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (world.quiescent() and _stale_entries(world) <= 2):
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
    assert world.quiescent()
    world.check_converged()
    assert len(set(cuts)) > 2, f"the log was cut only at {sorted(set(cuts))} while f1 confirmed"
    assert _stale_entries(world) <= 2


def _stale_entries(world: World) -> int:
    """Log entries at or below the smallest horizon of hq's peers."""
    conn = sqlite3.connect(world.db("hq"))
    try:
        return conn.execute(f"SELECT count(*) FROM fieldsync_log WHERE commit_offset <= "
                            f"(SELECT min({HORIZON_SQL}) FROM fieldsync_remote)").fetchone()[0]
    finally:
        conn.close()


async def test_a_waiting_agent_leaves_its_spool_summary_current(tmp_path):
    """Between polls `agent status` reads the spool's summary, not its log:
    a continuous f1 that applied hq's messages has, while it waits, a
    summary of its spool as it is (nothing queued, no dequeue in doubt)."""
    world = World(tmp_path / "w", remotes=("f1",), options=FAST)
    world.extract_all()
    world.write("hq", *random_rows(random.Random(6), 20, ("f1",), start=3000))
    async with Agent(world.db("hq"), FAST) as hq:
        await hq.run_once()
    stop = asyncio.Event()
    summary = None
    async with Agent(world.db("f1"), FAST, batch=False) as f1:
        task = asyncio.create_task(f1.run_forever(stop))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and summary is None:
            await asyncio.sleep(0.02)
            if world.rows("f1", "customer") == world.rows("hq", "customer"):
                with contextlib.suppress(SummaryStale):  # read in the middle of a poll
                    summary = read_summary(agent_directory(world.db("f1")) / "spool")
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert summary is not None, "the summary was never current while f1 waited"
    assert (summary.messages, summary.in_doubt) == (0, 0)
