"""The spool's summary file (docs/spool-format.md, "summary"): what it says
matches a full check after every kind of write (made current by
``at_rest``), it is rewritten as the log grows and not at every put, a
summary the log moved past is stale, a damaged one is unreadable, and an
idle open writes none."""

import math
import os
import random
import shutil
import struct
import zlib

import pytest

from agent.spool import SpoolQueues, check_spool
from agent.spool._summary import (SUMMARY_FILE, SUMMARY_GROWTH, SummaryStale, SummaryUnreadable, encode_summary,
                                  read_summary)

from .helpers import copy_spool, cut_log, payload, record_rbas, record_workload


def figures(path):
    """The summary's figures and check_spool's, in one shape."""
    summary = read_summary(path)
    check = check_spool(path)
    mine = {
        "queues": sorted((queue.queue, queue.messages, queue.oldest_enqueued_at) for queue in summary.queues),
        "in_doubt": summary.in_doubt, "restart_span_bytes": summary.restart_span_bytes,
        "log_bytes": summary.log_bytes, "segments": summary.segments, "ok": summary.ok,
    }
    theirs = {
        "queues": sorted((queue.queue, len(queue.names), queue.oldest_enqueued_at) for queue in check.queues),
        "in_doubt": len(check.in_doubt), "restart_span_bytes": check.restart_span_bytes,
        "log_bytes": check.end_rba - check.log_start_rba, "segments": len(check.segments), "ok": check.ok,
    }
    return mine, theirs


class Clock:
    """A clock that sometimes goes back, so the oldest message is not always the first queued."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.now = 1_000_000.0

    def __call__(self):
        self.now += self.rng.uniform(-50, 100)
        return self.now


def test_the_summary_matches_a_full_check_after_every_write(tmp_path):
    """Puts, deletes, purges, in-doubt dequeues committed and aborted,
    checkpoints (small segments, so some go), each followed by a comparison."""
    path = tmp_path / "spool"
    rng = random.Random(7)
    spool = SpoolQueues(path, checkpoint_every=25, cpl_pairs=2, segment_bytes=8192, clock=Clock(7))
    last = 0
    compared = 0
    for step in range(400):
        peer = rng.choice(["hq", "f2", "f3"])
        roll = rng.random()
        if roll < 0.4:
            direction = rng.choice(["in", "out"])
            name = f"m{step:04d}.fsm"
            if direction == "in":
                spool.put_inbound(peer, name, payload("in", peer, name))
            else:
                spool.put_outbound(peer, name, payload("out", peer, name), rng.randint(0, 2))
        elif roll < 0.5:
            queued = spool.inbound(peer)
            if queued:
                spool.delete_inbound(peer, rng.sample(queued, min(len(queued), 2)))
        elif roll < 0.6:
            queued = spool.outbound(peer)
            if queued:
                spool.delete_outbound(peer, rng.choice(queued))
        elif roll < 0.65:
            spool.purge_outbound(peer, rng.randint(0, 2))
        elif roll < 0.85:
            queued = spool.inbound(peer)
            if queued:
                last += 10
                token = spool.begin_dequeue(peer, queued[:2], last)
                spool.at_rest()
                mine, theirs = figures(path)  # durable on return, in doubt
                assert mine == theirs and mine["in_doubt"] == 1
                if rng.random() < 0.6:
                    spool.commit_dequeue(token, wait=True)
                else:
                    spool.abort_dequeue(token)
        elif roll < 0.9:
            with spool.group_commit():
                for number in range(rng.randint(1, 5)):
                    name = f"g{step:04d}-{number}.fsm"
                    spool.put_outbound(peer, name, payload("out", peer, name), 0)
        else:
            spool.checkpoint()
        spool.at_rest()
        mine, theirs = figures(path)
        assert mine == theirs, step
        compared += 1
    assert spool.counters.checkpoints > 10 and len(list(path.glob("*.seg"))) >= 1
    assert spool.last_checkpoint is not None and spool.last_checkpoint.segments_deleted >= 0
    spool.close()
    mine, theirs = figures(path)
    assert mine == theirs and compared == 400


def test_a_lost_commit_of_a_dequeue_leaves_the_summary_in_doubt_until_at_rest(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    spool.put_inbound("hq", "a.fsm", b"a")
    token = spool.begin_dequeue("hq", ["a.fsm"], 5)
    spool.at_rest()
    spool.commit_dequeue(token)  # rides on the next group commit
    assert read_summary(path).in_doubt == 1  # the disk still says in doubt, and so does the summary
    spool.put_inbound("hq", "b.fsm", b"b")
    with pytest.raises(SummaryStale):  # a small put does not rewrite it
        read_summary(path)
    spool.at_rest()
    summary = read_summary(path)
    assert (summary.in_doubt, summary.messages) == (0, 1)
    spool.close()


def test_the_summary_follows_a_large_queue_drained_oldest_first(tmp_path):
    """The oldest message of a queue comes from a heap: right after each
    dequeue of the oldest, and after a restart."""
    path = tmp_path / "spool"
    clock = Clock(3)
    spool = SpoolQueues(path, clock=clock)
    with spool.group_commit():
        for number in range(300):
            spool.put_inbound("hq", f"m{number:04d}.fsm", b"x")
    [queue] = spool._queues.values()
    expected = {block.name: block.enqueued_at for block in queue.messages.values()}
    for name in sorted(expected, key=expected.get)[:250]:
        spool.delete_inbound("hq", [name])
        del expected[name]
        spool.at_rest()
        summary = read_summary(path)
        assert summary.queues[0].oldest_enqueued_at == min(expected.values())
    spool.close()
    spool = SpoolQueues(path, clock=clock)
    spool.put_inbound("hq", "late.fsm", b"y")
    spool.at_rest()
    assert read_summary(path).queues[0].oldest_enqueued_at == min(expected.values())
    assert read_summary(path).messages == 51
    spool.close()


def test_after_a_crash_at_any_record_the_reopened_spool_writes_a_summary_that_matches(tmp_path):
    recorded = record_workload(tmp_path / "spool", seed=4, steps=40)
    boundaries = [rba + length for rba, length in record_rbas(recorded.path)]
    for cut in boundaries[::max(1, len(boundaries) // 25)] + [boundaries[-1] - 3]:
        copy = copy_spool(recorded.path, tmp_path / f"cut{cut}")
        cut_log(copy, cut)
        if cut < boundaries[-1]:
            with pytest.raises(SummaryStale):  # the summary names a later end
                read_summary(copy)
        spool = SpoolQueues(copy, cpl_pairs=2, checkpoint_every=10**9)
        mine, theirs = figures(copy)
        assert mine == theirs, cut
        spool._abandon()  # a second crash, right after the restart: still current
        mine, theirs = figures(copy)
        assert mine == theirs, cut
        shutil.rmtree(copy)


def test_a_summary_the_log_moved_past_is_stale(tmp_path):
    """The agent killed after a write but before the summary's: the old
    summary names an end the log has left."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    spool.put_outbound("f1", "a.fsm", b"a", 0)
    old = (path / SUMMARY_FILE).read_bytes()
    spool.put_outbound("f1", "b.fsm", b"b", 0)
    spool.at_rest()
    assert read_summary(path).messages == 2
    (path / SUMMARY_FILE).write_bytes(old)
    with pytest.raises(SummaryStale, match="written after"):
        read_summary(path)
    spool._abandon()
    with pytest.raises(SummaryStale):
        read_summary(path)
    spool = SpoolQueues(path)  # the restart brings it up to date
    assert read_summary(path).messages == 2
    spool.close()


