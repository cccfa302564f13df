"""What a hostile inbox costs one batch run (docs/security.md, "Limits").

Workload: the README's world (a consolidated ``hq`` with remotes ``n1`` and
``n2``, folder inboxes), and in hq's inbox

* ``junk``: 10,000 files of 4 bytes, each different, named as data messages
  of the known peer n1 (every one fails its checks and is quarantined);
* ``oversize``: one 200 MB sparse file under a message name of n1 (never
  read: it is over the 16 MiB limit).

Each figure is measured on ``agent run hq.db --once`` in a process of its
own (peak RSS from ``wait4``), the median of ``--rounds`` runs, each on a
fresh world.  Baselines, measured in the same run:

* for ``junk``, the floor of the work: a process that lists the same files,
  reads each one and deletes it (no checks, no quarantine);
* for ``oversize``, the same run with an empty inbox.

Targets (the security issue): junk run at most 10 s, the quarantine within
its cap; the oversize run's peak RSS under 100 MB.
Run: ``python -m benchmarks.hostile_inbox --json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from codec.header import Header
from codec.names import Kind, MessageName

JUNK_FILES = 10_000
OVERSIZE_BYTES = 200 * 1000 * 1000

_FLOOR = """
import os, sys
folder = sys.argv[1]
for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    with open(path, "rb") as handle:
        handle.read()
    os.unlink(path)
"""


def build_world(root: Path) -> Path:
    """hq, n1 and n2 as tests/cli/conftest.py makes them; returns hq's database."""
    from agent.cli import main
    from tests.cli.conftest import make_world

    def agent(*arguments: object) -> object:
        class Result:
            code = main([str(argument) for argument in arguments])
        return Result

    with contextlib.redirect_stdout(io.StringIO()):
        world = make_world(root, agent)  # type: ignore[arg-type]
    return world.hq


def junk_names(count: int) -> list[str]:
    return [str(MessageName("n1", "hq", Kind.DATA, Header(0, number, number + 1, 0))) for number in range(count)]


def timed_process(command: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of a child process that must succeed.  It
    is started from a small parent (tests.security.sites): a child forked
    from this process would report this process's size as its own peak."""
    from tests.security.sites import _MEASURE

    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    peak_kib, code = completed.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}): {completed.stderr[-2000:]}")
    return elapsed, int(peak_kib) / 1024


def run_agent(database: Path) -> tuple[float, float]:
    return timed_process([sys.executable, "-c", "from agent.cli import main; main()", "run", str(database), "--once"])


def one_round(rounds_root: Path, number: int, junk_files: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    root = rounds_root / f"junk-{number}"
    root.mkdir()
    database = build_world(root)
    inbox = root / "inbox" / "hq"
    names = junk_names(junk_files)
    floor = root / "floor"
    floor.mkdir()
    for index, name in enumerate(names):
        (inbox / name).write_bytes(index.to_bytes(4, "big"))
        (floor / name).write_bytes(index.to_bytes(4, "big"))
    figures["floor_s"], _ = timed_process([sys.executable, "-c", _FLOOR, str(floor)])
    figures["junk_s"], figures["junk_rss_mb"] = run_agent(database)
    quarantine = root / "hq.db.agent" / "quarantine"
    figures["quarantine_files"] = len([path for path in quarantine.iterdir() if not path.name.endswith(".json")])
    figures["left_in_inbox"] = len(list(inbox.iterdir()))

    root = rounds_root / f"oversize-{number}"
    root.mkdir()
    database = build_world(root)
    inbox = root / "inbox" / "hq"
    figures["idle_rss_mb"] = run_agent(database)[1]
    with open(inbox / names[0], "wb") as handle:
        handle.truncate(OVERSIZE_BYTES)
    figures["oversize_s"], figures["oversize_rss_mb"] = run_agent(database)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile_inbox", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh worlds measured; medians reported (3)")
    parser.add_argument("--junk-files", type=int, default=JUNK_FILES, help=f"junk files in the inbox ({JUNK_FILES})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    arguments = parser.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="fieldsync-hostile-") as temporary:
        for number in range(arguments.rounds):
            rounds.append(one_round(Path(temporary), number, arguments.junk_files))

    def median(key: str) -> float:
        return round(statistics.median(figures[key] for figures in rounds), 3)

    result = {
        "junk_files": arguments.junk_files,
        "junk_run_s": median("junk_s"),
        "junk_baseline_read_and_delete_s": median("floor_s"),
        "junk_ratio": round(median("junk_s") / max(median("floor_s"), 1e-9), 2),
        "junk_target_s": 10.0,
        "junk_peak_rss_mb": median("junk_rss_mb"),
        "quarantine_files_kept": median("quarantine_files"),
        "junk_left_in_inbox": median("left_in_inbox"),
        "oversize_bytes": OVERSIZE_BYTES,
        "oversize_run_s": median("oversize_s"),
        "oversize_peak_rss_mb": median("oversize_rss_mb"),
        "oversize_baseline_idle_rss_mb": median("idle_rss_mb"),
        "oversize_rss_ratio": round(median("oversize_rss_mb") / max(median("idle_rss_mb"), 1e-9), 2),
        "oversize_target_rss_mb": 100.0,
        "rounds": arguments.rounds,
    }
    if arguments.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:40} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
