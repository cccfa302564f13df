"""The spool's bytes: segment headers, record frames and record payloads.

Rules of this file:
* It is the code form of ``docs/spool-format.md``; change both together.
  Everything is little-endian, fixed-width, with no padding.
* Pure functions and frozen values only: no files, no clock, no state.
* A frame's checksum covers the record's own RBA, so a record is valid only
  at the position it was written at.
* Decoding never trusts input: every malformed payload raises
  :class:`BadPayload`, which the readers turn into corruption at an RBA.
"""

from __future__ import annotations

import enum
import functools
import struct
import zlib
from dataclasses import dataclass

SEGMENT_MAGIC = b"FSSPOOL2"  # format version 2: what this code writes
SEGMENT_MAGIC_V1 = b"FSSPOOL1"  # version 1: read, never appended to
_SEGMENT_MAGICS = {SEGMENT_MAGIC: 2, SEGMENT_MAGIC_V1: 1}
SEGMENT_HEADER = struct.Struct("<8sQII")  # magic, base rba, reserved (0), crc32 of the first 20 bytes
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 24
ANCHOR_MAGIC = b"FSANCHR1"
ANCHOR = struct.Struct("<8sQQQI")  # magic, cpl rba, restart rba, checkpoint number, crc32 of the first 32 bytes

FRAME = struct.Struct("<IIB")  # crc32, payload length, type byte
FRAME_SIZE = FRAME.size  # 9
_CRC_SEED = struct.Struct("<QIB")  # rba, payload length, type byte
BATCH_START = 0x80  # type-byte flag: first record of one write (one group commit)
MAX_PAYLOAD = 256 * 1024 * 1024

NO_EPOCH = -1  # the epoch field of a message that has none (outbound control messages, inbound messages)


class RecordType(enum.IntEnum):
    ADD = 1
    DELETE = 2
    PREPARE = 3
    COMMIT = 4
    ABORT = 5
    UNDO_DELETE = 6  # compensation of a DELETE: puts the message back, with its content
    UNDO_ADD = 7  # compensation of an ADD: takes the message away
    CHECKPOINT_BEGIN = 8
    RELOG = 9
    QUEUE_CHECKPOINT = 10
    CPL = 11
    REFS = 12  # version 2: relogging by reference


class Direction(enum.IntEnum):
    INBOUND = 0
    OUTBOUND = 1

    @property
    def label(self) -> str:
        return "in" if self is Direction.INBOUND else "out"


class RelogState(enum.IntEnum):
    COMMITTED = 0
    IN_DOUBT_DELETE = 1


class RelogMode(enum.Enum):
    SELECTIVE = "selective"  # the patent's method: relog what the oldest CPL entry has aged out
    ALL = "all"  # every queued message at every checkpoint (IMS/SNAP, the prior art)
    OFF = "off"  # never relog; restart goes back to the oldest queued message


class BadPayload(ValueError):
    """A record payload does not decode."""


@dataclass(frozen=True, slots=True)
class QueueId:
    direction: Direction
    peer: str

    def __str__(self) -> str:
        return f"{self.direction.label}/{self.peer}"


# -- frames -------------------------------------------------------------------------------------


def frame_crc(rba: int, record_type: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(_CRC_SEED.pack(rba, len(payload), record_type)))


def encode_frame(rba: int, record_type: int, payload: bytes) -> bytes:
    return FRAME.pack(frame_crc(rba, record_type, payload), len(payload), record_type) + payload


def segment_header(base_rba: int) -> bytes:
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, base_rba, 0, 0)[:20]
    return head + struct.pack("<I", zlib.crc32(head))