def test_a_summary_of_another_log_or_a_shorter_one_is_stale(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    with SpoolQueues(first) as spool:
        spool.put_outbound("f1", "a.fsm", b"a" * 10, 0)
    with SpoolQueues(second) as spool:
        spool.put_outbound("f1", "a.fsm", b"b" * 10, 0)
    shutil.copy(first / SUMMARY_FILE, second / SUMMARY_FILE)  # same end, other bytes before it
    with pytest.raises(SummaryStale, match="not the one"):
        read_summary(second)
    end = read_summary(first).end_rba
    with open(next(first.glob("*.seg")), "r+b") as handle:
        handle.truncate(end - 30)
    with pytest.raises(SummaryStale, match="ends before"):
        read_summary(first)
    for segment in first.glob("*.seg"):
        segment.unlink()
    with pytest.raises(SummaryStale, match="no segment"):
        read_summary(first)


def _rewrite(path, data):
    body = data[:-4]
    (path / SUMMARY_FILE).write_bytes(body + struct.pack("<I", zlib.crc32(body)))


@pytest.mark.parametrize("damage", ["missing", "empty", "flipped", "cut", "magic", "huge", "queue count",
                                    "problem count", "peer name", "direction", "oldest of none", "left over"])
def test_a_damaged_summary_is_unreadable(tmp_path, damage):
    path = tmp_path / "spool"
    with SpoolQueues(path) as spool:
        spool.put_outbound("f1", "a.fsm", b"a", 0)
    file = path / SUMMARY_FILE
    data = file.read_bytes()
    head = 8 + 8 + 4 + 8 + 8 + 4 + 8 + 8 + 4  # then u16 problems (0), u32 queues
    if damage == "missing":
        file.unlink()
    elif damage == "empty":
        file.write_bytes(b"")
    elif damage == "flipped":
        file.write_bytes(data[:30] + bytes([data[30] ^ 1]) + data[31:])
    elif damage == "cut":
        file.write_bytes(data[:-7])
    elif damage == "magic":
        _rewrite(path, b"FSSUMRY9" + data[8:])
    elif damage == "huge":
        file.write_bytes(b"\0" * (17 * 1024 * 1024))
    elif damage == "queue count":
        _rewrite(path, data[:head + 2] + struct.pack("<I", 2**32 - 1) + data[head + 6:])
    elif damage == "problem count":
        _rewrite(path, data[:head] + struct.pack("<H", 5) + data[head + 2:])
    elif damage == "peer name":
        _rewrite(path, data[:head + 8] + b"/1" + data[head + 10:])
    elif damage == "direction":
        _rewrite(path, data[:head + 6] + b"\x07" + data[head + 7:])
    elif damage == "oldest of none":
        entry = head + 6 + 2 + 2
        _rewrite(path, data[:entry] + struct.pack("<I", 0) + data[entry + 4:])
    elif damage == "left over":
        _rewrite(path, data[:-4] + b"\0\0\0\0" + data[-4:])
    with pytest.raises(SummaryUnreadable, match="summary"):
        read_summary(path)


def test_the_format_round_trips_and_has_its_bounds():
    data = encode_summary(end=1000, tail_crc=5, log_start=0, last_base=0, segments=1, restart=500, checkpoint=3,
                          in_doubt=1, problems=("x" * 5000,) * 200, entries=[])
    from agent.spool._summary import decode_summary
    summary, crc, base = decode_summary(data)
    assert (summary.restart_span_bytes, summary.log_bytes, crc, base) == (500, 1000, 5, 0)
    assert len(summary.problems) == 100 and all(len(problem) == 1000 for problem in summary.problems)
    assert not summary.ok and summary.queues == () and summary.messages == 0
    assert math.isnan(struct.unpack("<d", struct.pack("<d", math.nan))[0])


def test_an_idle_open_and_close_writes_no_summary(tmp_path):
    path = tmp_path / "spool"
    with SpoolQueues(path) as spool:
        spool.put_outbound("f1", "a.fsm", b"a", 0)
    before = os.stat(path / SUMMARY_FILE)
    for _ in range(3):
        with SpoolQueues(path) as spool:
            assert spool.outbound("f1") == ["a.fsm"]
    after = os.stat(path / SUMMARY_FILE)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(entry.name for entry in path.iterdir()) == ["00000000000000000000.seg", "LOCK", "anchor",
                                                              SUMMARY_FILE]


def _identity(path):
    status = os.stat(path / SUMMARY_FILE)
    return status.st_mtime_ns, status.st_ino


def test_a_small_spool_rewrites_the_summary_as_the_log_grows_and_at_rest(tmp_path):
    """Not at every group commit (a remote rewrote it at each put and each
    dequeue): once the log grew by SUMMARY_GROWTH, and when the agent is
    about to wait (at_rest), which writes nothing when nothing moved."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    writes = 0
    for number in range(200):
        before = _identity(path)
        spool.put_inbound("hq", f"m{number:04d}.fsm", b"y" * 20_000)
        token = spool.begin_dequeue("hq", [f"m{number:04d}.fsm"], number + 1)
        spool.commit_dequeue(token)
        writes += _identity(path) != before
    assert 2 <= writes <= 200 * 20_000 // SUMMARY_GROWTH + 1, writes
    with pytest.raises(SummaryStale):
        read_summary(path)
    spool.at_rest()
    summary = read_summary(path)
    assert (summary.messages, summary.in_doubt) == (0, 0)
    before = _identity(path)
    spool.at_rest()
    assert _identity(path) == before
    spool.close()


def test_a_large_fleet_rewrites_the_summary_as_the_log_grows_not_at_every_put(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    with spool.group_commit():
        for number in range(2000):
            spool.put_outbound(f"site{number:04d}", "x.fsm", b"x", 0)
    spool.at_rest()
    size = (path / SUMMARY_FILE).stat().st_size
    assert size > 4096
    writes = 0
    for number in range(400):
        before = _identity(path)
        spool.put_inbound(f"site{number % 2000:04d}", f"in{number}.fsm", b"y" * 10_000)
        writes += _identity(path) != before
    assert 1 <= writes <= 400 * 10_100 // max(size, SUMMARY_GROWTH) + 2, (writes, size)
    spool.close()  # brings it up to date
    assert read_summary(path).messages == 2400


def test_metrics_read_the_depths_from_the_summary_and_from_the_log_when_it_is_not_current(tmp_path, monkeypatch):
    """A metrics file written after a batch run reads the queue depths as
    status does: from the summary when it is current, else from the log,
    with the same figures."""
    import agent.spool as spool_package
    from agent.keyfiles import agent_directory
    from agent.metrics import spool_depths

    database = tmp_path / "hq.db"
    path = agent_directory(database) / "spool"
    with SpoolQueues(path) as spool:
        spool.put_outbound("f1", "a.fsm", b"a", 0)
        spool.put_outbound("f1", "b.fsm", b"b", 0)
        spool.put_outbound("f2", "c.fsm", b"c", 0)
        spool.put_inbound("f2", "d.fsm", b"d")
    reads = []
    monkeypatch.setattr(spool_package, "check_spool", lambda *a, **k: reads.append(a) or check_spool(*a, **k))

    def depths():
        return sorted((depth.peer, depth.inbound, depth.outbound) for depth in spool_depths(database))

    assert depths() == [("f1", 0, 2), ("f2", 1, 1)]
    assert reads == []  # the summary was current: the log was not read
    (path / SUMMARY_FILE).write_bytes(b"not a summary")
    assert depths() == [("f1", 0, 2), ("f2", 1, 1)]
    assert len(reads) == 1  # unreadable: read from the log
