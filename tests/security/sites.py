"""The world the security tests attack: the README's consolidated ``hq``
with remotes ``n1`` and ``n2`` on folder inboxes, made by the real
commands (tests/cli/conftest.py), and the keys of a site to sign with."""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess
import sys
from pathlib import Path

from agent.cli import main
from agent.runner import Agent, RunOptions, RunReport
from agent.site import SiteDatabase
from codec.keys import SiteKeys
from tests.cli.conftest import World, make_world

AGENT_COMMAND = [sys.executable, "-c", "from agent.cli import main; main()"]


def _agent(*arguments: object) -> object:
    class Result:
        code = main([str(argument) for argument in arguments])
    return Result


def build_world(root: Path) -> World:
    with contextlib.redirect_stdout(io.StringIO()):
        return make_world(root, _agent)  # type: ignore[arg-type]


def keys_of(database: Path) -> tuple[SiteKeys, bytes]:
    """A site's secret keys and incarnation id, to sign files as that site."""
    try:
        from agent.keyfiles import load_site_keys
    except ImportError:  # before the keys left the database
        from agent.admin import site_keys as load_site_keys

    site = SiteDatabase.open(database)
    try:
        return load_site_keys(site), site.identity.incarnation
    finally:
        site.close()


def epoch_of(consolidated: Path, remote: str) -> int:
    """The epoch the consolidated expects of ``remote``'s stream."""
    site = SiteDatabase.open(consolidated)
    try:
        [epoch] = [row.rereceive_count for row in site.remotes() if row.name == remote]
        return epoch
    finally:
        site.close()


def run_once(database: Path, options: RunOptions | None = None) -> RunReport:
    async def once() -> RunReport:
        async with Agent(database, options or RunOptions()) as agent:
            return await agent.run_once()
    return asyncio.run(once())


# Runs the command given as arguments and prints its peak RSS in KiB.  A
# child forked from a large process (pytest) reports that process's
# resident size as its own peak (Linux keeps the high-water mark across
# fork and exec), so the agent is started from this small process instead.
_MEASURE = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)
"""


def run_in_process(database: Path, *arguments: str) -> tuple[int, float, str]:
    """``agent run DATABASE --once`` in a process of its own: exit code,
    peak RSS in MB (of that process alone) and its stderr."""
    completed = subprocess.run([sys.executable, "-c", _MEASURE, *AGENT_COMMAND, "run", str(database), "--once",
                                *arguments], capture_output=True, text=True, timeout=600)
    peak_kib, code = completed.stdout.split()
    return int(code), int(peak_kib) / 1024, completed.stderr
