"""What several benchmarks share: timing, running an ``agent`` command
in this process and timing it, counting the files a run wrote into its peers'
inbox folders, medians of repeated runs, and printing the result.

Rules of this file:
* A command is timed once the interpreter runs (``agent.cli.main`` in
  this process): what is measured is the command, not Python's start.
* A command that fails stops the benchmark with its message: a figure
  from a run that did not do its work would mean nothing.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from agent.cli import main as agent


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    """The seconds ``action()`` took, after a garbage collection, and what it returned."""
    gc.collect()
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def agent_command(*arguments: object) -> float:
    """Run one ``agent`` command in this process, its output discarded;
    return the seconds it took (a failing command stops the benchmark)."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = agent([str(argument) for argument in arguments])
    elapsed = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"agent {' '.join(map(str, arguments))}: exit {code}: {err.getvalue().strip()}")
    return elapsed


def inbox_files(root: Path, but: str = "hq") -> int:
    """Files in the inbox folders under ``root/inbox``, but ``but``'s own."""
    return sum(len(os.listdir(folder)) for folder in (root / "inbox").iterdir() if folder.name != but)


def timed_run(root: Path, site: object) -> tuple[float, int]:
    """``agent run SITE --once``: its seconds, and the files it wrote into
    the other sites' inbox folders."""
    before = inbox_files(root)
    seconds = agent_command("run", site, "--once")
    return seconds, inbox_files(root) - before


def run_figures(kind: str, measured: list[tuple[float, int]]) -> dict:
    """Figures of repeated runs of one kind: ``KIND_s`` the median seconds,
    ``KIND_files`` the most files one run wrote, ``KIND_runs_s`` every run."""
    return {f"{kind}_s": round(statistics.median(seconds for seconds, _ in measured), 3),
            f"{kind}_files": max(files for _, files in measured),
            f"{kind}_runs_s": [round(seconds, 3) for seconds, _ in measured]}


def show(result: dict, as_json: bool) -> None:
    """One JSON object on one line, or one ``name: value`` line per figure."""
    if as_json:
        print(json.dumps(result))
        return
    width = max(map(len, result), default=0)
    for key, value in result.items():
        print(f"{key:>{width}}: {value}")
