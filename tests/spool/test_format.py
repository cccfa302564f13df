"""The record format of docs/spool-format.md: every record type round-trips,
frames are bound to their RBA, and malformed payloads are refused."""

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.spool import _format as fmt
from agent.spool._format import (Add, BadPayload, CheckpointBegin, Commit, CplRecord, Delete, Direction,
                                 InDoubtEntry, Prepare, QueueCheckpoint, QueueId, RecordType, Relog, RelogMode,
                                 RelogState, UndoAdd, UndoDelete)

IN = QueueId(Direction.INBOUND, "hq")
OUT = QueueId(Direction.OUTBOUND, "field-7")


def test_every_record_type_round_trips():
    cases = [
        (RecordType.ADD, fmt.encode_add(7, IN, "a.fsm", None, 1.5, b"content"), Add(7, IN, "a.fsm", None, 1.5, 7)),
        (RecordType.ADD, fmt.encode_add(8, OUT, "b", 3, 2.0, b""), Add(8, OUT, "b", 3, 2.0, 0)),
        (RecordType.DELETE, fmt.encode_delete(9, 4096, OUT), Delete(9, 4096, OUT)),
        (RecordType.PREPARE, fmt.encode_prepare(10, 942712, IN), Prepare(10, 942712, IN)),
        (RecordType.COMMIT, fmt.encode_end(11), Commit(11)),
        (RecordType.ABORT, fmt.encode_end(12), fmt.Abort(12)),
        (RecordType.UNDO_DELETE, fmt.encode_undo_delete(13, 100, 200, IN, "c", None, 3.0, b"xyz"),
         UndoDelete(13, 100, 200, IN, "c", None, 3.0, 3)),
        (RecordType.UNDO_ADD, fmt.encode_undo_add(14, 300, 300, OUT), UndoAdd(14, 300, 300, OUT)),
        (RecordType.CHECKPOINT_BEGIN, fmt.encode_checkpoint_begin(5), CheckpointBegin(5)),
        (RecordType.RELOG, fmt.encode_relog(100, RelogState.IN_DOUBT_DELETE, 15, 77, IN, "d", None, 4.0, b"q"),
         Relog(100, RelogState.IN_DOUBT_DELETE, 15, 77, IN, "d", None, 4.0, 1)),
        (RecordType.QUEUE_CHECKPOINT, fmt.encode_queue_checkpoint(OUT, 3, 3000, 24), QueueCheckpoint(OUT, 3, 3000, 24)),
    ]
    refs = ((4096, 2048, 1100, 1024, RelogState.COMMITTED, 3, 5.0, "r.fsm", 0, 0),
            (8192, 9000, 60, 7, RelogState.IN_DOUBT_DELETE, None, 6.0, "é", 15, 77))
    cases.append((RecordType.REFS, fmt.encode_refs(OUT, refs), fmt.Refs(OUT, refs)))
    cases.append((RecordType.REFS, fmt.encode_refs(IN, ()), fmt.Refs(IN, ())))
    cpl = CplRecord(4, 1000, 900, 99, RelogMode.SELECTIVE, ((900, 950), (1000, 0)), (InDoubtEntry(15, 77, IN),))
    cases.append((RecordType.CPL, fmt.encode_cpl(cpl), cpl))
    for record_type, payload, expected in cases:
        assert fmt.decode_payload(record_type, payload) == expected
        if hasattr(expected, "size") and expected.size:
            assert payload.endswith(b"content" if expected.size == 7 else payload[-expected.size:])


def test_the_frame_layout_of_the_doc():
    payload = fmt.encode_end(1)
    frame = fmt.encode_frame(4096, RecordType.COMMIT | fmt.BATCH_START, payload)
    crc, length, type_byte = struct.unpack_from("<IIB", frame)
    assert (length, type_byte, frame[9:]) == (8, 0x84, payload)
    assert crc == zlib.crc32(payload, zlib.crc32(struct.pack("<QIB", 4096, 8, 0x84)))


def test_a_frame_is_valid_only_at_its_own_rba():
    payload = fmt.encode_end(1)
    assert fmt.frame_crc(100, 4, payload) != fmt.frame_crc(101, 4, payload)


