"""The world the security tests attack: the README's consolidated ``hq``
with remotes ``n1`` and ``n2`` on folder inboxes, made by the real
commands (tests/cli/conftest.py), and the keys of a site to sign with."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
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


def run_in_process(database: Path, *arguments: str) -> tuple[int, float, str]:
    """``agent run DATABASE --once`` in a process of its own: exit code,
    peak RSS in MB (from wait4, of that process alone) and its stderr."""
    process = subprocess.Popen([*AGENT_COMMAND, "run", str(database), "--once", *arguments],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    errors = process.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    process.stderr.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss / 1024, errors
