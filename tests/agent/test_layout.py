"""The agent's shape, as docs/protocol.md and issue-sized rules state it:
the runner is a thin adapter, the queue interface is declared (never
probed), and the agent core reads time only through its injected clock."""

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
