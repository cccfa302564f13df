"""Fixtures for the command-line tests: run `agent` in-process on real files."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from agent.cli import main
from tests.sqlfiles import connected


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


Agent = Callable[..., Result]


@pytest.fixture
def agent(capsys: pytest.CaptureFixture[str]) -> Agent:
    """``agent("run", db, "--once")`` runs the command as the console script
    would (through :func:`agent.cli.main`) and returns code, stdout, stderr."""

    def run(*arguments: object) -> Result:
        capsys.readouterr()
        code = main([str(argument) for argument in arguments])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


@dataclass(frozen=True)
class World:
    """A consolidated (hq) and two extracted remotes (n1, n2) with folder inboxes."""

    root: Path
    hq: Path
    n1: Path
    n2: Path

    def inbox(self, site: str) -> Path:
        return self.root / "inbox" / site

    def rows(self, site: str, query: str = "SELECT * FROM customer ORDER BY id") -> list[tuple]:
        with connected(self.root / f"{site}.db") as conn:
            return conn.execute(query).fetchall()

    def execute(self, site: str, statement: str, parameters: tuple = ()) -> None:
        with connected(self.root / f"{site}.db") as conn:
            conn.execute(statement, parameters)


def make_world(root: Path, agent: Agent, article: str = "customer:id,region,name@region") -> World:
    for site in ("hq", "n1", "n2"):
        (root / "inbox" / site).mkdir(parents=True)
    hq = root / "hq.db"
    assert agent("init", hq, "--name", "hq", "--role", "consolidated", "--address", root / "inbox" / "hq").code == 0
    with connected(hq) as conn:
        conn.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, note TEXT)")
        conn.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)",
                         [(number, "n1" if number % 2 else "n2", f"customer {number}", "internal")
                          for number in range(1, 21)])
    assert agent("publication", "create", hq, "territory", article).code == 0
    for remote in ("n1", "n2"):
        assert agent("remote", "add", hq, remote, "--address", root / "inbox" / remote,
                     "--subscribe", f"territory={remote}").code == 0
        assert agent("extract", hq, remote, root / f"{remote}.db").code == 0
    return World(root, hq, root / "n1.db", root / "n2.db")


@pytest.fixture
def world(tmp_path: Path, agent: Agent) -> World:
    return make_world(tmp_path, agent)


def sync(agent: Agent, world: World, rounds: int = 3) -> None:
    """Batch rounds of every site, each one expected to go well."""
    for _ in range(rounds):
        for database in (world.hq, world.n1, world.n2):
            result = agent("run", database, "--once")
            assert result.code == 0, result.err


@pytest.fixture
def whole(tmp_path: Path, agent: Agent) -> World:
    """hq publishes customer whole (every column), SUBSCRIBE BY region; n1 and n2 extracted, in sync."""
    world = make_world(tmp_path, agent, "customer@region")
    sync(agent, world)
    return world


AGENT_COMMAND = [sys.executable, "-c", "from agent.cli import main; main()"]


@contextlib.contextmanager
def agent_process(*arguments: object, **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """``agent ARGUMENTS`` in a process of its own, stdout and stderr piped
    as text; killed on the way out if it still runs."""
    command = [*AGENT_COMMAND, *map(str, arguments)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def stop_once_n1_has_data(process: subprocess.Popen[str], world: World) -> tuple[str, str]:
    """Wait (30 s at most) for a continuous agent to put a data message in
    n1's inbox, then stop it as a service manager would (SIGTERM); return
    its stdout and stderr."""
    deadline = time.monotonic() + 30
    while not any(".d." in path.name for path in world.inbox("n1").iterdir()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no data message reached n1's inbox"
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=60)