def test_segment_header_and_anchor():
    header = fmt.segment_header(1 << 40)
    assert len(header) == fmt.SEGMENT_HEADER_SIZE == 24 and header[:8] == b"FSSPOOL2"
    assert fmt.check_segment_header(header, 1 << 40) is None and fmt.segment_version(header) == 2
    # A version-1 segment (FSSPOOL1) still reads.
    old = b"FSSPOOL1" + header[8:20]
    old += struct.pack("<I", zlib.crc32(old))
    assert fmt.check_segment_header(old, 1 << 40) is None and fmt.segment_version(old) == 1
    assert "bad magic" in fmt.check_segment_header(b"FSSPOOL3" + old[8:], 1 << 40)
    assert "base RBA" in fmt.check_segment_header(header, 0)
    assert "checksum" in fmt.check_segment_header(header[:10] + b"\xff" + header[11:], 1 << 40)
    anchor = fmt.encode_anchor(5000, 4000, 9)
    assert len(anchor) == 36 and fmt.decode_anchor(anchor) == (5000, 4000, 9)
    assert fmt.decode_anchor(anchor[:-1] + b"\x00") is None
    assert fmt.decode_anchor(anchor[:20]) is None


@pytest.mark.parametrize("record_type,payload", [
    (RecordType.COMMIT, b"\x01\x02"),  # too short
    (RecordType.COMMIT, fmt.encode_end(1) + b"x"),  # trailing bytes
    (RecordType.DELETE, struct.pack("<QQ", 1, 2) + b"\x07\x02hq"),  # bad direction
    (RecordType.DELETE, struct.pack("<QQ", 1, 2) + b"\x00\x05hq"),  # queue name cut short
    (RecordType.ADD, struct.pack("<Q", 1) + b"\x00\x02hq" + b"\x02\x00\xff\xfe" + struct.pack("<qd", 0, 0)),
    (RecordType.RELOG, struct.pack("<QBQQ", 1, 9, 0, 0) + b"\x00\x02hq\x00\x00" + struct.pack("<qd", -1, 0)),
    (RecordType.ADD, struct.pack("<Q", 1) + b"\x00\x02hq\x00\x00" + struct.pack("<qd", -5, 0)),
    (99, b""),
    (RecordType.REFS, b"\x00\x02hq" + struct.pack("<I", 1)),  # fewer entries than counted
    (RecordType.REFS, b"\x00\x02hq" + struct.pack("<I", 1) + struct.pack("<QQIIBqdH", 1, 1, 9, 0, 2, -1, 0, 0)),
    (RecordType.REFS, b"\x00\x02hq" + struct.pack("<I", 1) + struct.pack("<QQIIBqdH", 1, 1, 9, 0, 0, -1, 0, 4)),
    (RecordType.REFS, b"\x00\x02hq" + struct.pack("<I", 1) + struct.pack("<QQIIBqdH", 1, 1, 9, 0, 1, -1, 0, 0)),
    (RecordType.REFS, b"\x00\x02hq" + struct.pack("<I", 0) + b"x"),
])
def test_malformed_payloads_are_refused(record_type, payload):
    with pytest.raises(BadPayload):
        fmt.decode_payload(record_type, payload)


@given(ur=st.integers(0, 2**64 - 1), name=st.text(min_size=1, max_size=60),
       epoch=st.one_of(st.none(), st.integers(0, 2**63 - 1)), at=st.floats(allow_nan=False),
       data=st.binary(max_size=300), peer=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,47}", fullmatch=True))
def test_add_round_trips_any_value(ur, name, epoch, at, data, peer):
    queue = QueueId(Direction.OUTBOUND, peer)
    payload = fmt.encode_add(ur, queue, name, epoch, at, data)
    assert fmt.decode_payload(RecordType.ADD, payload) == Add(ur, queue, name, epoch, at, len(data))
    assert payload[len(payload) - len(data):] == data


@given(st.binary(max_size=64), st.integers(1, 12))
def test_garbage_never_escapes_as_another_error(garbage, record_type):
    try:
        fmt.decode_payload(record_type, garbage)
    except BadPayload:
        pass