def check_segment_header(data: bytes, base_rba: int) -> str | None:
    """Return what is wrong with a segment header, or None."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return f"segment header is {len(data)} bytes, not {SEGMENT_HEADER_SIZE}"
    magic, base, _reserved, crc = SEGMENT_HEADER.unpack_from(data)
    if magic not in _SEGMENT_MAGICS:
        return "not a spool segment (bad magic)"
    if crc != zlib.crc32(data[:20]):
        return "segment header checksum mismatch"
    if base != base_rba:
        return f"segment header says base RBA {base}, file name says {base_rba}"
    return None


def segment_version(header: bytes) -> int:
    """The format version of a segment whose header checked out."""
    return _SEGMENT_MAGICS[bytes(header[:8])]


def encode_anchor(cpl_rba: int, restart_rba: int, number: int) -> bytes:
    head = ANCHOR.pack(ANCHOR_MAGIC, cpl_rba, restart_rba, number, 0)[:32]
    return head + struct.pack("<I", zlib.crc32(head))


def decode_anchor(data: bytes) -> tuple[int, int, int] | None:
    if len(data) != ANCHOR.size:
        return None
    magic, cpl_rba, restart_rba, number, crc = ANCHOR.unpack(data)
    if magic != ANCHOR_MAGIC or crc != zlib.crc32(data[:32]):
        return None
    return cpl_rba, restart_rba, number


# -- payload pieces -------------------------------------------------------------------------------

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_U64X2 = struct.Struct("<QQ")
_U64X3 = struct.Struct("<QQQ")
_META = struct.Struct("<qd")  # epoch (NO_EPOCH for none), enqueued-at (unix seconds)
_RELOG_HEAD = struct.Struct("<QBQQ")  # irba, state, ur, last
_QUEUE_COUNTS = struct.Struct("<IQQ")  # messages, content bytes, oldest irba
_CPL_HEAD = struct.Struct("<QQQQBH")  # number, begin rba, restart rba, next ur, mode, pairs
_U32 = struct.Struct("<I")
_REF_HEAD = struct.Struct("<QQIIBqdH")  # irba, crba, length, size, state, epoch, enqueued-at, name length
REFS_PER_RECORD = 4096


@functools.lru_cache(maxsize=4096)
def _queue(queue: QueueId) -> bytes:
    peer = queue.peer.encode("ascii")
    return _U8.pack(int(queue.direction)) + _U8.pack(len(peer)) + peer


def _name(name: str) -> bytes:
    raw = name.encode("utf-8")
    return _U16.pack(len(raw)) + raw


def _epoch(epoch: int | None) -> int:
    return NO_EPOCH if epoch is None else epoch


# Decoded queue references by their bytes: restart meets the same few
# queues in every record, and one QueueId each saves building (and hashing) many.
_QUEUES_SEEN: dict[bytes, QueueId] = {}


class _Reader:
    """Walks a payload; any overrun or bad value is BadPayload."""

    __slots__ = ("data", "at")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: struct.Struct) -> tuple:
        if self.at + fmt.size > len(self.data):
            raise BadPayload("payload ends inside a field")
        values = fmt.unpack_from(self.data, self.at)
        self.at += fmt.size
        return values

    def raw(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise BadPayload("payload ends inside a field")
        value = bytes(self.data[self.at:self.at + size])
        self.at += size
        return value

    def queue(self) -> QueueId:
        if self.at + 2 <= len(self.data):
            end = self.at + 2 + self.data[self.at + 1]
            if end <= len(self.data):
                known = _QUEUES_SEEN.get(bytes(self.data[self.at:end]))
                if known is not None:
                    self.at = end
                    return known
        start = self.at
        direction, length = self.take(_U8)[0], self.take(_U8)[0]
        try:
            queue = QueueId(Direction(direction), self.raw(length).decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raise BadPayload(f"bad queue reference (direction {direction})") from None
        if len(_QUEUES_SEEN) < 65536:
            _QUEUES_SEEN[bytes(self.data[start:self.at])] = queue
        return queue

    def name(self) -> str:
        try:
            return self.raw(self.take(_U16)[0]).decode("utf-8")
        except UnicodeDecodeError:
            raise BadPayload("message name is not UTF-8") from None

    def meta(self) -> tuple[int | None, float]:
        epoch, enqueued_at = self.take(_META)
        if epoch < NO_EPOCH:
            raise BadPayload(f"bad epoch {epoch}")
        return (None if epoch == NO_EPOCH else epoch), enqueued_at

    def end(self) -> None:
        if self.at != len(self.data):
            raise BadPayload(f"{len(self.data) - self.at} unexpected bytes after the fields")


# -- records --------------------------------------------------------------------------------------
# Each decoded record is a small frozen value.  Content-carrying records keep
# only the content's length: the content is the payload's last ``size`` bytes,
# read again from the log when someone asks for the message.


@dataclass(frozen=True, slots=True)
class Add:
    ur: int
    queue: QueueId
    name: str
    epoch: int | None
    enqueued_at: float
    size: int


@dataclass(frozen=True, slots=True)
class Delete:
    ur: int
    irba: int
    queue: QueueId


@dataclass(frozen=True, slots=True)
class Prepare:
    ur: int
    last: int
    queue: QueueId


@dataclass(frozen=True, slots=True)
class Commit:
    ur: int


@dataclass(frozen=True, slots=True)
class Abort:
    ur: int


@dataclass(frozen=True, slots=True)
class UndoDelete:
    ur: int
    irba: int
    undone: int  # rba of the DELETE this compensates
    queue: QueueId
    name: str
    epoch: int | None
    enqueued_at: float
    size: int


@dataclass(frozen=True, slots=True)
class UndoAdd:
    ur: int
    irba: int
    undone: int  # rba of the ADD this compensates
    queue: QueueId


@dataclass(frozen=True, slots=True)
class CheckpointBegin:
    number: int


@dataclass(frozen=True, slots=True)
class Relog:
    irba: int
    state: RelogState
    ur: int  # the in-doubt unit of recovery, or 0
    last: int  # its resolution offset, or 0
    queue: QueueId
    name: str
    epoch: int | None
    enqueued_at: float
    size: int


@dataclass(frozen=True, slots=True)
class QueueCheckpoint:
    queue: QueueId
    messages: int
    content_bytes: int
    oldest_irba: int


@dataclass(frozen=True, slots=True)
class InDoubtEntry:
    ur: int
    last: int
    queue: QueueId


@dataclass(frozen=True, slots=True)
class CplRecord:
    number: int
    begin: int  # rba of this checkpoint's CHECKPOINT_BEGIN
    restart: int  # where the forward phase of a restart starts
    next_ur: int
    mode: RelogMode
    pairs: tuple[tuple[int, int], ...]  # oldest first; the newest pair's end is 0 = this record
    in_doubt: tuple[InDoubtEntry, ...]


# One entry of a REFS record, a plain tuple because restart decodes one per
# queued message (a hundred thousand of them must cost little):
# (irba, crba, length, size, state, epoch, enqueued_at, name, ur, last).
# ``crba``/``length``: the record holding the content; ``ur``/``last`` are 0
# unless ``state`` is IN_DOUBT_DELETE.
Ref = tuple[int, int, int, int, RelogState, int | None, float, str, int, int]


@dataclass(frozen=True, slots=True)
class Refs:
    queue: QueueId
    entries: tuple[Ref, ...]


Record = (Add | Delete | Prepare | Commit | Abort | UndoDelete | UndoAdd | CheckpointBegin | Relog | QueueCheckpoint
          | CplRecord | Refs)

_KINDS = {int(kind): kind for kind in RecordType}
_MODE_CODES = {RelogMode.SELECTIVE: 0, RelogMode.ALL: 1, RelogMode.OFF: 2}
_MODES = {code: mode for mode, code in _MODE_CODES.items()}


def encode_add(ur: int, queue: QueueId, name: str, epoch: int | None, enqueued_at: float, data: bytes) -> bytes:
    return b"".join((_U64.pack(ur), _queue(queue), _name(name), _META.pack(_epoch(epoch), enqueued_at), data))


def encode_delete(ur: int, irba: int, queue: QueueId) -> bytes:
    return _U64X2.pack(ur, irba) + _queue(queue)


def encode_prepare(ur: int, last: int, queue: QueueId) -> bytes:
    return _U64X2.pack(ur, last) + _queue(queue)


def encode_end(ur: int) -> bytes:
    return _U64.pack(ur)


def encode_undo_delete(ur: int, irba: int, undone: int, queue: QueueId, name: str, epoch: int | None,
                       enqueued_at: float, data: bytes) -> bytes:
    return b"".join((_U64X3.pack(ur, irba, undone), _queue(queue), _name(name),
                     _META.pack(_epoch(epoch), enqueued_at), data))


def encode_undo_add(ur: int, irba: int, undone: int, queue: QueueId) -> bytes:
    return _U64X3.pack(ur, irba, undone) + _queue(queue)


def encode_checkpoint_begin(number: int) -> bytes:
    return _U64.pack(number)


def encode_relog(irba: int, state: RelogState, ur: int, last: int, queue: QueueId, name: str, epoch: int | None,
                 enqueued_at: float, data: bytes) -> bytes:
    return b"".join((_RELOG_HEAD.pack(irba, int(state), ur, last), _queue(queue), _name(name),
                     _META.pack(_epoch(epoch), enqueued_at), data))


def encode_queue_checkpoint(queue: QueueId, messages: int, content_bytes: int, oldest_irba: int) -> bytes:
    return _queue(queue) + _QUEUE_COUNTS.pack(messages, content_bytes, oldest_irba)


def encode_refs(queue: QueueId, entries: list[Ref] | tuple[Ref, ...]) -> bytes:
    if len(entries) > REFS_PER_RECORD:
        raise ValueError(f"{len(entries)} entries in one REFS record (at most {REFS_PER_RECORD})")
    parts = [_queue(queue), _U32.pack(len(entries))]
    for irba, crba, length, size, state, epoch, enqueued_at, name, ur, last in entries:
        raw = name.encode("utf-8")
        parts.append(_REF_HEAD.pack(irba, crba, length, size, int(state), _epoch(epoch), enqueued_at, len(raw)))
        parts.append(raw)
        if state is RelogState.IN_DOUBT_DELETE:
            parts.append(_U64X2.pack(ur, last))
    return b"".join(parts)


def _decode_refs(payload: bytes | memoryview) -> Refs:
    reader = _Reader(payload)
    queue = reader.queue()
    (count,) = reader.take(_U32)
    if count > REFS_PER_RECORD:
        raise BadPayload(f"{count} entries in one REFS record")
    at, end, head = reader.at, len(payload), _REF_HEAD.size
    unpack, pair = _REF_HEAD.unpack_from, _U64X2.unpack_from
    committed, in_doubt = RelogState.COMMITTED, RelogState.IN_DOUBT_DELETE
    entries = []
    try:
        for _ in range(count):
            irba, crba, length, size, state, epoch, enqueued_at, name_length = unpack(payload, at)
            at += head
            if at + name_length > end:
                raise BadPayload("payload ends inside a field")
            name = str(payload[at:at + name_length], "utf-8")
            at += name_length
            if state == 0:
                ur = last = 0
                relog_state = committed
            elif state == 1:
                ur, last = pair(payload, at)
                at += 16
                relog_state = in_doubt
            else:
                raise BadPayload(f"bad relog state {state}")
            if epoch < NO_EPOCH:
                raise BadPayload(f"bad epoch {epoch}")
            entries.append((irba, crba, length, size, relog_state, None if epoch == NO_EPOCH else epoch,
                            enqueued_at, name, ur, last))
    except struct.error:
        raise BadPayload("payload ends inside a field") from None
    except UnicodeDecodeError:
        raise BadPayload("message name is not UTF-8") from None
    if at != end:
        raise BadPayload(f"{end - at} unexpected bytes after the fields")
    return Refs(queue, tuple(entries))


def encode_cpl(record: CplRecord) -> bytes:
    parts = [_CPL_HEAD.pack(record.number, record.begin, record.restart, record.next_ur, _MODE_CODES[record.mode],
                            len(record.pairs))]
    parts.extend(_U64X2.pack(begin, end) for begin, end in record.pairs)
    parts.append(struct.pack("<I", len(record.in_doubt)))
    for entry in record.in_doubt:
        parts.append(_U64X2.pack(entry.ur, entry.last) + _queue(entry.queue))
    return b"".join(parts)


def decode_payload(record_type: int, payload: bytes | memoryview) -> Record:
    """Decode one payload; raise BadPayload if it is malformed."""
    if record_type == 4 and len(payload) == 8:  # COMMIT, half the records of a busy log
        return Commit(_U64.unpack_from(payload)[0])
    if record_type == 2 and len(payload) >= 18:  # DELETE of a known queue
        queue = _QUEUES_SEEN.get(bytes(payload[16:]))
        if queue is not None:
            return Delete(*_U64X2.unpack_from(payload), queue)
    reader = _Reader(payload)
    kind = _KINDS.get(record_type)
    if kind is None:
        raise BadPayload(f"unknown record type {record_type}")
    record: Record
    if kind is RecordType.ADD:
        (ur,) = reader.take(_U64)
        queue, name = reader.queue(), reader.name()
        epoch, enqueued_at = reader.meta()
        return Add(ur, queue, name, epoch, enqueued_at, len(payload) - reader.at)
    if kind is RecordType.UNDO_DELETE:
        ur, irba, undone = reader.take(_U64X3)
        queue, name = reader.queue(), reader.name()
        epoch, enqueued_at = reader.meta()
        return UndoDelete(ur, irba, undone, queue, name, epoch, enqueued_at, len(payload) - reader.at)
    if kind is RecordType.RELOG:
        irba, state, ur, last = reader.take(_RELOG_HEAD)
        queue, name = reader.queue(), reader.name()
        epoch, enqueued_at = reader.meta()
        try:
            relog_state = RelogState(state)
        except ValueError:
            raise BadPayload(f"bad relog state {state}") from None
        return Relog(irba, relog_state, ur, last, queue, name, epoch, enqueued_at, len(payload) - reader.at)
    if kind is RecordType.REFS:
        return _decode_refs(payload)
    if kind is RecordType.DELETE:
        ur, irba = reader.take(_U64X2)
        record = Delete(ur, irba, reader.queue())
    elif kind is RecordType.PREPARE:
        ur, last = reader.take(_U64X2)
        record = Prepare(ur, last, reader.queue())
    elif kind is RecordType.COMMIT:
        record = Commit(reader.take(_U64)[0])
    elif kind is RecordType.ABORT:
        record = Abort(reader.take(_U64)[0])
    elif kind is RecordType.UNDO_ADD:
        ur, irba, undone = reader.take(_U64X3)
        record = UndoAdd(ur, irba, undone, reader.queue())
    elif kind is RecordType.CHECKPOINT_BEGIN:
        record = CheckpointBegin(reader.take(_U64)[0])
    elif kind is RecordType.QUEUE_CHECKPOINT:
        queue = reader.queue()
        record = QueueCheckpoint(queue, *reader.take(_QUEUE_COUNTS))
    else:  # CPL
        number, begin, restart, next_ur, mode, count = reader.take(_CPL_HEAD)
        if mode not in _MODES:
            raise BadPayload(f"bad relog mode {mode}")
        pairs = tuple(reader.take(_U64X2) for _ in range(count))
        (doubtful,) = reader.take(struct.Struct("<I"))
        in_doubt = []
        for _ in range(doubtful):
            entry_ur, entry_last = reader.take(_U64X2)
            in_doubt.append(InDoubtEntry(entry_ur, entry_last, reader.queue()))
        record = CplRecord(number, begin, restart, next_ur, _MODES[mode], pairs, tuple(in_doubt))
    reader.end()
    return record
