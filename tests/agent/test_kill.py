"""`run --once` killed with SIGKILL at random moments, then run again:
nothing lost, nothing applied twice."""

import asyncio
import os
import random
import signal
import subprocess
import sys

import pytest

from .world import World, random_rows

pytestmark = pytest.mark.timeout(600)

RUN_ONCE = ("import asyncio, sys\n"
            "from agent.runner import RunOptions, run_agent\n"
            "asyncio.run(run_agent(sys.argv[1], RunOptions(max_message_size=10_000), once=True))\n")


async def run_and_kill(database, delay: float) -> int | None:
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", RUN_ONCE, str(database),
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await asyncio.wait_for(process.wait(), timeout=delay)
    except asyncio.TimeoutError:
        try:
            process.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            await process.wait()  # it ended just as the time ran out: a whole run, checked below
        else:
            await process.wait()
            return None
    stderr = await process.stderr.read()
    assert process.returncode == 0, stderr.decode()[-2000:]
    return process.returncode


async def test_runs_killed_at_random_points_lose_and_double_nothing(tmp_path):
    world = World(tmp_path / "world")
    rng = random.Random(int(os.environ.get("FIELDSYNC_KILL_SEED", "7")))
    world.write("hq", *random_rows(rng, 30, ("f1", "f2")))
    world.extract_all()
    kills = 0
    next_id = 1000
    step = 0
    while kills < 10 and step < 120:
        step += 1
        site = rng.choice(["hq", "f1", "f2"])
        if rng.random() < 0.5:
            world.write(site, *[("INSERT INTO ledger VALUES (?, ?, ?)", (f"{site}-{next_id + i}", site, i))
                                for i in range(rng.randint(1, 40))])
            next_id += 100
        if site == "hq" and rng.random() < 0.5:
            world.write("hq", *random_rows(rng, rng.randint(1, 60), ("f1", "f2"), start=next_id))
            next_id += 100
        if await run_and_kill(world.db(site), rng.uniform(0.1, 0.6)) is None:
            kills += 1
        world.check_invariants()
    assert kills >= 10, "the test should kill runs mid-way"
    await world.settle(rounds=20)
