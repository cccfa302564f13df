"""The crash catalogue: named cases built from byte surgery on a recorded
log and from crash points inside the spool.  After each, the spool must
restart to exactly the committed queue state — nothing lost, nothing
doubled — or refuse to open with the corruption's RBA."""

import os
import subprocess
import sys

import pytest

from agent.spool import SpoolCorrupt, SpoolLocked, SpoolQueues, check_spool
from agent.spool._spool import _SimulatedCrash
from codec.header import Header
from codec.names import Kind, MessageName

from .helpers import (check_contents, copy_spool, cut_log, flip_byte, payload, record_rbas, record_workload,
                      segment_holding, snapshot)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return record_workload(tmp_path_factory.mktemp("recorded") / "spool", seed=3, steps=70)


def restart_matches(path, expected):
    spool = SpoolQueues(path, checkpoint_every=10**9, cpl_pairs=2)
    try:
        assert snapshot(spool) == expected
        check_contents(spool, expected[0])
        # The restarted spool takes new work, and a second restart changes nothing.
        spool.put_inbound("after", "after-restart.fsm", payload("in", "after", "after-restart.fsm"))
    finally:
        spool.close()
    spool = SpoolQueues(path, checkpoint_every=10**9, cpl_pairs=2)
    try:
        state, doubts = snapshot(spool)
        assert state.pop(("in", "after")) == ("after-restart.fsm",)
        assert (state, doubts) == expected
        assert spool.last_restart.units_backed_out == 0  # the first restart finished the job
    finally:
        spool.close()


def test_the_recorded_workload_restarts_whole(recorded, tmp_path):
    copy = copy_spool(recorded.path, tmp_path / "copy")
    restart_matches(copy, recorded.steps[-1][1])
    assert len({repr(state) for _end, state in recorded.steps}) > 20  # the workload did change things


def test_truncation_at_every_record_boundary(recorded, tmp_path):
    records = record_rbas(recorded.path)
    assert len(records) > 100
    for index, (rba, _length) in enumerate(records[1:] + [(records[-1][0] + records[-1][1], 0)]):
        copy = copy_spool(recorded.path, tmp_path / f"cut-{index}")
        cut_log(copy, rba)
        report = check_spool(copy)
        assert report.torn_tail is None and not report.corruption
        restart_matches(copy, recorded.expected_at(rba))


