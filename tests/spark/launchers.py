"""Stand-ins for ``spark-submit`` that hang, for the tests of the Spark
job's timeout and of stopping it (docs/spark.md, "A job that hangs, and
stopping the agent").  They are real programs run by the real engine; only
the JVM is left out, so that a test takes seconds.

Linux only: whether a process is gone is read from ``/proc``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HangingLauncher:
    """A launcher that starts a child which ignores SIGTERM, notes both
    pids in ``pid_file``, prints one line and waits for ever."""

    path: Path
    pid_file: Path

    def wait_started(self, within: float = 60.0) -> tuple[int, int]:
        """The launcher's pid and its child's, once both run."""
        deadline = time.monotonic() + within
        while not self.pid_file.exists():
            assert time.monotonic() < deadline, f"{self.path} did not start within {within} s"
            time.sleep(0.05)
        launcher, child = self.pid_file.read_text().split()
        return int(launcher), int(child)


LAST_LINE = "fake spark-submit: waiting for ever"


def hanging_launcher(folder: Path) -> HangingLauncher:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spark-submit-hangs"
    pid_file = folder / "spark-submit-hangs.pids"
    # The child ignores SIGTERM (ignored signals survive exec), so only the
    # SIGKILL sent to the whole process group stops it.
    path.write_text(f"""#!/bin/sh
(trap '' TERM; exec sleep 600) &
echo "$$ $!" > '{pid_file}.tmp' && mv '{pid_file}.tmp' '{pid_file}'
echo '{LAST_LINE}'
wait
""")
    path.chmod(0o755)
    return HangingLauncher(path, pid_file)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_gone(pids: list[int], within: float = 10.0) -> list[int]:
    """The pids still running after ``within`` seconds (none, if all went)."""
    deadline = time.monotonic() + within
    while True:
        left = [pid for pid in pids if running(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def group_members(group: int) -> list[int]:
    """The pids of the live processes of process group ``group``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # After the command: state, ppid, pgrp.
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def groups_naming(text: str) -> set[int]:
    """The process groups of the live processes whose command line holds ``text``."""
    groups = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if text in command and fields[0] != "Z":
            groups.add(int(fields[2]))
    return groups
