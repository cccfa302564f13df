"""The agent's shape, as docs/protocol.md and issue-sized rules state it:
the runner is a thin adapter and its hops are small, the queue interface
is declared (never probed), and the agent reads time only through its
injected clock: no direct clock read in its modules, and every time a run
records comes from that clock."""

from __future__ import annotations

import re
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
# The agent core: the runner and the modules of each hop.  (The Spark
# engine's job timeouts and the CLI's progress are not protocol time.)
CORE = sorted(AGENT.glob("*.py"))
CLOCK_READS = re.compile(r"time\.time\(\)|time\.monotonic\(\)|perf_counter\(\)|datetime\.now\(|datetime\.utcnow\(|"
                         r"date\.today\(|utc_now\(|\.time\(\)")


def test_the_runner_is_a_thin_adapter() -> None:
    lines = (AGENT / "runner.py").read_text().count("\n")
    assert lines <= 500, f"agent/runner.py has {lines} lines"


def test_the_runner_and_its_hops_fit_in_a_thousand_lines() -> None:
    """The decisions live in the core and a hop takes what it uses and hands
    back what happened (issue 31): what is left to carry out is short."""
    files = ("runner.py", "receiving.py", "applying.py", "sending.py", "pairs.py")
    lines = {name: (AGENT / name).read_text().count("\n") for name in files}
    assert sum(lines.values()) <= 1000, lines


def test_no_module_is_over_six_hundred_lines() -> None:
    """One rule per module (docs/protocol.md, "Layers"; issue 31): none of
    the packages' modules grows past 600 lines."""
    root = AGENT.parent
    long = {str(path.relative_to(root)): count for folder in ("agent", "codec", "transports", "contrib")
            for path in sorted((root / folder).rglob("*.py"))
            if (count := path.read_text(encoding="utf-8").count("\n")) > 600}
    assert not long, long


def test_the_queue_interface_is_not_probed() -> None:
    for path in CORE:
        text = path.read_text()
        assert not re.search(r"getattr\([^)]*queues", text), f"{path.name} probes the queues with getattr"


def test_the_agent_core_reads_time_only_through_its_clock() -> None:
    found = []
    for path in CORE:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if CLOCK_READS.search(code):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "direct clock reads:\n" + "\n".join(found)


def test_the_check_finds_a_direct_clock_read() -> None:
    assert CLOCK_READS.search("wall = datetime.now().astimezone()")
    assert CLOCK_READS.search("next_send = loop.time()")
    assert not CLOCK_READS.search("clock: Callable[[], float] = time.time,")


# -- one clock, at run time --------------------------------------------------------------

# 2001-09-09: a time read from anything but the agent's clock during a run stands out.
FAKE_TIME = 1_000_000_000.0
# Columns the agent's runs write (created_at, replaced_at: written by setup, outside a run).
RUN_TIMES = {"fieldsync_remote": ("last_sent_at", "last_received_at", "last_error_at", "error_seen_at",
                                  "stream_stopped_at", "control_sent_at", "heard_at", "data_sent_at"),
             "fieldsync_conflict": ("at",), "fieldsync_apply_error": ("at", "acknowledged_at")}


def _refuse_other_clocks(monkeypatch) -> None:
    """Every module's ``utc_now`` (the site library's default for callers
    outside a run) fails the run that reaches it."""
    import sys

    from agent.site import clock

    def refused():  # type: ignore[no-untyped-def]
        raise AssertionError("utc_now() reached during an agent's run: pass the agent's clock (now=...)")

    original = clock.utc_now
    for module in list(sys.modules.values()):
        if getattr(module, "utc_now", None) is original:
            monkeypatch.setattr(module, "utc_now", refused)


def _stored_times(world, sites) -> list[tuple[str, str, float]]:
    """(site, what, seconds) of every time stored by a run: a column of
    RUN_TIMES, or ``quarantine`` for a file set aside."""
    import sqlite3
    from datetime import datetime

    from agent.quarantine import read_quarantine

    found = []
    for site in sites:
        conn = sqlite3.connect(world.db(site))
        try:
            for table, columns in RUN_TIMES.items():
                for column in columns:
                    for (value,) in conn.execute(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL"):
                        seconds = value if isinstance(value, float) else datetime.fromisoformat(value).timestamp()
                        found.append((site, column, seconds))
        finally:
            conn.close()
        for entry in read_quarantine(world.root / f"{site}.db.agent" / "quarantine"):
            assert entry.at is not None
            found.append((site, "quarantine", entry.at.timestamp()))
    return found


async def test_every_time_a_run_records_is_the_agents_clocks(tmp_path, monkeypatch) -> None:
    """Agents on a clock far from real time: every time their runs wrote
    to the site databases and the quarantine (data applied, data sent,
    heard from, a conflict, a transport error, a stopped stream, a file
    set aside) is one the clock gave, and none came from elsewhere."""
    import random

    from agent.site import SiteDatabase

    from .world import World, data_files, random_rows

    world = World(tmp_path / "w", clock=FAKE_TIME)
    world.write("hq", *random_rows(random.Random(1), 10, ("f1", "f2")),
                ("INSERT INTO product VALUES ('jam', 1, 'plum jam', 3.0)", ()))
    world.extract_all()
    backup = world.db("f1").read_bytes()
    _refuse_other_clocks(monkeypatch)
    await world.settle()
    world.write("f1", ("UPDATE product SET price = 3.5 WHERE sku = 'jam'", ()))
    world.write("f2", ("UPDATE product SET price = 2.5 WHERE sku = 'jam'", ()))
    await world.settle()  # a conflict at hq
    world.write("hq", *random_rows(random.Random(2), 3, ("f1",), start=500))
    await world.run("hq")
    [sent] = data_files(world, "f1")
    sent.write_bytes(sent.read_bytes()[:-7])  # torn: set aside at f1
    await world.run("f1")
    with SiteDatabase.open(world.db("hq")) as hq:
        hq.update_remote("f2", address=str(tmp_path / "gone" / "f2"))  # hq cannot reach f2 now
    world.write("hq", *random_rows(random.Random(3), 3, ("f2",), start=600))
    await world.run("hq")
    world.db("f1").write_bytes(backup)  # f1 restored from an old copy: hq stops its stream
    for suffix in ("-wal", "-shm"):
        world.db("f1").with_name(f"f1.db{suffix}").unlink(missing_ok=True)
    await world.run("f1")
    report = await world.run("hq")
    assert report.stopped_streams and report.transport_errors
    times = _stored_times(world, ("hq", "f1", "f2"))
    assert {what for _, what, _ in times} >= {"last_sent_at", "last_received_at", "last_error_at", "error_seen_at",
                                              "stream_stopped_at", "control_sent_at", "heard_at", "data_sent_at", "at",
                                              "quarantine"}
    # What the spool queued (hq's files for f2, which it cannot reach) is stamped by the agent's clock too.
    from agent.spool import check_spool

    queued = [(queue.queue, queue.oldest_enqueued_at) for queue in check_spool(
        world.root / "hq.db.agent" / "spool").queues if queue.oldest_enqueued_at is not None]
    assert queued
    times += [("hq", f"spool {name}", seconds) for name, seconds in queued]
    strays = [(site, what, seconds) for site, what, seconds in times if not FAKE_TIME < seconds <= world.clock]
    assert not strays, f"times not from the agents' clock (it read {FAKE_TIME:.0f}..{world.clock:.0f}): {strays}"