def test_truncation_inside_every_record(recorded, tmp_path):
    for index, (rba, length) in enumerate(record_rbas(recorded.path)[1:]):
        for inside in sorted({1, 5, 9, length // 2, length - 1}):
            copy = copy_spool(recorded.path, tmp_path / f"cut-{index}-{inside}")
            cut_log(copy, rba + inside)
            leftover = (segment_holding(copy, rba).path.read_bytes())[rba:]
            report = check_spool(copy)
            if leftover.strip(b"\0"):
                assert report.torn_tail is not None and report.torn_tail.rba == rba
            else:  # what is left of the record reads as spare zeros
                assert report.torn_tail is None
            assert report.ok and not report.corruption
            restart_matches(copy, recorded.expected_at(rba))


def test_torn_tail_check_report_matches_what_restart_builds(recorded, tmp_path):
    records = record_rbas(recorded.path)
    rba, length = records[len(records) * 2 // 3]
    copy = copy_spool(recorded.path, tmp_path / "copy")
    cut_log(copy, rba + length // 2)
    report = check_spool(copy)
    state, _doubts = recorded.expected_at(rba)
    found = {(queue.direction, queue.peer): queue.names for queue in report.queues if queue.names}
    assert found == state
    assert any("torn tail" in line for line in report.lines())


def test_flipped_byte_in_the_middle_is_corruption_reported_with_its_rba(recorded, tmp_path):
    records = record_rbas(recorded.path)
    spool = SpoolQueues(copy_spool(recorded.path, tmp_path / "probe"), checkpoint_every=10**9, cpl_pairs=2)
    restart_rba = spool.restart_rba
    spool.close()
    needed = [(rba, length) for rba, length in records[:-3] if rba > restart_rba]
    for index, (rba, length) in enumerate(needed[:: max(1, len(needed) // 12)]):
        for offset in (0, 4, 8, length - 1):  # crc, length, type byte, payload
            copy = copy_spool(recorded.path, tmp_path / f"flip-{index}-{offset}")
            flip_byte(copy, rba + offset)
            report = check_spool(copy)
            assert not report.ok
            assert [bad.rba for bad in report.corruption if bad.needed] == [rba]
            with pytest.raises(SpoolCorrupt) as caught:
                SpoolQueues(copy, checkpoint_every=10**9, cpl_pairs=2)
            assert caught.value.rba == rba
            assert f"RBA {rba}" in str(caught.value)


def test_flipped_byte_before_the_restart_position_is_harmless(recorded, tmp_path):
    copy = copy_spool(recorded.path, tmp_path / "copy")
    spool = SpoolQueues(copy, checkpoint_every=10**9, cpl_pairs=2)
    restart_rba = spool.restart_rba
    spool.close()
    old = [rba for rba, _length in record_rbas(copy) if rba < restart_rba]
    assert old, "the workload should move the restart position"
    flip_byte(copy, old[len(old) // 2] + 10)
    report = check_spool(copy)
    assert report.ok and [bad.needed for bad in report.corruption] == [False]
    restart_matches(copy, recorded.steps[-1][1])


def test_flipped_byte_in_the_last_write_reads_as_a_torn_tail(tmp_path):
    """A damaged record in the last group commit cannot be told from a torn
    write (as in LevelDB): its unit of recovery is backed out."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    spool.put_inbound("hq", "kept.fsm", b"kept")
    end = spool._log.next_rba
    spool.put_inbound("hq", "lost.fsm", b"lost")
    spool.close()
    flip_byte(path, end + 12)
    report = check_spool(path)
    assert report.torn_tail is not None and report.torn_tail.rba == end
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["kept.fsm"]
    spool.close()


def test_zeros_after_the_end_are_spare_space(tmp_path):
    """The writer keeps zeros ahead of the end of the log, and file systems
    may show a crashed append as zeros: neither is a record, nor a torn write."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    spool.put_inbound("hq", "a.fsm", b"a" * 100)
    end = spool._log.next_rba
    spool.close()
    with open(segment_holding(path, end).path, "ab") as handle:
        handle.write(bytes(5000))
    assert check_spool(path).torn_tail is None and check_spool(path).ok
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["a.fsm"] and spool.last_restart.torn_bytes == 0
    spool.put_inbound("hq", "b.fsm", b"b")
    spool.close()
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["a.fsm", "b.fsm"]
    spool.close()


def test_a_close_keeps_the_spare_zeros_and_the_next_writer_appends_into_them(tmp_path, monkeypatch):
    """A batch run opens the spool, puts a message and closes it: the zeros
    written ahead stay at the close, so the next run's append overwrites
    them with no zeros written again and no change of the file's size."""
    import agent.spool._log as spool_log

    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    spool.put_inbound("hq", "a.fsm", b"a" * 100)
    end = spool._log.next_rba
    spool.close()
    segment = segment_holding(path, end).path
    size = segment.stat().st_size
    assert size > end  # the spare zeros stayed
    written: list[int] = []
    real = os.pwrite

    def counted(fd: int, data: bytes, offset: int) -> int:
        written.append(len(data))
        return real(fd, data, offset)

    monkeypatch.setattr(spool_log.os, "pwrite", counted)
    spool = SpoolQueues(path)
    spool.put_inbound("hq", "b.fsm", b"b" * 100)
    spool.close()
    assert segment.stat().st_size == size and 0 < sum(written) < 4096, written
    assert check_spool(path).ok and check_spool(path).torn_tail is None
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["a.fsm", "b.fsm"] and spool.last_restart.torn_bytes == 0
    spool.close()


def test_a_corrupt_record_followed_by_a_later_write_is_not_a_torn_tail(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    spool.put_inbound("hq", "a.fsm", b"a" * 100)
    middle = spool._log.next_rba
    spool.put_inbound("hq", "b.fsm", b"b" * 100)
    spool.put_inbound("hq", "c.fsm", b"c" * 100)  # a later group commit
    spool.close()
    flip_byte(path, middle + 20)
    with pytest.raises(SpoolCorrupt) as caught:
        SpoolQueues(path)
    assert caught.value.rba == middle


def fault_at(point, *, after=1):
    seen = {"count": 0}

    def fault(where):
        if where == point:
            seen["count"] += 1
            if seen["count"] >= after:
                raise _SimulatedCrash(where)

    return fault


def crash(spool):
    spool._abandon()


def test_crash_between_relog_records_and_the_cpl_record(tmp_path):
    """Relog records are honoured only inside completed checkpoints: the
    half-done checkpoint's copies are ignored now and at every later restart."""
    path = tmp_path / "spool"
    options = dict(checkpoint_every=10**9, cpl_pairs=2)
    spool = SpoolQueues(path, **options)
    for number in range(6):
        spool.put_inbound("hq", f"old-{number}.fsm", payload("in", "hq", f"old-{number}.fsm"))
    spool.checkpoint()
    spool.checkpoint()
    expected = snapshot(spool)
    spool._fault = fault_at("checkpoint.before_cpl")
    with pytest.raises(_SimulatedCrash):
        spool.checkpoint()  # relogs all six, then dies before its CPL record
    crash(spool)
    spool = SpoolQueues(path, **options)
    assert spool.last_restart.relogs_ignored == 6
    assert snapshot(spool) == expected
    check_contents(spool, expected[0])
    spool.delete_inbound("hq", ["old-0.fsm"])
    spool.checkpoint()
    spool.checkpoint()
    expected = snapshot(spool)
    crash(spool)
    spool = SpoolQueues(path, **options)
    assert snapshot(spool) == expected and "old-0.fsm" not in spool.inbound("hq")
    check_contents(spool, expected[0])
    spool.close()


@pytest.mark.parametrize("point", ["checkpoint.before_anchor", "checkpoint.before_drop"])
def test_crash_after_the_cpl_record(tmp_path, point):
    """The anchor and segment deletion follow the CPL record: a stale anchor
    only makes restart read more."""
    path = tmp_path / "spool"
    options = dict(checkpoint_every=10**9, cpl_pairs=2, segment_bytes=4096)
    spool = SpoolQueues(path, **options)
    for number in range(40):
        name = f"m-{number:03d}.fsm"
        spool.put_outbound("f1", name, payload("out", "f1", name), 0)
        if number % 4:
            spool.delete_outbound("f1", name)
        if number % 10 == 9:
            spool.checkpoint()
    expected = snapshot(spool)
    spool._fault = fault_at(point)
    with pytest.raises(_SimulatedCrash):
        spool.checkpoint()
    crash(spool)
    spool = SpoolQueues(path, **options)
    assert snapshot(spool) == expected
    check_contents(spool, expected[0])
    assert check_spool(path).ok
    spool.close()


def test_crash_between_the_database_commit_and_the_dequeue_commit(tmp_path):
    """The apply committed (log_received reached the dequeue's last) but
    the COMMIT record never made it: restart resolves from log_received."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    for number in range(4):
        spool.put_inbound("hq", f"m{number}.fsm", payload("in", "hq", f"m{number}.fsm"))
    token = spool.begin_dequeue("hq", ["m0.fsm", "m1.fsm"], log_received=200)
    database_log_received = 200  # the apply's transaction commits here
    crash(spool)  # ... and the agent dies before commit_dequeue
    spool = SpoolQueues(path)
    assert [(doubt.peer, doubt.last, doubt.names) for doubt in spool.in_doubt()] == \
        [("hq", 200, ("m0.fsm", "m1.fsm"))]
    assert spool.status().in_doubt_dequeues == 1
    resolution = spool.resolve_in_doubt("hq", database_log_received)
    assert resolution.dequeued == ("m0.fsm", "m1.fsm") and resolution.requeued == ()
    assert spool.inbound("hq") == ["m2.fsm", "m3.fsm"] and spool.in_doubt() == ()
    spool.close()
    spool = SpoolQueues(path)  # the resolution is durable
    assert spool.inbound("hq") == ["m2.fsm", "m3.fsm"] and spool.in_doubt() == ()
    spool.close()
    del token


def test_crash_before_the_database_commit_keeps_the_messages(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    for number in range(3):
        spool.put_inbound("hq", f"m{number}.fsm", payload("in", "hq", f"m{number}.fsm"))
    spool.begin_dequeue("hq", ["m0.fsm"], log_received=300)
    crash(spool)  # the apply never committed: log_received is still 100
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["m0.fsm", "m1.fsm", "m2.fsm"]  # in doubt, still listed
    resolution = spool.resolve_in_doubt("hq", 100)
    assert resolution.requeued == ("m0.fsm",) and resolution.dequeued == ()
    assert spool.read_inbound("hq", "m0.fsm") == payload("in", "hq", "m0.fsm")
    token = spool.begin_dequeue("hq", ["m0.fsm"], log_received=300)  # the retry
    spool.commit_dequeue(token)
    spool.close()
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["m1.fsm", "m2.fsm"] and spool.in_doubt() == ()
    spool.close()


def test_a_lazy_dequeue_commit_lost_in_a_crash_is_resolved(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    spool.put_inbound("hq", "m0.fsm", b"zero")
    token = spool.begin_dequeue("hq", ["m0.fsm"], log_received=10)
    spool.commit_dequeue(token)  # rides on the next group commit, which never comes
    assert spool.inbound("hq") == []
    crash(spool)
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["m0.fsm"] and len(spool.in_doubt()) == 1
    spool.resolve_in_doubt("hq", 10)
    assert spool.inbound("hq") == []
    spool.close()


def test_a_dequeue_torn_before_its_prepare_is_backed_out(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    for number in range(3):
        spool.put_inbound("hq", f"m{number}.fsm", payload("in", "hq", f"m{number}.fsm"))
    end = spool._log.next_rba
    spool.begin_dequeue("hq", ["m0.fsm", "m1.fsm", "m2.fsm"], log_received=50)
    spool.close()
    rbas = [rba for rba, _length in record_rbas(path) if rba >= end]
    cut_log(path, rbas[2])  # two DELETEs survive, the third and the PREPARE do not
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["m0.fsm", "m1.fsm", "m2.fsm"] and spool.in_doubt() == ()
    assert spool.last_restart.units_backed_out == 1 and spool.last_restart.compensation_records == 2
    check_contents(spool, {("in", "hq"): ("m0.fsm", "m1.fsm", "m2.fsm")})
    spool.close()


@pytest.mark.parametrize("crash_after", [1, 3, 5, 6])
def test_crash_during_restart_itself(tmp_path, crash_after):
    """Restart backs out a torn five-message purge with five compensation
    records and an ABORT; dying after the first, third or fifth of them, or
    after the ABORT, and restarting again must undo nothing twice."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path)
    names = [str(MessageName("f2", "f1", Kind.DATA, Header(0, 10 * number, 10 * number + 10)))
             for number in range(5)]
    for name in names:
        spool.put_outbound("f1", name, payload("out", "f1", name), 0)
    spool.close()
    spool = SpoolQueues(path)
    assert spool.purge_outbound("f1", 1) == 5  # one unit: five DELETEs and a COMMIT
    spool.close()
    cut_log(path, record_rbas(path)[-1][0])  # the COMMIT is lost: the unit is inflight
    with pytest.raises(_SimulatedCrash):
        SpoolQueues(path, _fault=fault_at("restart.compensating", after=crash_after))
    spool = SpoolQueues(path)
    assert spool.outbound("f1") == names
    check_contents(spool, {("out", "f1"): tuple(names)})
    assert spool.last_restart.compensation_records == 5 - min(crash_after, 5)
    assert spool.last_restart.units_backed_out == (0 if crash_after == 6 else 1)
    spool.close()
    spool = SpoolQueues(path)
    assert spool.outbound("f1") == names and spool.last_restart.units_backed_out == 0
    spool.close()


def test_torn_segment_creation(tmp_path):
    """A crash while a new segment's header was being written leaves a stub
    file: it is dropped and the log goes on in the previous segment."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path, segment_bytes=4096)
    number = 0
    while len(spool._log.segment_bases()) < 3:
        spool.put_inbound("hq", f"m{number:03d}.fsm", b"x" * 300)
        number += 1
    base = spool._log.segment_bases()[-1]
    spool.close()
    cut_log(path, base + 10)  # header cut short
    assert (path / f"{base:020d}.seg").stat().st_size == 10
    spool = SpoolQueues(path, segment_bytes=4096)
    expected_names = spool.inbound("hq")
    assert len(expected_names) < number and spool.last_restart.torn_bytes == 10
    spool.put_inbound("hq", "next.fsm", b"y")
    spool.close()
    spool = SpoolQueues(path, segment_bytes=4096)
    assert spool.inbound("hq") == sorted(expected_names + ["next.fsm"])
    spool.close()


def test_a_missing_segment_is_corruption(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path, segment_bytes=4096, relog="off")
    for number in range(40):
        spool.put_inbound("hq", f"m{number:03d}.fsm", b"x" * 300)
    bases = spool._log.segment_bases()
    spool.close()
    (path / f"{bases[2]:020d}.seg").unlink()
    with pytest.raises(SpoolCorrupt):
        SpoolQueues(path, segment_bytes=4096)
    assert not check_spool(path).ok


def test_the_footnote_pending_delete(tmp_path):
    """A delete read before the relog record it matches (the patent's
    footnote): the message's first copy lies before the restart position,
    its dequeue was logged, a checkpoint relogged it while the dequeue was in
    doubt, then the dequeue committed.  Restart reads DELETE (no match: a
    pending delete), then the relog copy, which it must discard."""
    path = tmp_path / "spool"
    options = dict(checkpoint_every=10**9, cpl_pairs=3)
    spool = SpoolQueues(path, **options)
    spool.put_inbound("hq", "old.fsm", b"old")  # interval 1
    cb2 = spool.checkpoint()
    spool.put_inbound("hq", "young.fsm", b"young")  # interval 2: keeps restart back at CB2
    spool.checkpoint()  # CB3
    token = spool.begin_dequeue("hq", ["old.fsm"], log_received=7)  # interval 3: DELETE, PREPARE
    stats = spool.checkpoint()  # CB4 relogs old.fsm (in doubt)
    assert stats.relogged == 1 and stats.restart_rba == cb2.begin_rba
    spool.commit_dequeue(token, wait=True)
    crash(spool)
    spool = SpoolQueues(path, **options)
    assert spool.last_restart.restart_rba == cb2.begin_rba
    assert spool.last_restart.pending_deletes == 1 and spool.last_restart.pending_deletes_matched == 1
    assert spool.inbound("hq") == ["young.fsm"] and spool.in_doubt() == ()
    spool.close()


def test_an_in_doubt_dequeue_survives_checkpoints_that_move_past_it(tmp_path):
    path = tmp_path / "spool"
    options = dict(checkpoint_every=10**9, cpl_pairs=2)
    spool = SpoolQueues(path, **options)
    spool.put_inbound("hq", "waiting.fsm", b"w")
    spool.begin_dequeue("hq", ["waiting.fsm"], log_received=42)
    crash(spool)
    spool = SpoolQueues(path, **options)
    for _ in range(6):  # relogged in doubt, again and again; its PREPARE falls out of the span
        spool.put_inbound("f2", "filler.fsm", b"f")
        spool.delete_inbound("f2", ["filler.fsm"])
        spool.checkpoint()
    crash(spool)
    spool = SpoolQueues(path, **options)
    assert [(doubt.names, doubt.last) for doubt in spool.in_doubt()] == [(("waiting.fsm",), 42)]
    assert spool.resolve_in_doubt("hq", 41).requeued == ("waiting.fsm",)
    spool.close()


def test_a_second_opener_is_locked_out(tmp_path):
    spool = SpoolQueues(tmp_path / "spool")
    with pytest.raises(SpoolLocked, match=f"open in another object of this process \\({os.getpid()}\\)"):
        SpoolQueues(tmp_path / "spool")
    spool.close()
    SpoolQueues(tmp_path / "spool").close()


def test_the_lock_names_the_process_that_holds_the_spool(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from agent.spool import SpoolQueues; "
                               f"s = SpoolQueues({str(tmp_path / 'spool')!r}); print('open', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        with pytest.raises(SpoolLocked, match=f"the spool is open in process {holder.pid}; stop that agent first"):
            SpoolQueues(tmp_path / "spool")
    finally:
        holder.communicate(timeout=30)
    SpoolQueues(tmp_path / "spool").close()  # its lock went with it


@pytest.mark.parametrize("crash", [False, True])
def test_an_in_doubt_relog_of_a_dequeue_that_later_committed_is_dropped(tmp_path, crash):
    """The checkpoint copies the message while its dequeue is in doubt; the
    dequeue then commits (or its lazy COMMIT is lost, and the database says
    it was applied).  Restart starts after the DELETE and must not bring the
    message back from its relog copy."""
    path = tmp_path / "spool"
    spool = SpoolQueues(path, relog="all", checkpoint_every=10**9)
    spool.put_inbound("hq", "m.fsm", b"x")
    token = spool.begin_dequeue("hq", ["m.fsm"], 10)
    stats = spool.checkpoint()
    spool.commit_dequeue(token)
    if crash:
        spool._abandon()
    else:
        spool.close()
    spool = SpoolQueues(path, relog="all", checkpoint_every=10**9)
    assert spool.last_restart.restart_rba == stats.begin_rba and spool.last_restart.relogs_honoured == 1
    spool.resolve_in_doubt("hq", 10)
    assert spool.inbound("hq") == [] and spool.in_doubt() == ()
    spool.close()


def test_a_checkpoint_that_fails_half_way_leaves_the_old_copies_in_charge(tmp_path):
    """Not a crash: the checkpoint raises after relogging (say, one copy did
    not read back) and the process goes on.  Its relog records will be
    ignored at restart, so later checkpoints must not count on them."""
    path = tmp_path / "spool"
    options = dict(checkpoint_every=10**9, cpl_pairs=2, segment_bytes=4096)
    spool = SpoolQueues(path, **options)
    for number in range(5):
        spool.put_inbound("hq", f"old-{number}.fsm", payload("in", "hq", f"old-{number}.fsm"))
    spool.checkpoint()

    def failing(where):
        if where == "checkpoint.before_cpl":
            raise OSError("disk trouble")

    spool._fault = failing
    with pytest.raises(OSError):
        spool.checkpoint()  # relogs all five, writes no CPL record
    spool._fault = None
    for checkpoints in range(4):  # a crash after each later checkpoint must find all five
        for number in range(10):
            name = f"passing-{checkpoints}-{number}.fsm"
            spool.put_outbound("f1", name, b"p" * 200, 0)
            spool.delete_outbound("f1", name)
        spool.checkpoint()
        expected = snapshot(spool)
        crash(spool)
        spool = SpoolQueues(path, **options)
        assert snapshot(spool) == expected and len(expected[0][("in", "hq")]) == 5
        check_contents(spool, expected[0])
    spool.close()
