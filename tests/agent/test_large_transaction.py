"""One application transaction of 200,000 rows, never scanned before the
run: it travels as one log transaction in many parts, and applies whole
or not at all, however the receiving run is killed (SIGKILL at random
moments), in memory that does not follow its size."""

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from agent.runner import Agent, RunOptions
from agent.site import SiteDatabase
from benchmarks.e2e import make_sites

pytestmark = pytest.mark.timeout(600)

ROWS = 200_000
RUN_ONCE = ("import asyncio, resource, sys\n"
            "from agent.runner import RunOptions, run_agent\n"
            "asyncio.run(run_agent(sys.argv[1], RunOptions(address=(sys.argv[2:] or [None])[0]), once=True))\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
# Linux carries a process's peak RSS across exec, and a fork starts with its
# parent's pages: the measured run is the grandchild of a small launcher, so
# its ru_maxrss is its own, not this test process's.
LAUNCHER = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
# The receiver held the transaction whole before: about 230 MB at 200,000
# rows (0.9 KB an operation); an agent run holds about 45 MB at rest.
RECEIVER_PEAK_MB = 110


def make_world(root):
    """The consolidated and its remote (the e2e benchmark's sites), and one
    application transaction of ROWS rows, never scanned."""
    make_sites(root)
    app = sqlite3.connect(root / "hq.db", isolation_level=None)
    app.execute("BEGIN")
    app.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?)",
                    ((i, f"name {i}", ("Lyon", "Porto", "Quito")[i % 3], i / 7, i % 300, None)
                     for i in range(1, ROWS + 1)))
    app.execute("COMMIT")
    app.close()


def state(root, name="r1.db"):
    """(rows at r1, r1's log_received for hq)."""
    with contextlib.closing(sqlite3.connect(root / name)) as conn:
        rows = conn.execute("SELECT count(*) FROM customer").fetchone()[0]
        received = conn.execute("SELECT log_received FROM fieldsync_remote WHERE name = 'hq'").fetchone()[0]
    return rows, received


async def run_killed(database, delay):
    """Run ``run --once`` of ``database``; SIGKILL it after ``delay`` seconds.
    True when it was killed, False when it ended first."""
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", RUN_ONCE, str(database),
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await asyncio.wait_for(process.wait(), timeout=delay)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
            await process.wait()
            return True
        await process.wait()
    stderr = await process.stderr.read()
    assert process.returncode == 0, stderr.decode()[-2000:]
    return False


async def test_a_200000_row_transaction_applies_whole_or_not_at_all_in_bounded_memory(tmp_path):
    root = tmp_path / "world"
    make_world(root)
    async with Agent(root / "hq.db", RunOptions()) as agent:
        assert (await agent.run_once()).ok
    with SiteDatabase.open(root / "hq.db") as hq:
        commit = hq.log_end()
        assert hq.connection.execute("SELECT count(*) FROM fieldsync_log").fetchone()[0] == 1  # one log transaction
    parts = sorted(path.name for path in (root / "inbox" / "r1").iterdir() if ".d." in path.name)
    assert len(parts) > 20 and parts[-1].endswith(f"{commit:019d}-{len(parts) - 1:010d}.fsm"), parts[-3:]

    # A copy of the receiver and its inbox, for a run measured from start to end.
    measured = tmp_path / "measured"
    measured.mkdir()
    shutil.copy(root / "r1.db", measured / "r1.db")
    shutil.copytree(root / "r1.db.agent", measured / "r1.db.agent")  # its keys
    shutil.copytree(root / "inbox" / "r1", measured / "inbox")
    started = time.monotonic()
    output = subprocess.run([sys.executable, "-c", LAUNCHER, sys.executable, "-c", RUN_ONCE, str(measured / "r1.db"),
                             str(measured / "inbox")], capture_output=True, text=True)
    whole_run = time.monotonic() - started
    assert output.returncode == 0, output.stderr[-2000:]
    peak_mb = int(output.stdout.strip().splitlines()[-1]) / 1024
    assert state(measured) == (ROWS, commit)
    assert peak_mb < RECEIVER_PEAK_MB, f"the receiver's peak RSS was {peak_mb:.0f} MB"

    rng = random.Random(int(os.environ.get("FIELDSYNC_KILL_SEED", "21")))
    kills = 0
    for _ in range(6):
        # At a random moment of a run as long as the measured one: from the
        # start of the apply (after the imports and the open) to its end.
        killed = await run_killed(root / "r1.db", rng.uniform(0.3, 0.95) * whole_run)
        rows, received = state(root)
        assert (rows, received) in {(0, 0), (ROWS, commit)}, f"a part of the transaction applied: {rows} rows"
        kills += killed
        if not killed:
            break
    assert kills >= 1, "the test should kill a run"
    assert not await run_killed(root / "r1.db", 300)
    assert state(root) == (ROWS, commit)
    with contextlib.closing(sqlite3.connect(root / "hq.db")) as conn:
        conn.execute("ATTACH DATABASE ? AS r1", (str(root / "r1.db"),))
        assert conn.execute("SELECT count(*) FROM (SELECT * FROM main.customer EXCEPT SELECT * FROM r1.customer)"
                            ).fetchone()[0] == 0
