"""Fleet operations at one consolidated: N remotes over the folder transport.

Setup, for each N: a consolidated ``hq`` with one published table,
``reading`` (2 rows per remote), partitioned by its SUBSCRIBE BY column
``region`` (indexed), and a fleet file of N remotes ``r00000``... each
subscribed to its own region, with a folder inbox each.  Real SQLite files
in a temporary folder; every command runs in this process through
:func:`agent.cli.main` (after the interpreter has started: the command is
timed, not the interpreter's start).

* ``bulk_add_s``: ``agent remote add hq.db --from fleet.csv``.
* ``bulk_extract_s``: ``agent extract hq.db --from subset.txt --into
  FOLDER`` of the first ``bulk_extract_n`` remotes (at most
  ``--extract``, 100 by default: extraction writes a database, a key file
  and their fsyncs per remote, so all of 10,000 would dominate the run);
  ``bulk_extract_ms_per_remote`` is its time per remote.
* ``status_s``: ``agent status hq.db --json`` (to /dev/null), the median
  of ``--repeat`` calls (``status_runs_s`` each); ``status_after_runs_s``
  the same after the runs below filled the spool's history.
* The runs, ``agent run hq.db --once``, after one warm-up run (the first
  run of a new fleet sends each remote its first message): ``idle_s``
  with nothing changed; ``one_change_s`` after one row of one remote's
  region changed; ``all_change_s`` after every row changed in one
  transaction (``all_change_ms_per_remote`` = its time per remote).  The
  ``*_files`` figures count the files that appeared in the remotes' inbox
  folders during that run (the remotes never run, so nothing is taken
  away).
* ``process_idle_s``: ``agent run hq.db --once`` with nothing changed as
  a process of its own (``agent.cli.main`` as ``python -m agent.cli``
  runs it), interpreter start and imports included: what a systemd timer
  pays each time it fires; ``process_idle_rss_mb`` is that process's peak
  resident memory (its own VmHWM: a child's rusage would count this
  benchmark's memory from before the exec).  The
  median of ``--repeat`` such runs.  ``process_idle_written_kb`` and
  ``process_one_change_written_kb`` (the latter after one row of one
  remote's region changed): what such a process wrote to storage (its
  ``write_bytes`` in ``/proc/self/io``: the database, its WAL, the spool
  and the files), the medians; a run's writes follow its work, not the
  fleet (docs/protocol.md, "The common read position").
* ``baseline_write_n_files_s``: N times write a small file, fsync it and
  ``os.replace`` it into a folder, the least a run that writes one file
  per remote costs; ``all_change_vs_baseline`` is ``all_change_s`` over it.
* Each kind of run is repeated ``--repeat`` times (3): the figures are the
  medians, ``*_runs_s`` every run, ``*_files`` the most files one run wrote.

Run: ``python -m benchmarks.fleet --json [--sizes 100,1000,10000]``.
Output: ``{"benchmark": "fleet", "by_n": {"100": {...}, ...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.admin import init_site
from benchmarks.common import agent_command, run_figures, timed_run

ROWS_PER_REMOTE = 2


def region(number: int) -> str:
    """The region (SUBSCRIBE BY value) of remote number ``number``, which is also its name."""
    return f"r{number:05d}"


def write_fleet(root: Path, count: int) -> Path:
    """The fleet file of ``count`` remotes, each with its inbox folder
    under ``root/inbox`` and subscribed to its own region of ``territory``."""
    fleet = root / "fleet.csv"
    lines = ["name,address,subscribe"]
    for number in range(count):
        name = region(number)
        (root / "inbox" / name).mkdir()
        lines.append(f"{name},{root / 'inbox' / name},territory={name}")
    fleet.write_text("\n".join(lines) + "\n")
    return fleet


def make_consolidated(root: Path, count: int) -> tuple[Path, Path]:
    """hq.db with the published, partitioned table, and the fleet file."""
    (root / "inbox" / "hq").mkdir(parents=True)
    hq = root / "hq.db"
    site = init_site(hq, name="hq", role="consolidated", address=str(root / "inbox" / "hq"), transport="folder")
    site.connection.execute("CREATE TABLE reading (id INTEGER PRIMARY KEY, region TEXT NOT NULL, value REAL)")
    site.connection.execute("CREATE INDEX reading_region ON reading (region)")
    with site.connection:
        site.connection.execute("BEGIN")
        site.connection.executemany("INSERT INTO reading (region, value) VALUES (?, ?)",
                                    [(region(number), 0.0) for number in range(count)
                                     for _ in range(ROWS_PER_REMOTE)])
    site.close()
    agent_command("publication", "create", hq, "territory", "reading@region")
    return hq, write_fleet(root, count)


def change(hq: Path, where: str) -> None:
    conn = sqlite3.connect(hq, isolation_level=None)
    try:
        conn.execute(f"UPDATE reading SET value = value + 1 {where}")
    finally:
        conn.close()


def status_figures(kind: str, hq: Path, repeats: int) -> dict:
    """``agent status HQ --json`` ``repeats`` times: the median as
    ``{kind}_s``, every call as ``{kind}_runs_s``."""
    seconds = [round(agent_command("status", hq, "--json"), 3) for _ in range(repeats)]
    return {f"{kind}_s": statistics.median(seconds), f"{kind}_runs_s": seconds}


def baseline_write_files(folder: Path, count: int) -> float:
    """``count`` small files each written, fsynced and renamed into place."""
    folder.mkdir()
    payload = b"x" * 300
    started = time.perf_counter()
    for number in range(count):
        temporary = folder / f".{number}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(descriptor, payload)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, folder / f"{number}.msg")
    return time.perf_counter() - started


# The child: ``agent`` as ``python -m agent.cli`` runs it, then its own peak
# resident memory (VmHWM of its own address space: the rusage of a child
# counts the parent's memory from before its exec).
_CHILD = ("import sys\nfrom agent.cli import main\ntry:\n    code = main(sys.argv[1:])\nfinally:\n"
          "    peak = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')]\n"
          "    written = [line.split()[1] for line in open('/proc/self/io') if line.startswith('write_bytes')]\n"
          "    print('vmhwm-kib', *peak, *written, file=sys.stderr)\nsys.exit(code)\n")


def process_run(hq: Path) -> tuple[float, float, float]:
    """``agent run HQ --once`` as a process of its own: its seconds, start
    included, its peak resident memory in MB and the KB it wrote to storage."""
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-c", _CHILD, "run", str(hq), "--once"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    elapsed = time.perf_counter() - started
    *lines, last = completed.stderr.strip().splitlines() or [""]
    if completed.returncode != 0 or not last.startswith("vmhwm-kib "):
        raise SystemExit(f"agent run {hq} --once: exit {completed.returncode}: {completed.stderr.strip()}")
    _, peak, written = last.split()
    return elapsed, int(peak) / 1024, int(written) / 1024


def measure(count: int, extract_at_most: int, repeats: int = 3) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="fieldsync-fleet-"))
    try:
        root = workdir / "fleet"
        root.mkdir()
        hq, fleet = make_consolidated(root, count)
        result: dict = {"remotes": count}
        result["bulk_add_s"] = round(agent_command("remote", "add", hq, "--from", fleet), 3)
        subset = root / "subset.txt"
        extracted = min(count, extract_at_most)
        subset.write_text("".join(f"{region(number)}\n" for number in range(extracted)))
        (root / "extracted").mkdir()
        seconds = agent_command("extract", hq, "--from", subset, "--into", root / "extracted")
        result.update({"bulk_extract_s": round(seconds, 3), "bulk_extract_n": extracted,
                       "bulk_extract_ms_per_remote": round(seconds * 1000 / extracted, 2)})
        result.update(status_figures("status", hq, repeats))
        timed_run(root, hq)  # warm-up: each remote's first message (a heartbeat: first contact)
        runs: dict[str, list[tuple[float, int]]] = {"idle": [], "one_change": [], "all_change": []}
        for repeat in range(repeats):
            runs["idle"].append(timed_run(root, hq))
            change(hq, f"WHERE id = {1 + repeat}")
            runs["one_change"].append(timed_run(root, hq))
            change(hq, "")
            runs["all_change"].append(timed_run(root, hq))
        for kind, measured in runs.items():
            result.update(run_figures(kind, measured))
        result["all_change_ms_per_remote"] = round(result["all_change_s"] * 1000 / count, 3)
        timed_run(root, hq)  # what the last change left is sent: the process runs below are idle
        processes = [process_run(hq) for _ in range(repeats)]
        result["process_idle_s"] = round(statistics.median(seconds for seconds, _, _ in processes), 3)
        result["process_idle_runs_s"] = [round(seconds, 3) for seconds, _, _ in processes]
        result["process_idle_rss_mb"] = round(max(memory for _, memory, _ in processes), 1)
        result["process_idle_written_kb"] = round(statistics.median(written for _, _, written in processes), 1)
        changed = []
        for repeat in range(repeats):
            change(hq, f"WHERE id = {repeats + 1 + repeat}")
            changed.append(process_run(hq)[2])
        result["process_one_change_written_kb"] = round(statistics.median(changed), 1)
        result.update(status_figures("status_after_runs", hq, repeats))
        baseline = statistics.median(baseline_write_files(workdir / f"baseline{repeat}", count)
                                     for repeat in range(repeats))
        result["baseline_write_n_files_s"] = round(baseline, 3)
        # What a run where every remote changed costs over the least writing N files costs.
        result["all_change_vs_baseline"] = round(result["all_change_s"] / baseline, 2) if baseline else None
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sizes", default="100,1000,10000", help="numbers of remotes, comma-separated")
    parser.add_argument("--extract", type=int, default=100, help="remotes extracted in bulk_extract_s (at most)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind; the figures are their medians")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    result = {"benchmark": "fleet",
              "by_n": {str(size): measure(size, args.extract, max(1, args.repeat)) for size in sizes}}
    if args.json:
        print(json.dumps(result))
    else:
        for size, figures in result["by_n"].items():
            print(f"N={size}: " + ", ".join(f"{key} {value}" for key, value in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
