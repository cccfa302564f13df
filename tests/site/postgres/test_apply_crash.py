"""A process that applies a large message into PostgreSQL, killed (SIGKILL) at
a random moment: afterwards the database holds either the whole message,
its capture rows and its log_received, or none of them; and the message
then applies cleanly.  (tests/site/test_apply.py does the same for SQLite.)"""

from __future__ import annotations

import multiprocessing
import random
import time

import pytest

from agent.site.postgres.connect import connect
from agent.site.postgres.site import PostgresSite
from tests.site.workers import crash_batch, crash_setup

from .workers import apply_batch

ITEM = "CREATE TABLE item (id integer PRIMARY KEY, payload text, n integer NOT NULL)"
ROWS = 20_000
PER_TRANSACTION = 2_000
ATTEMPTS = 5


def _site(postgres, tmp_path, name: str) -> str:
    """A new database holding site hq with ``item`` and its base rows, from peer ``peer``."""
    uri = postgres.uri(postgres.create_database())
    app = connect(uri)
    app.execute(ITEM)
    app.close()
    with PostgresSite.init(uri, name="hq", role="consolidated", home=tmp_path / name) as site:
        crash_setup(site)
    return uri


def _snapshot(uri: str) -> tuple:
    conn = connect(uri)
    try:
        return (conn.execute("SELECT id, payload, n FROM item ORDER BY id").fetchall(),
                conn.execute("SELECT log_received FROM fieldsync.remote WHERE name = 'peer'").fetchone()[0],
                conn.execute("SELECT count(*) FROM fieldsync.capture").fetchone()[0])
    finally:
        conn.close()


def _wait_until_gone(uri: str, pid: int, timeout: float = 60.0) -> None:
    """Until the server process of the killed client has ended (and so
    rolled back whatever it had not committed)."""
    conn = connect(uri)
    try:
        deadline = time.monotonic() + timeout
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, f"server process {pid} outlived its killed client"
            time.sleep(0.02)
    finally:
        conn.close()


def _wait_until_writing(uri: str, pid: int, child, timeout: float = 120.0) -> None:
    """Until the child's server process holds a transaction that has written
    (pg_stat_activity.backend_xid is set from its first write to its commit
    or rollback), or the child has ended."""
    conn = connect(uri)
    try:
        deadline = time.monotonic() + timeout
        while child.is_alive():
            found = conn.execute("SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = %s",
                                 (pid,)).fetchone()
            if found and found[0]:
                return
            assert time.monotonic() < deadline, "the child's apply never began writing"
            time.sleep(0.002)
    finally:
        conn.close()


@pytest.mark.slow
def test_kill_during_apply_leaves_all_or_nothing(postgres, tmp_path):
    batch, log_received = crash_batch(6, ROWS, PER_TRANSACTION)
    # The "all" state and how long an apply takes, measured in a database of its own.
    full = _site(postgres, tmp_path, "full")
    before = _snapshot(full)
    with PostgresSite.open(full) as site:
        started = time.perf_counter()
        result = site.apply("peer", batch, log_received=log_received)
        duration = time.perf_counter() - started
    after = _snapshot(full)
    assert result.errors == 0 and after[1] == log_received and len(after[0]) > len(before[0])
    assert after[2] > before[2]

    context = multiprocessing.get_context("spawn")
    rng = random.Random(20260301)
    outcomes = []
    for attempt in range(ATTEMPTS):
        uri = _site(postgres, tmp_path, f"crash{attempt}")
        assert _snapshot(uri) == before
        ready, backend = context.Event(), context.Value("i", 0)
        child = context.Process(target=apply_batch, args=(uri, "peer", 6, ROWS, PER_TRANSACTION, backend, ready))
        child.start()
        assert ready.wait(60), "the child never got ready"
        _wait_until_writing(uri, backend.value, child)
        # The first kill lands as soon as the apply has written (mid-apply
        # whatever the machine's load); the others at a random moment from
        # there, now and then after the commit.
        time.sleep(0 if attempt == 0 else rng.uniform(0.0, 1.5) * duration)
        child.kill()
        child.join()
        _wait_until_gone(uri, backend.value)
        state = _snapshot(uri)
        if state == before:
            outcomes.append("none")
        else:
            assert state == after, f"attempt {attempt}: a partial apply survived the kill"
            outcomes.append("all")
        # After the kill the message applies (again) cleanly: nothing doubled.
        with PostgresSite.open(uri) as site:
            again = site.apply("peer", batch, log_received=log_received)
        assert again.errors == 0 and again.conflicts == 0
        assert _snapshot(uri) == after
    print(f"an apply of {ROWS} operations takes {duration:.2f} s; the kills left {outcomes}")
    assert "none" in outcomes, f"no kill landed mid-apply ({outcomes}); the test proved nothing"
