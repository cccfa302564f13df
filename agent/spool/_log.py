"""The recovery log: segment files of framed records, one RBA space.

Rules of this file:
* RBA = byte position in the log as if all segments were one file; a
  segment named ``<base>.seg`` holds RBAs ``base`` up to the next segment's
  base, starting with its 24-byte header.  A record never spans segments.
* :class:`LogWriter` is the only code that writes segment files.  Records are
  appended to a memory buffer (under the caller's lock) and written and
  fsynced by whichever waiting thread becomes the *leader* of the next group
  commit: one fsync covers every record appended before it started.
* The first record of each group-commit write carries ``BATCH_START``.  A
  write starts only after the previous one was fsynced, so a valid
  batch-start record after a bad one proves the bad one was durable once:
  that is corruption, not a torn write.  :func:`scan` applies this rule.
* Segments before the restart position may be gone between kept ones
  (kept for the message content they hold); from the restart position on,
  and from the first segment after the last gap, the log is contiguous.
  The writer appends only to a segment of the current format version.
* A failed write or fsync poisons the writer: what reached the disk is
  unknown, so the spool must be reopened (never retry an fsync).
"""

from __future__ import annotations

import mmap
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from codec.fsutil import fsync_directory

from ._errors import SpoolCorrupt, SpoolError
from ._format import (BATCH_START, FRAME, FRAME_SIZE, MAX_PAYLOAD, SEGMENT_HEADER_SIZE, RecordType,
                      check_segment_header, frame_crc, segment_header, segment_version)

SEGMENT_SUFFIX = ".seg"
_SEGMENT_NAME = re.compile(r"(\d{20})\.seg\Z")
_VALID_TYPES = frozenset(int(t) for t in RecordType)
# Every type byte a valid record can have, with and without the batch flag.
_TYPE_BYTES = sorted(_VALID_TYPES | {t | BATCH_START for t in _VALID_TYPES})
_BATCH_TYPE_BYTES = [t | BATCH_START for t in sorted(_VALID_TYPES)]
_ZERO_AHEAD = 1 << 20  # zeros kept written after the end of the log


def segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class SegmentFile:
    base: int
    path: Path
    size: int


def list_segments(directory: Path) -> list[SegmentFile]:
    found = []
    for path in directory.iterdir():
        match = _SEGMENT_NAME.match(path.name)
        if match and path.is_file():
            found.append(SegmentFile(int(match.group(1)), path, path.stat().st_size))
    found.sort(key=lambda segment: segment.base)
    return found


def contiguous_start(segments: list[SegmentFile]) -> int:
    """Index of the first segment after the last gap between segments
    (segments before the restart position may have been reclaimed while
    older ones holding queued messages' content stay)."""
    index = len(segments) - 1
    while index > 0 and segments[index - 1].base + segments[index - 1].size == segments[index].base:
        index -= 1
    return max(index, 0)


# -- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Corruption:
    rba: int
    segment: str
    reason: str


@dataclass(frozen=True, slots=True)
class TornTail:
    rba: int  # where the valid log ends
    segment: str
    discarded: int  # bytes after it (a torn write of the last group commit)
    reason: str


@dataclass(slots=True)
class ScanResult:
    """What a scan found besides the records it yielded."""

    start: int
    end: int = 0  # RBA after the last valid record (the writer continues here)
    bytes_read: int = 0  # bytes of records read (the span), not counting spare zeros
    records: int = 0
    torn: TornTail | None = None
    corruption: list[Corruption] = field(default_factory=list)
    dropped_segment: str | None = None  # a last segment whose header never made it to disk
    spare: int = 0  # zeros the writer put after the end of the log (not a torn write)


def _last_nonzero(data, start: int, size: int) -> int:
    """Offset just after the last non-zero byte of ``data[start:size]`` (or ``start``)."""
    position = size
    step = 1 << 20
    while position > start:
        low = max(start, position - step)
        chunk = bytes(data[low:position])
        stripped = len(chunk.rstrip(b"\0"))
        if stripped:
            return low + stripped
        position = low
    return start


