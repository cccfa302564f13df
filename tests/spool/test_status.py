"""What ``agent status`` and ``agent spool check`` will show, and the space
the spool keeps."""

import logging

import pytest

from agent.queues import QueueDepth
from agent.spool import SpoolError, SpoolQueues, SpoolStatus, check_spool


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_status_reports_depths_oldest_age_and_restart_span(tmp_path):
    clock = Clock()
    spool = SpoolQueues(tmp_path / "spool", clock=clock, checkpoint_every=10**9)
    status = spool.status()
    assert isinstance(status, SpoolStatus)
    assert status.messages == 0 and status.oldest_age_seconds is None and status.depths == ()
    spool.put_outbound("f1", "first.fsm", b"x" * 100, 0)
    clock.now += 3600
    spool.put_inbound("hq", "second.fsm", b"y" * 50)
    clock.now += 86400 * 30  # a field site offline for a month
    spool.begin_dequeue("hq", ["second.fsm"], 10)
    status = spool.status()
    assert status.depths == (QueueDepth("f1", 0, 1), QueueDepth("hq", 1, 0))
    assert (status.messages, status.queued_bytes) == (2, 150)
    assert status.oldest_queue == "out/f1" and status.oldest_age_seconds == 3600 + 86400 * 30
    assert status.in_doubt_dequeues == 1
    assert status.restart_span_bytes == status.end_rba - status.restart_rba > 0
    assert status.log_start_rba == 0 and status.segments == 1 and status.disk_bytes >= status.end_rba
    assert (status.cpl_pairs, status.relog_mode, status.checkpoints) == (3, "selective", 1)
    spool.close()
    with pytest.raises(SpoolError):
        spool.status()


def test_a_month_long_wait_does_not_pin_the_log(tmp_path):
    """One message waits while many pass through: selective relogging moves
    its copy forward, old segments go, and the restart span stays small."""
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=200, segment_bytes=16 * 1024)
    spool.put_inbound("hq", "waiting.fsm", b"w" * 500)
    for number in range(3000):
        name = f"passing-{number}.fsm"
        spool.put_outbound("f1", name, b"p" * 300, 0)
        spool.delete_outbound("f1", name)
    status = spool.status()
    assert status.end_rba > 1_200_000
    assert status.log_start_rba > 1_000_000  # the first segments are gone
    assert status.disk_bytes < 200_000 and status.restart_span_bytes < 100_000
    assert spool.counters.relogged > 0
    spool.close()
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=200, segment_bytes=16 * 1024)
    assert spool.inbound("hq") == ["waiting.fsm"] and spool.read_inbound("hq", "waiting.fsm") == b"w" * 500
    assert spool.last_restart.bytes_read < 100_000
    spool.close()


def test_without_relogging_the_waiting_message_pins_the_log(tmp_path):
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=200, segment_bytes=16 * 1024, relog="off")
    spool.put_inbound("hq", "waiting.fsm", b"w" * 500)
    for number in range(1000):
        name = f"passing-{number}.fsm"
        spool.put_outbound("f1", name, b"p" * 300, 0)
        spool.delete_outbound("f1", name)
    status = spool.status()
    assert status.log_start_rba == 0 and status.restart_span_bytes > status.end_rba * 0.99
    spool.close()


def test_check_reports_queues_in_doubt_and_counts(tmp_path):
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=5)
    for number in range(4):
        spool.put_inbound("hq", f"in-{number}.fsm", b"i" * 10)
    spool.put_outbound("f1", "out-b.fsm", b"o", 1)
    spool.put_outbound("f1", "out-a.fsm", b"o", 1)
    spool.delete_inbound("hq", ["in-0.fsm"])
    spool.begin_dequeue("hq", ["in-1.fsm"], 500)
    spool._abandon()
    report = check_spool(tmp_path / "spool")
    assert report.ok and not report.corruption and report.torn_tail is None
    queues = {queue.queue: queue for queue in report.queues}
    assert queues["in/hq"].names == ("in-1.fsm", "in-2.fsm", "in-3.fsm") and queues["in/hq"].content_bytes == 30
    assert queues["out/f1"].names == ("out-b.fsm", "out-a.fsm")  # queue order
    assert [(unit.peer, unit.last, unit.names) for unit in report.in_doubt] == [("hq", 500, ("in-1.fsm",))]
    counts = dict(report.records_by_type)
    assert counts["ADD"] == 6 and counts["DELETE"] == 2 and counts["PREPARE"] == 1 and counts["CPL"] >= 2
    assert report.records == sum(counts.values()) and report.messages == 5
    text = "\n".join(report.lines())
    assert "OK" in text and "in-doubt dequeue" in text and "out/f1: 2 message(s)" in text
    assert report.restart_span_bytes == report.end_rba - report.restart_rba


def test_check_of_a_missing_or_empty_directory(tmp_path):
    assert not check_spool(tmp_path / "nothing").ok
    (tmp_path / "empty").mkdir()
    report = check_spool(tmp_path / "empty")
    assert not report.ok and "never opened" in report.problems[0]


def test_large_messages_checkpoint_by_bytes_so_the_log_does_not_grow_without_bound(tmp_path):
    """Few records but big ones (field sites that get a few large messages a
    day): checkpoints also run every ``checkpoint_bytes``, so old segments
    go although the record count never reaches ``checkpoint_every``."""
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=10**9, checkpoint_bytes=64 * 1024,
                        segment_bytes=16 * 1024)
    for number in range(200):
        name = f"big-{number}.fsm"
        spool.put_inbound("hq", name, bytes([number % 251]) * 10_000)
        spool.delete_inbound("hq", [name])
    status = spool.status()
    assert status.end_rba > 2_000_000 and status.checkpoints > 20
    assert status.disk_bytes < 400_000 and status.bytes_since_checkpoint < 64 * 1024 + 11_000
    assert status.checkpoint_bytes == 64 * 1024
    spool.close()
    with pytest.raises(SpoolError, match="checkpoint_bytes"):
        SpoolQueues(tmp_path / "other", checkpoint_bytes=100)


