"""A child process puts, deletes and dequeues messages in several threads
and is killed with SIGKILL at random moments, 30 times, on one spool.
After each kill the spool must hold every message whose put returned and
that was not (possibly) deleted or applied, none whose delete returned or
whose apply committed, and nothing that was never put — each once, in
order, with its content."""

import os
import random
import select
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from agent.spool import SpoolQueues, check_spool

from .helpers import payload
from .kill_child import OPTIONS, PEERS

ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("FIELDSYNC_SPOOL_KILLS", "30"))

pytestmark = pytest.mark.timeout(300)


def read_journal(path):
    events = defaultdict(set)
    put_order = defaultdict(list)
    dequeues = defaultdict(list)  # (peer, last) -> names
    applied = defaultdict(int)  # peer -> the database's log_received
    committed = defaultdict(set)  # peer -> the dequeue batches whose apply committed (their ``last``)
    for line in Path(path).read_text().splitlines():
        words = line.split()
        if words[0] in ("p+", "P", "d+", "D"):
            kind, direction, peer, name = words
            events[(direction, peer, name)].add(kind)
            if kind == "p+":
                put_order[(direction, peer)].append(name)
        elif words[0] == "b+":
            _kind, peer, last, name = words
            events[("in", peer, name)].add(("b+", int(last)))
            dequeues[(peer, int(last))].append(name)
        elif words[0] == "A":
            applied[words[1]] = max(applied[words[1]], int(words[2]))
            committed[words[1]].add(int(words[2]))
    return events, put_order, applied, committed


def verify(spool_path, journal):
    events, put_order, applied, applied_batches = read_journal(journal)
    report = check_spool(spool_path)
    assert report.ok, "\n".join(report.lines())
    spool = SpoolQueues(spool_path, **OPTIONS)
    try:
        for peer in PEERS:  # what the runner does at start, from its database
            spool.resolve_in_doubt(peer, applied[peer])
        assert spool.in_doubt() == ()
        actual = set()
        for peer in PEERS:
            inbound, outbound = spool.inbound(peer), spool.outbound(peer)
            assert len(set(inbound)) == len(inbound) and len(set(outbound)) == len(outbound)
            actual.update(("in", peer, name) for name in inbound)
            actual.update(("out", peer, name) for name in outbound)
            order = {name: index for index, name in enumerate(put_order[("out", peer)])}
            assert [order[name] for name in outbound] == sorted(order[name] for name in outbound)
        for key in actual:
            assert key in events, f"{key} was never put"
            direction, peer, name = key
            read = spool.read_inbound if direction == "in" else spool.read_outbound
            assert read(peer, name) == payload(direction, peer, name)
        committed = 0
        for key, kinds in events.items():
            direction, peer, name = key
            # Applied: a dequeue of it whose apply committed.  (Not any batch
            # at or below the peer's log_received: a batch killed before its
            # apply committed is rolled back when the spool opens, and a later
            # batch of other messages can commit a higher ``last`` while this
            # one is still queued.)
            dequeued = any(isinstance(kind, tuple) and kind[1] in applied_batches[peer] for kind in kinds)
            if "D" in kinds:
                assert key not in actual, f"{key} was deleted (the delete returned), yet is queued"
            if dequeued:
                assert key not in actual, f"{key} was applied (its apply committed), yet is queued"
            elif "d+" in kinds:
                pass  # the kill may have come before or after its delete was durable
            elif "P" in kinds:
                committed += 1
                assert key in actual, f"{key} was put (and the put returned), yet is lost"
        return committed, spool.status()
    finally:
        spool.close()


def test_kill_9_at_random_moments_under_load(tmp_path):
    spool_path, journal = tmp_path / "spool", tmp_path / "journal"
    rng = random.Random(int(os.environ.get("FIELDSYNC_KILL_SEED", "11")))
    checkpoints = 0
    queued = 0
    for round_number in range(1, KILLS + 1):
        child = subprocess.Popen([sys.executable, "-m", "tests.spool.kill_child", str(spool_path), str(journal),
                                  str(rng.randrange(10**6)), str(round_number)],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Killed at a random moment after it opened its journal (the restart
        # of the spool included), however long the interpreter took to start.
        ready, _, _ = select.select([child.stdout], [], [], 120)
        if not ready or child.stdout.readline() != b"started\n":
            child.kill()
            child.wait()
            pytest.fail(f"the child did not start: {child.stderr.read().decode()[-3000:]}")
        time.sleep(rng.uniform(0.1, 0.6))
        if child.poll() is not None:
            pytest.fail(f"the child stopped by itself: {child.stderr.read().decode()[-3000:]}")
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
        queued, status = verify(spool_path, journal)
        checkpoints = status.checkpoints
    events, _order, _applied, _batches = read_journal(journal)
    assert sum("P" in kinds for kinds in events.values()) > 20 * KILLS // 3, "the child should do real work"
    assert checkpoints > KILLS, "checkpoints should run under load"
    assert queued > 0