def _frame_problem(view: memoryview, offset: int, rba: int) -> tuple[str | None, int, int]:
    """Check the frame at ``offset``; return (problem, type byte, payload length)."""
    limit = len(view)
    if offset + FRAME_SIZE > limit:
        return "record header cut short", 0, 0
    crc, length, type_byte = FRAME.unpack_from(view, offset)
    if (type_byte & ~BATCH_START) not in _VALID_TYPES:
        return f"bad record type byte {type_byte:#04x}", type_byte, length
    if length > MAX_PAYLOAD:
        return f"impossible record length {length}", type_byte, length
    if offset + FRAME_SIZE + length > limit:
        return f"record of {length} bytes cut short", type_byte, length
    if frame_crc(rba, type_byte, view[offset + FRAME_SIZE:offset + FRAME_SIZE + length]) != crc:
        return "checksum mismatch", type_byte, length
    return None, type_byte, length


def _next_valid(view: memoryview, after: int, base: int, type_bytes: list[int]) -> int | None:
    """Offset of the first valid frame after ``after`` whose type byte is one of ``type_bytes``."""
    data = view.obj if isinstance(view.obj, (bytes, mmap.mmap)) else bytes(view)
    candidates = set()
    for type_byte in type_bytes:
        needle = bytes((type_byte,))
        position = data.find(needle, after + 8)
        while position != -1:
            candidates.add(position - 8)
            position = data.find(needle, position + 1)
    for offset in sorted(candidates):
        if offset > after and _frame_problem(view, offset, base + offset)[0] is None:
            return offset
    return None