def test_a_clean_close_takes_a_termination_checkpoint_after_a_quarter_interval(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path, checkpoint_every=100)
    spool.put_outbound("f1", "kept.fsm", b"k" * 200, 0)
    spool.checkpoint()
    spool.checkpoint()  # "kept.fsm" is relogged: nothing old pins the restart position
    for number in range(13):  # over a quarter of the interval (a put is 2 records)
        spool.put_outbound("f1", f"m{number}.fsm", b"x" * 200, 0)
        spool.delete_outbound("f1", f"m{number}.fsm")
    assert spool.status().checkpoints == 3
    spool.close()
    spool = SpoolQueues(path, checkpoint_every=100)
    # The close checkpointed, so the start read from that checkpoint on.
    assert spool.status().checkpoints == 4 and spool.status().records_since_checkpoint == 0
    assert spool.last_restart.records_read < 8
    assert spool.outbound("f1") == ["kept.fsm"] and spool.read_outbound("f1", "kept.fsm") == b"k" * 200
    # Under a quarter: no checkpoint at close; the records are read again at the start.
    for number in range(5):  # 10 records
        spool.put_outbound("f1", f"n{number}.fsm", b"y" * 200, 0)
    spool.close()
    spool = SpoolQueues(path, checkpoint_every=100)
    assert spool.status().checkpoints == 4 and spool.status().records_since_checkpoint == 10  # a put is 2 records
    assert spool.outbound("f1") == ["kept.fsm"] + [f"n{number}.fsm" for number in range(5)]
    spool.close()


def test_a_failed_termination_checkpoint_still_closes_and_loses_nothing(tmp_path, caplog):
    path = tmp_path / "spool"

    full = []

    def disk_full(where: str) -> None:
        if full and where == "checkpoint.before_cpl":
            raise OSError(28, "No space left on device")

    caplog.set_level(logging.WARNING, logger="fieldsync.spool")  # whatever other tests set on "fieldsync"
    spool = SpoolQueues(path, checkpoint_every=8, _fault=disk_full)
    full.append(True)  # the disk fills up after the spool opened
    for number in range(3):
        spool.put_inbound("hq", f"m{number}.fsm", b"z" * 300)
    spool.close()
    assert "no termination checkpoint" in caplog.text and "No space left" in caplog.text
    spool = SpoolQueues(path, checkpoint_every=8)
    assert spool.inbound("hq") == ["m0.fsm", "m1.fsm", "m2.fsm"]
    assert spool.read_inbound("hq", "m2.fsm") == b"z" * 300
    assert spool.last_restart.relogs_ignored == 0 and spool.status().records_since_checkpoint >= 3
    spool.close()


def test_segments_removed_behind_the_anchor_are_refused_not_started_afresh(tmp_path):
    """Without its log the spool would open empty and the queued messages
    would be gone without a word: the anchor says a log existed."""
    from agent.spool import SpoolCorrupt

    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=5)
    for number in range(4):
        spool.put_outbound("f1", f"out-{number}.fsm", b"o" * 10, number)
    spool.close()
    segments = sorted((tmp_path / "spool").glob("*.seg"))
    assert segments and (tmp_path / "spool" / "anchor").exists()
    for segment in segments:
        segment.unlink()
    with pytest.raises(SpoolCorrupt, match="there are no segment files: segment files are missing"):
        SpoolQueues(tmp_path / "spool")
    assert not list((tmp_path / "spool").glob("*.seg"))  # nothing was started in their place
    report = check_spool(tmp_path / "spool")
    assert not report.ok and "an anchor names a checkpoint" in report.problems[0]


@pytest.mark.parametrize("kept", [False, True])
def test_a_checkpoint_forgets_the_queues_left_empty_and_a_restart_builds_none_of_them(tmp_path, kept):
    # A consolidated's first run queues a heartbeat for each of its peers
    # and sends it: every queue is used once and left empty.  After a
    # checkpoint neither the spool nor a restart holds them, and a restart
    # from it reads no record of them once every queue is empty.
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=10**9)
    for number in range(300):
        peer = f"r{number:03d}"
        spool.put_outbound(peer, f"{peer}.fsm", b"heartbeat", 0)
        spool.delete_outbound(peer, f"{peer}.fsm")
    if kept:
        spool.put_outbound("r007", "kept.fsm", b"data", 0)
    assert len(spool.depths()) == 300  # each used, none forgotten yet
    spool.checkpoint()
    expected = [QueueDepth("r007", 0, 1)] if kept else []
    assert spool.depths() == expected
    spool.close()
    check = check_spool(tmp_path / "spool")
    assert [queue.queue for queue in check.queues] == ["out/r007"] * kept and check.ok
    with SpoolQueues(tmp_path / "spool") as reopened:
        assert reopened.depths() == expected
        if kept:
            assert reopened.read_outbound("r007", "kept.fsm") == b"data"
        else:  # the restart read the checkpoint alone, not a record per queue ever used
            assert reopened.last_restart.records_read < 10
        reopened.put_outbound("r001", "again.fsm", b"more", 0)  # a forgotten queue is made again on use
        assert reopened.outbound("r001") == ["again.fsm"]
