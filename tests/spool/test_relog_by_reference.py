"""Format version 2 with a large queue (docs/spool-format.md, "Large
queues"): waiting messages are relogged by reference while the segment with
their content is kept, checkpoints write at most half the log, restart reads
metadata and not content, half-empty old segments are copied forward, and
version-1 segments still read."""

import struct
import zlib

import pytest

from agent.spool import SpoolCorrupt, SpoolQueues, check_spool
from agent.spool._format import SEGMENT_HEADER_SIZE
from agent.spool._log import list_segments

WAITING = 2000
CONTENT = 400
OPTIONS = dict(checkpoint_every=200, segment_bytes=256 * 1024)


def waiting_name(number: int) -> str:
    return f"hq.r.d.{number:010d}.fsm"


def waiting_content(number: int) -> bytes:
    return number.to_bytes(4, "little") * (CONTENT // 4)


def build(path, pairs: int, **options) -> SpoolQueues:
    """WAITING messages queued to 20 destinations and left there, then
    ``pairs`` other messages enqueued and dequeued."""
    spool = SpoolQueues(path, **{**OPTIONS, **options})
    with spool.group_commit():
        for number in range(WAITING):
            spool.put_outbound(f"r{number % 20:02d}", waiting_name(number), waiting_content(number), 0)
    passing = b"p" * CONTENT
    for first in range(0, pairs, 100):
        with spool.group_commit():
            for number in range(first, first + 100):
                peer, name = f"r{number % 20:02d}", f"hq.r.d.{WAITING + number:010d}.fsm"
                spool.put_outbound(peer, name, passing, 0)
                spool.delete_outbound(peer, name)
    return spool


def expect_waiting(spool: SpoolQueues) -> None:
    assert spool.status().messages == WAITING
    for number in (0, 1, WAITING // 2, WAITING - 1):
        assert spool.read_outbound(f"r{number % 20:02d}", waiting_name(number)) == waiting_content(number)


def test_checkpoints_write_less_than_the_content_logged_with_a_large_queue(tmp_path):
    pairs = 6000
    content_logged = (WAITING + pairs) * CONTENT
    spool = build(tmp_path / "spool", pairs)
    counters = spool.counters
    assert counters.checkpoints > 10 and counters.referenced > WAITING
    assert counters.checkpoint_bytes <= content_logged
    assert counters.relogged_bytes < content_logged / 10  # copies only to reclaim segments
    spool.close()
    # Copying every relogged message (version 1) writes many times the content.
    copying = build(tmp_path / "copying", pairs, relog_by_reference=False)
    assert copying.counters.checkpoint_bytes > 3 * content_logged and copying.counters.referenced == 0
    copying.close()


def test_a_checkpoint_waits_for_twice_its_cost_to_be_logged(tmp_path):
    pairs = 3000
    intervals = (2 * WAITING + 4 * pairs) // OPTIONS["checkpoint_every"]  # checkpoints by record count alone
    spool = build(tmp_path / "spool", pairs)
    assert spool.last_checkpoint.bytes_written > 20_000  # the REFS entries of about half the queue
    assert spool.counters.checkpoints < intervals / 2
    spool.close()
    copying = build(tmp_path / "copying", pairs, relog_by_reference=False)
    assert copying.counters.checkpoints >= intervals - 1
    copying.close()


def test_restart_reads_metadata_not_content_and_a_span_independent_of_history(tmp_path):
    read = []
    for pairs in (3000, 9000):
        spool = build(tmp_path / f"spool-{pairs}", pairs)
        spool._abandon()  # a crash
        spool = SpoolQueues(tmp_path / f"spool-{pairs}", **OPTIONS)
        restart = spool.last_restart
        expect_waiting(spool)
        assert restart.relogs_honoured >= WAITING
        assert restart.bytes_read < WAITING * CONTENT / 2  # the queued content is not read
        read.append(restart.bytes_read)
        spool.close()
    assert read[1] < 1.5 * read[0]  # three times the history, about the same span


def test_segments_holding_queued_content_are_kept_and_the_others_go(tmp_path):
    spool = build(tmp_path / "spool", 6000)
    status = spool.status()
    first = spool._log.segment_bases()[0]
    assert first == 0 and status.restart_rba > 1_000_000  # the waiting messages' segment stays
    bases = spool._log.segment_bases()
    assert any(later > earlier + OPTIONS["segment_bytes"] for earlier, later in zip(bases, bases[1:]))  # a gap
    assert status.disk_bytes < 2 * WAITING * CONTENT + 4 * OPTIONS["segment_bytes"] + status.restart_span_bytes
    spool.close()
    report = check_spool(tmp_path / "spool")
    assert report.ok and not report.corruption and report.messages == WAITING
    spool = SpoolQueues(tmp_path / "spool", **OPTIONS)
    expect_waiting(spool)
    spool.close()


def test_without_an_anchor_restart_reads_the_contiguous_part_of_the_log(tmp_path):
    spool = build(tmp_path / "spool", 6000)
    spool.close()
    (tmp_path / "spool" / "anchor").unlink()
    spool = SpoolQueues(tmp_path / "spool", **OPTIONS)
    assert not spool.last_restart.from_anchor and spool.last_restart.restart_rba > 1_000_000
    expect_waiting(spool)
    spool.close()


def test_a_half_empty_segment_kept_for_content_is_copied_forward(tmp_path):
    spool = build(tmp_path / "spool", 6000)
    disk = spool.status().disk_bytes
    staying = [number for number in range(WAITING) if number % 4 == 0]
    for number in range(WAITING):  # three in four of the waiting messages go
        if number % 4:
            spool.delete_outbound(f"r{number % 20:02d}", waiting_name(number))
    copied = spool.counters.relogged_bytes
    passing = b"p" * CONTENT
    for number in range(3000):
        spool.put_outbound("f1", f"later-{number}.fsm", passing, 0)
        spool.delete_outbound("f1", f"later-{number}.fsm")
    assert spool.counters.relogged_bytes >= copied + len(staying) * CONTENT  # every one copied forward
    assert spool._log.segment_bases()[0] > 0 and spool.status().disk_bytes < disk  # the old segments went
    spool.close()
    spool = SpoolQueues(tmp_path / "spool", **OPTIONS)
    assert spool.status().messages == len(staying)
    for number in staying:
        assert spool.read_outbound(f"r{number % 20:02d}", waiting_name(number)) == waiting_content(number)
    spool.close()


def test_a_removed_segment_holding_queued_content_is_refused(tmp_path):
    spool = build(tmp_path / "spool", 6000)
    spool.close()
    first = list_segments(tmp_path / "spool")[0]
    assert first.base == 0
    first.path.unlink()
    report = check_spool(tmp_path / "spool")
    assert not report.ok and any("reclaimed" in problem for problem in report.problems)
    with pytest.raises(SpoolCorrupt, match="segment files were removed"):
        SpoolQueues(tmp_path / "spool", **OPTIONS)


def _make_version_1(path) -> None:
    for segment in list_segments(path):
        with open(segment.path, "r+b") as handle:
            header = bytearray(handle.read(SEGMENT_HEADER_SIZE))
            header[:8] = b"FSSPOOL1"
            header[20:24] = struct.pack("<I", zlib.crc32(bytes(header[:20])))
            handle.seek(0)
            handle.write(header)


def test_a_version_1_spool_reads_and_is_continued_in_a_version_2_segment(tmp_path):
    path = tmp_path / "spool"
    spool = SpoolQueues(path, relog_by_reference=False)
    spool.put_inbound("hq", "kept.fsm", b"k" * 100)
    spool.put_outbound("f1", "out.fsm", b"o" * 50, 1)
    spool.close()
    _make_version_1(path)  # version 1 wrote the same records under the old magic
    spool = SpoolQueues(path)
    assert spool.read_inbound("hq", "kept.fsm") == b"k" * 100
    spool.put_inbound("hq", "new.fsm", b"n")
    spool.checkpoint()
    spool.close()
    segments = list_segments(path)
    assert [segment.path.read_bytes()[:8] for segment in segments] == [b"FSSPOOL1", b"FSSPOOL2"]
    spool = SpoolQueues(path)
    assert spool.inbound("hq") == ["kept.fsm", "new.fsm"] and spool.outbound("f1") == ["out.fsm"]
    assert spool.read_outbound("f1", "out.fsm") == b"o" * 50
    spool.close()
    assert check_spool(path).ok