def scan(segments: list[SegmentFile], start: int, result: ScanResult, *, salvage: bool = False,
         gaps: bool = False) -> Iterator[tuple[int, int, memoryview]]:
    """Yield ``(rba, type byte, payload)`` for every valid record from ``start``.

    A bad record in the last segment with no valid batch-start record after
    it is a torn tail: the scan ends there (``result.torn``).  Any other bad
    record is corruption: raised as :class:`SpoolCorrupt`, or with
    ``salvage`` recorded in ``result.corruption`` and skipped.  With
    ``gaps``, a segment that ends before the next one starts is not a
    problem (reading a log with reclaimed segments between kept ones).
    Payload views are valid only until the next record is yielded.
    """
    if not segments:
        result.end = start
        return
    if start < segments[0].base + SEGMENT_HEADER_SIZE:
        if start < segments[0].base:
            raise SpoolCorrupt(start, segment_name(segments[0].base),
                               f"the log starts at RBA {segments[0].base}; RBA {start} was reclaimed")
        start = segments[0].base + SEGMENT_HEADER_SIZE
    index = 0
    while index + 1 < len(segments) and segments[index + 1].base <= start:
        index += 1
    result.end = start

    def problem(rba: int, segment: SegmentFile, reason: str) -> None:
        corruption = Corruption(rba, segment.path.name, reason)
        if not salvage:
            raise SpoolCorrupt(rba, segment.path.name, reason)
        result.corruption.append(corruption)

    for position in range(index, len(segments)):
        segment = segments[position]
        last = position == len(segments) - 1
        if position + 1 < len(segments) and segment.base + segment.size != segments[position + 1].base \
                and not (gaps and segment.base + segment.size < segments[position + 1].base):
            problem(segment.base + min(segment.size, segments[position + 1].base - segment.base), segment,
                    f"segment holds {segment.size} bytes but the next segment starts at RBA "
                    f"{segments[position + 1].base}")
        with open(segment.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                data: bytes | mmap.mmap = b""
            else:
                data = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
            view = memoryview(data)
            try:
                header_problem = check_segment_header(bytes(view[:SEGMENT_HEADER_SIZE]), segment.base)
                if header_problem is not None:
                    if last and position > 0 and _next_valid(view, -1, segment.base, _TYPE_BYTES) is None:
                        # The rollover that created it crashed before its header was durable.
                        result.dropped_segment = segment.path.name
                        result.torn = TornTail(segment.base, segment.path.name, size, header_problem)
                        result.end = segment.base
                        return
                    problem(segment.base, segment, header_problem)
                    continue
                offset = max(start - segment.base, SEGMENT_HEADER_SIZE) if position == index else SEGMENT_HEADER_SIZE
                if position == index and start > segment.base + size:
                    raise SpoolCorrupt(start, segment.path.name, f"RBA {start} is past the end of the log")
                first_offset = offset
                result.end = segment.base + offset
                while offset < size:
                    rba = segment.base + offset
                    reason, type_byte, length = _frame_problem(view, offset, rba)
                    if reason is None:
                        payload = view[offset + FRAME_SIZE:offset + FRAME_SIZE + length]
                        result.records += 1
                        result.end = rba + FRAME_SIZE + length
                        yield rba, type_byte, payload
                        payload.release()
                        offset += FRAME_SIZE + length
                        continue
                    if last:
                        later = _next_valid(view, offset, segment.base, _BATCH_TYPE_BYTES)
                        if later is None:
                            used = _last_nonzero(data, offset, size)
                            result.spare = size - used
                            if used > offset:
                                result.torn = TornTail(rba, segment.path.name, used - offset, reason)
                            result.end = rba
                            result.bytes_read += offset - first_offset
                            return
                        problem(rba, segment, reason + " (valid records follow: not a torn write)")
                    else:
                        problem(rba, segment, reason)
                        later = _next_valid(view, offset, segment.base, _TYPE_BYTES)
                        if later is None:
                            break
                    offset = later
                result.bytes_read += offset - first_offset
                if not last:
                    result.end = segment.base + size
            finally:
                view.release()
                if isinstance(data, mmap.mmap):
                    data.close()


def read_record_at(path: Path, base: int, rba: int) -> tuple[int, bytes]:
    """Read and verify one record from a segment file (for offline checks)."""
    with open(path, "rb") as handle:
        return _read_verified(handle.fileno(), base, rba)


def _read_verified(fd: int, base: int, rba: int, length: int = 0) -> tuple[int, bytes]:
    """Read the record at ``rba``; ``length`` (its whole size, when known) saves a read."""
    if length:
        data = os.pread(fd, length, rba - base)
        if len(data) == length:
            crc, size, type_byte = FRAME.unpack_from(data)
            payload = data[FRAME_SIZE:]
            if size == length - FRAME_SIZE and frame_crc(rba, type_byte, payload) == crc:
                return type_byte & ~BATCH_START, payload
        raise SpoolCorrupt(rba, segment_name(base), "record does not verify")
    head = os.pread(fd, FRAME_SIZE, rba - base)
    if len(head) < FRAME_SIZE:
        raise SpoolCorrupt(rba, segment_name(base), "record header cut short")
    crc, length, type_byte = FRAME.unpack(head)
    if length > MAX_PAYLOAD:
        raise SpoolCorrupt(rba, segment_name(base), f"impossible record length {length}")
    payload = os.pread(fd, length, rba - base + FRAME_SIZE)
    if len(payload) < length or frame_crc(rba, type_byte, payload) != crc:
        raise SpoolCorrupt(rba, segment_name(base), "record does not verify")
    return type_byte & ~BATCH_START, payload


# -- writing ---------------------------------------------------------------------------------------


class LogWriter:
    """Appends records and makes them durable by group commit."""

    def __init__(self, directory: Path, *, segments: list[SegmentFile], end: int, segment_bytes: int,
                 fsync: bool) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._cond = threading.Condition(threading.Lock())
        self._bases: list[int] = [segment.base for segment in segments]
        # Where each segment but the one written ends (segments may be missing between them).
        self._ends: dict[int, int] = {segment.base: segment.base + segment.size for segment in segments[:-1]}
        self._read_fds: dict[int, int] = {}
        self._failed: BaseException | None = None
        if not segments:
            self._create_segment(0, segment_header(0))
            self._bases = [0]
            end = SEGMENT_HEADER_SIZE
        base = self._bases[-1]
        self._write_base = base
        self._write_fd = os.open(directory / segment_name(base), os.O_WRONLY)
        self._filled = os.fstat(self._write_fd).st_size  # bytes after the log's end are zeros
        if self._filled < end - base:
            raise SpoolError(f"{segment_name(base)}: the writer expected it to reach RBA {end}")
        self._write_offset = end - base
        # A segment of an older format version is not appended to: the next record starts a new one.
        if segments:
            with open(directory / segment_name(base), "rb") as handle:
                header = handle.read(SEGMENT_HEADER_SIZE)
        else:
            header = segment_header(base)
        self._roll = check_segment_header(header, base) is None and segment_version(header) != 2
        # Appending side (guarded by the caller's lock and self._cond):
        self._next = end
        self._assign_base = base
        self._chunks: list[tuple[int, bytearray]] = [(base, bytearray())]
        self._pending_records = 0
        # Flushing side:
        self._written = end  # everything before is written (and fsynced when self.fsync)
        self._flushing = False
        self._waiting: list[tuple[int, threading.Lock]] = []  # parked threads: (target, their lock)
        self._parkers = threading.local()
        self.syncs = 0

    # -- properties ----------------------------------------------------------------------------

    @property
    def next_rba(self) -> int:
        return self._next

    @property
    def durable_rba(self) -> int:
        return self._written

    @property
    def first_rba(self) -> int:
        return self._bases[0]

    def segment_bases(self) -> list[int]:
        return list(self._bases)

    # -- appending -----------------------------------------------------------------------------

    def append(self, record_type: int, payload: bytes) -> int:
        """Add one record to the next group commit; return its RBA."""
        return self.append_many(((record_type, payload),))[0]

    def append_many(self, records: tuple[tuple[int, bytes], ...] | list[tuple[int, bytes]]) -> list[int]:
        """Add records, in order, to the next group commit; return their RBAs."""
        rbas = []
        with self._cond:
            if self._failed is not None:
                raise SpoolError(f"the spool log failed earlier and must be reopened: {self._failed}")
            for record_type, payload in records:
                size = FRAME_SIZE + len(payload)
                if self._roll or ((self._next - self._assign_base) + size > self.segment_bytes
                                  and self._next - self._assign_base > SEGMENT_HEADER_SIZE):
                    self._roll = False
                    self._assign_base = self._next
                    self._chunks.append((self._next, bytearray(segment_header(self._next))))
                    self._next += SEGMENT_HEADER_SIZE
                rba = self._next
                if self._pending_records == 0:
                    record_type |= BATCH_START
                buffer = self._chunks[-1][1]
                buffer += FRAME.pack(frame_crc(rba, record_type, payload), len(payload), record_type)
                buffer += payload
                self._next += size
                self._pending_records += 1
                rbas.append(rba)
        return rbas

    # -- group commit --------------------------------------------------------------------------

    def sync(self, upto: int | None = None) -> None:
        """Return once every record before ``upto`` (default: all appended) is durable.

        The first thread to wait while no write is running leads: it writes
        and fsyncs everything appended so far.  The others park; after each
        fsync the leader wakes exactly those it made durable, and hands the
        lead to one of the rest (the next group commit).
        """
        with self._cond:
            target = self._next if upto is None else upto
            while self._written < target:
                if self._failed is not None:
                    raise SpoolError(f"the spool log failed earlier and must be reopened: {self._failed}")
                if self._flushing:
                    parker = getattr(self._parkers, "lock", None)
                    if parker is None:
                        parker = self._parkers.lock = threading.Lock()
                        parker.acquire()
                    self._waiting.append((target, parker))
                    self._cond.release()
                    try:
                        parker.acquire()
                    finally:
                        self._cond.acquire()
                    continue
                self._flushing = True
                chunks, end = self._chunks, self._next
                self._chunks = [(self._assign_base, bytearray())]
                self._pending_records = 0
                self._cond.release()
                try:
                    self._write(chunks)
                except BaseException as error:
                    self._cond.acquire()
                    self._failed = error
                    self._flushing = False
                    self._wake(everyone=True)
                    raise SpoolError(f"writing the spool log failed: {error}") from error
                self._cond.acquire()
                self._written = end
                self._flushing = False
                self.syncs += 1
                self._wake()
            if self._failed is not None and self._written < target:
                raise SpoolError(f"the spool log failed earlier and must be reopened: {self._failed}")

    def _wake(self, everyone: bool = False) -> None:
        """Unpark the waiters now satisfied, and one more to lead the next
        write (called with the lock held, after a write)."""
        still = []
        for target, parker in self._waiting:
            if everyone or target <= self._written:
                parker.release()
            else:
                still.append((target, parker))
        if still:
            still.pop(0)[1].release()  # the next leader
        self._waiting = still

    def _write(self, chunks: list[tuple[int, bytearray]]) -> None:
        for base, data in chunks:
            if base != self._write_base:
                # The old segment gets its true length and is durable before
                # the next one exists: only the last segment has spare zeros.
                os.ftruncate(self._write_fd, self._write_offset)
                if self.fsync:
                    os.fsync(self._write_fd)
                os.close(self._write_fd)
                with self._cond:
                    self._ends[self._write_base] = self._write_base + self._write_offset
                self._write_fd = self._create_segment(base, bytes(data[:SEGMENT_HEADER_SIZE]), keep_open=True)
                self._write_base = base
                self._write_offset = self._filled = SEGMENT_HEADER_SIZE
                with self._cond:
                    self._bases.append(base)
                data = data[SEGMENT_HEADER_SIZE:]
            self._zeros_up_to(self._write_offset + len(data))
            view = memoryview(data)
            while view:
                written = os.pwrite(self._write_fd, view, self._write_offset)
                self._write_offset += written
                view = view[written:]
        if self.fsync:
            _datasync(self._write_fd)

    def _zeros_up_to(self, offset: int) -> None:
        """Keep zeros written ahead of the log's end, so that appends
        overwrite allocated blocks of a file whose size does not change and
        fdatasync has no metadata to log (PostgreSQL fills its WAL segments
        for the same reason).  The zeros read as unused space, never as
        records."""
        if offset <= self._filled:
            return
        target = max(offset, min(offset + _ZERO_AHEAD, self.segment_bytes))
        zeros = bytes(min(_ZERO_AHEAD, max(0, target - self._filled)))
        while self._filled < target:
            self._filled += os.pwrite(self._write_fd, zeros[:target - self._filled], self._filled)

    def _create_segment(self, base: int, header: bytes, keep_open: bool = False) -> int:
        path = self.directory / segment_name(base)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.pwrite(fd, header, 0)
            if self.fsync:
                os.fsync(fd)
                fsync_directory(self.directory)
        except BaseException:
            os.close(fd)
            raise
        if keep_open:
            return fd
        os.close(fd)
        return -1

    # -- reading -------------------------------------------------------------------------------

    def read(self, rba: int, length: int = 0) -> tuple[int, bytes]:
        """Read and verify the record at ``rba`` (writing the buffer out first if it is there)."""
        if rba >= self._written:
            self.sync(rba + FRAME_SIZE)
        with self._cond:
            bases = self._bases
            index = _segment_index(bases, rba)
            base = bases[index]
            fd = self._read_fds.get(base)
            if fd is None:
                fd = os.open(self.directory / segment_name(base), os.O_RDONLY)
                self._read_fds[base] = fd
        return _read_verified(fd, base, rba, length)

    # -- space ---------------------------------------------------------------------------------

    def segment_extents(self) -> list[tuple[int, int]]:
        """(base, end) of every segment restart no longer needs to be contiguous
        with: all but the one written."""
        with self._cond:
            return [(base, self._ends[base]) for base in self._bases if base in self._ends]

    def drop_before(self, rba: int, keep: frozenset[int] | set[int] = frozenset()) -> list[str]:
        """Delete the segments that end at or before ``rba``, except those
        whose base is in ``keep``; return their names."""
        dropped = []
        with self._cond:
            for base in list(self._bases):
                end = self._ends.get(base)
                if end is None or end > rba or base == self._write_base:
                    break
                if base in keep:
                    continue
                self._bases.remove(base)
                del self._ends[base]
                fd = self._read_fds.pop(base, None)
                if fd is not None:
                    os.close(fd)
                dropped.append(segment_name(base))
        for name in dropped:
            (self.directory / name).unlink(missing_ok=True)
        if dropped and self.fsync:
            fsync_directory(self.directory)
        return dropped

    def disk_bytes(self) -> int:
        with self._cond:
            bases = list(self._bases)
        total = 0
        for base in bases:
            try:
                total += (self.directory / segment_name(base)).stat().st_size
            except FileNotFoundError:
                pass
        return total

    def close(self) -> None:
        """Close the files.  Records not synced yet are dropped, as in a
        crash: callers sync first.  The spare zeros after the end of the log
        stay: the next writer appends into them, with no change of the
        file's size, where a batch run's few records had paid writing them
        again (1 MiB) and cutting them off at every run."""
        with self._cond:
            self._chunks = [(self._assign_base, bytearray())]
            fds = list(self._read_fds.values())
            self._read_fds.clear()
            write_fd, self._write_fd = self._write_fd, -1
        for fd in fds:
            os.close(fd)
        if write_fd >= 0:
            os.close(write_fd)


def _datasync(fd: int) -> None:
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _segment_index(bases: list[int], rba: int) -> int:
    low, high = 0, len(bases)
    while high - low > 1:
        middle = (low + high) // 2
        if bases[middle] <= rba:
            low = middle
        else:
            high = middle
    if not bases or rba < bases[0]:
        raise SpoolError(f"RBA {rba} is no longer in the log")
    return low
