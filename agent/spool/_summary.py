"""The spool's summary file: the queues' depths as of a log position, for
``agent status`` (docs/spool-format.md, "summary").

Rules of this file:
* It is the code form of that section of docs/spool-format.md; change both
  together.  Little-endian, fixed-width, unpadded, a CRC-32 at the end.
* The summary is a saving, never a source of truth: it is written without
  fsync, and a reader uses it only when the log itself shows it is current
  (the segment files it lists, the bytes before its end, nothing after).
  Anything else is :class:`SummaryStale` or :class:`SummaryUnreadable`,
  and the reader falls back to reading the span (``check_spool``).
* Reading trusts nothing: a size limit, every count checked against what
  is left, peer names checked as site names.
* :class:`SummaryKeeper` is the running spool's side: it caches each
  queue's encoded entry and recomputes only the queues that changed; the
  oldest message of a queue comes from a lazily built heap.
"""

from __future__ import annotations

import heapq
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from codec.names import check_site_name

from ._errors import SpoolError
from ._format import FRAME_SIZE, Direction, QueueId
from ._log import LogWriter, list_segments, segment_name
from ._recovery import MessageBlock, QueueBlock

SUMMARY_FILE = "summary"
SUMMARY_MAGIC = b"FSSUMRY1"
# magic, end rba, crc of the bytes before it, log start, last segment base, segments, restart rba,
# checkpoint number, in-doubt dequeues
_HEAD = struct.Struct("<8sQIQQIQQI")
_COUNT16 = struct.Struct("<H")
_COUNT32 = struct.Struct("<I")
_FIGURES = struct.Struct("<Id")  # messages, oldest enqueued-at (NaN: none)
_CRC = struct.Struct("<I")
TAIL_BYTES = 64  # bytes before the end whose CRC ties the summary to its log
MAX_SUMMARY_BYTES = 16 * 1024 * 1024
MAX_PROBLEMS = 100
MAX_PROBLEM_BYTES = 1000
# After a group commit the summary is rewritten once the log grew by this
# much (or by the summary's own size, if larger) since the last write, not
# at each: a remote's 163 rewrites in benchmarks.e2e took about 0.08 s of
# its run's 0.87 s of CPU.  The agent brings it up to date before it waits
# (SpoolQueues.at_rest) and at close.
SUMMARY_GROWTH = 1024 * 1024


class SummaryStale(SpoolError):
    """The log moved after the summary was written (or was never described by it)."""


class SummaryUnreadable(SpoolError):
    """The summary file is missing or does not decode."""


@dataclass(frozen=True, slots=True)
class QueueFigures:
    queue: str  # "in/PEER" or "out/PEER"
    peer: str
    direction: str  # "in" or "out"
    messages: int
    oldest_enqueued_at: float | None


@dataclass(frozen=True, slots=True)
class SpoolSummary:
    """What the summary file says, once :func:`read_summary` found it current."""

    path: str
    end_rba: int
    log_start_rba: int
    restart_rba: int
    segments: int
    checkpoint: int
    in_doubt: int
    problems: tuple[str, ...]
    queues: tuple[QueueFigures, ...]

    @property
    def ok(self) -> bool:
        """The running spool found no problem (its restart included); the
        records are not verified again (``agent spool check`` does that)."""
        return not self.problems

    @property
    def messages(self) -> int:
        return sum(queue.messages for queue in self.queues)

    @property
    def restart_span_bytes(self) -> int:
        return max(0, self.end_rba - self.restart_rba)

    @property
    def log_bytes(self) -> int:
        return self.end_rba - self.log_start_rba


# -- the bytes -------------------------------------------------------------------------------------


def _queue_entry(queue: QueueId, messages: int, oldest: float | None) -> bytes:
    peer = queue.peer.encode("ascii")
    return (bytes((int(queue.direction), len(peer))) + peer
            + _FIGURES.pack(messages, math.nan if oldest is None else oldest))


def encode_summary(*, end: int, tail_crc: int, log_start: int, last_base: int, segments: int, restart: int,
                   checkpoint: int, in_doubt: int, problems: tuple[str, ...], entries: list[bytes]) -> bytes:
    parts = [_HEAD.pack(SUMMARY_MAGIC, end, tail_crc, log_start, last_base, segments, restart, checkpoint, in_doubt)]
    kept = [problem.encode("utf-8", "replace")[:MAX_PROBLEM_BYTES] for problem in problems[:MAX_PROBLEMS]]
    parts.append(_COUNT16.pack(len(kept)))
    for text in kept:
        parts.append(_COUNT16.pack(len(text)) + text)
    parts.append(_COUNT32.pack(len(entries)))
    parts.extend(entries)
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode_summary(data: bytes, path: str = "") -> tuple[SpoolSummary, int, int]:
    """The summary in ``data``, with the tail CRC and last segment base it
    names (for the currency check).  Raises :class:`SummaryUnreadable`."""
    def bad(reason: str) -> SummaryUnreadable:
        return SummaryUnreadable(f"{path}: unreadable spool summary ({reason})")

    if len(data) > MAX_SUMMARY_BYTES:
        raise bad(f"{len(data)} bytes, more than a summary ever holds")
    if len(data) < _HEAD.size + _COUNT16.size + _COUNT32.size + _CRC.size:
        raise bad(f"{len(data)} bytes, cut short")
    if data[:8] != SUMMARY_MAGIC:
        raise bad("not a summary file: wrong magic")
    if zlib.crc32(data[:-_CRC.size]) != _CRC.unpack_from(data, len(data) - _CRC.size)[0]:
        raise bad("checksum mismatch")
    _magic, end, tail_crc, log_start, last_base, segments, restart, checkpoint, in_doubt = _HEAD.unpack_from(data)
    if not log_start <= last_base <= end or restart > end or segments < 1:
        raise bad("positions out of order")
    limit = len(data) - _CRC.size
    offset = _HEAD.size
    try:
        (count,) = _COUNT16.unpack_from(data, offset)
        offset += _COUNT16.size
        if count > MAX_PROBLEMS:
            raise bad(f"{count} problems")
        problems = []
        for _ in range(count):
            (size,) = _COUNT16.unpack_from(data, offset)
            offset += _COUNT16.size
            if size > MAX_PROBLEM_BYTES or offset + size > limit:
                raise bad("a problem's text runs past the end")
            problems.append(data[offset:offset + size].decode("utf-8", "replace"))
            offset += size
        (count,) = _COUNT32.unpack_from(data, offset)
        offset += _COUNT32.size
        if count * (2 + _FIGURES.size) > limit - offset:
            raise bad(f"{count} queues do not fit in the file")
        queues = []
        for _ in range(count):
            if offset + 2 > limit:
                raise bad("a queue entry runs past the end")
            code, size = data[offset], data[offset + 1]
            offset += 2
            if code not in (0, 1) or offset + size + _FIGURES.size > limit:
                raise bad("a queue entry does not decode")
            peer = data[offset:offset + size].decode("ascii")
            check_site_name(peer)
            offset += size
            messages, oldest = _FIGURES.unpack_from(data, offset)
            offset += _FIGURES.size
            if math.isnan(oldest) != (messages == 0) or math.isinf(oldest):
                raise bad(f"queue {peer}: {messages} messages with oldest {oldest}")
            direction = Direction(code)
            queues.append(QueueFigures(f"{direction.label}/{peer}", peer, direction.label, messages,
                                       None if messages == 0 else oldest))
    except (struct.error, UnicodeDecodeError, ValueError) as error:  # (an invalid site name is a ValueError)
        raise bad(f"does not decode: {error}") from None
    if offset != limit:
        raise bad(f"{limit - offset} bytes left over")
    summary = SpoolSummary(path, end, log_start, restart, segments, checkpoint, in_doubt, tuple(problems),
                           tuple(queues))
    return summary, tail_crc, last_base


# -- reading ---------------------------------------------------------------------------------------


def read_summary(directory: str | os.PathLike[str]) -> SpoolSummary:
    """The spool's summary, if the log shows it is current; else
    :class:`SummaryStale` (the log moved: read the span instead) or
    :class:`SummaryUnreadable`.  Reads a few bytes of the log, writes nothing."""
    directory = Path(directory)
    path = directory / SUMMARY_FILE
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SUMMARY_BYTES + 1)
    except FileNotFoundError:
        raise SummaryUnreadable(f"{path}: no spool summary yet (an agent writes it as it runs)") from None
    except OSError as error:
        raise SummaryUnreadable(f"{path}: cannot read the spool summary ({error.strerror})") from None
    summary, tail_crc, last_base = decode_summary(data, str(path))
    problem = _log_moved(directory, summary.segments, summary.log_start_rba, summary.end_rba, tail_crc, last_base)
    if problem is not None:
        raise SummaryStale(f"{path}: the spool summary is stale: {problem}")
    return summary


def _log_moved(directory: Path, count: int, log_start: int, end: int, tail_crc: int, last_base: int) -> str | None:
    """Why the log is not as a summary describes it: ``count`` segments
    from ``log_start``, the last at ``last_base``, ending at ``end`` after
    bytes whose CRC-32 is ``tail_crc`` (None: it is)."""
    try:
        segments = list_segments(directory)
    except OSError as error:
        return f"the segment files cannot be listed ({error.strerror})"
    if not segments:
        return "there are no segment files"
    if (len(segments), segments[0].base, segments[-1].base) != (count, log_start, last_base):
        return (f"the log is {len(segments)} segment(s) from RBA {segments[0].base}, the summary names "
                f"{count} from RBA {log_start}")
    last = segments[-1]
    if end - last.base > last.size:
        return f"the log ends before RBA {end}"
    tail = tail_length(end, last.base)
    try:
        with open(last.path, "rb") as handle:
            data = os.pread(handle.fileno(), tail + FRAME_SIZE, end - last.base - tail)
    except OSError as error:
        return f"{last.path.name} cannot be read ({error.strerror})"
    if len(data) < tail or zlib.crc32(data[:tail]) != tail_crc:
        return f"the log before RBA {end} is not the one the summary describes"
    if any(data[tail:]):
        return f"the log was written after RBA {end}"
    return None


def tail_length(end: int, base: int) -> int:
    return min(TAIL_BYTES, end - base)


# -- writing (the running spool) -------------------------------------------------------------------


class SummaryKeeper:
    """The running spool's summary: each queue's entry cached, recomputed
    when the queue changed; written when the log moved (and, after a group
    commit, once the log grew by :data:`SUMMARY_GROWTH` or the summary's
    own size)."""

    def __init__(self) -> None:
        self._entries: dict[QueueId, bytes] = {}
        self._changed: set[QueueId] = set()
        self._heaps: dict[QueueId, list[tuple[float, int]]] = {}
        self.written_end = -1  # the log end the file on disk describes (-1: none known)
        self.read_from = 0
        self._written_size = 0

    def reset(self, queues: dict[QueueId, QueueBlock], *, read_from: int) -> None:
        """Start from the queues a restart built, which read from ``read_from``."""
        self.read_from = read_from  # where a restart would read from (the anchor's, once a checkpoint wrote it)
        self._entries.clear()
        self._heaps.clear()
        self._changed = set(queues)

    def changed(self, queue: QueueId) -> None:
        self._changed.add(queue)

    def added(self, queue: QueueBlock, block: MessageBlock) -> None:
        heap = self._heaps.get(queue.queue)
        if heap is not None:
            heapq.heappush(heap, (block.enqueued_at, block.irba))
        self._changed.add(queue.queue)

    def _oldest(self, queue: QueueBlock) -> float | None:
        messages = queue.messages
        if not messages:
            self._heaps.pop(queue.queue, None)
            return None
        heap = self._heaps.get(queue.queue)
        if heap is None or len(heap) > 2 * len(messages) + 64:  # first use, or mostly entries of removed messages
            heap = self._heaps[queue.queue] = [(block.enqueued_at, block.irba) for block in messages.values()]
            heapq.heapify(heap)
        while heap:
            enqueued_at, irba = heap[0]
            block = messages.get(irba)
            if block is not None and block.enqueued_at == enqueued_at:
                return enqueued_at
            heapq.heappop(heap)  # a message since removed
        return None  # not reached: every queued message has an entry

    def entries(self, queues: dict[QueueId, QueueBlock]) -> list[bytes]:
        for key in self._changed:
            queue = queues.get(key)
            if queue is None or not queue.messages:  # an empty queue is not listed
                self._entries.pop(key, None)
                self._heaps.pop(key, None)
                continue
            self._entries[key] = _queue_entry(key, len(queue.messages), self._oldest(queue))
        self._changed.clear()
        return list(self._entries.values())

    def due(self, end: int, *, force: bool) -> bool:
        """Whether to write the summary of a log ending at ``end``."""
        if end == self.written_end:
            return False  # nothing moved: an idle run writes nothing
        if force or self.written_end < 0:
            return True
        return end - self.written_end >= max(self._written_size, SUMMARY_GROWTH)

    def write_if_due(self, directory: Path, log: LogWriter, queues: dict[QueueId, QueueBlock], *, checkpoint: int,
                     in_doubt: int, problems: tuple[str, ...], force: bool = False) -> None:
        """Write the summary of the log as it is, if it is all durable and
        the summary is due (called under the spool's lock)."""
        end = log.next_rba
        if log.durable_rba != end or not self.due(end, force=force):
            return  # records not yet durable: the sync that writes them comes here again
        bases = log.segment_bases()
        data = encode_summary(end=end, tail_crc=tail_crc(directory, bases[-1], end), log_start=bases[0],
                              last_base=bases[-1], segments=len(bases), restart=self.read_from, checkpoint=checkpoint,
                              in_doubt=in_doubt, problems=problems, entries=self.entries(queues))
        self.write(directory, data, end)

    def write(self, directory: Path, data: bytes, end: int) -> None:
        """Replace the summary file whole (no fsync: a reader checks it against the log)."""
        temporary = directory / (SUMMARY_FILE + ".tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, directory / SUMMARY_FILE)
        self.written_end = end
        self._written_size = len(data)

    def adopt(self, directory: Path, end: int) -> None:
        """After a restart that wrote nothing: keep the file on disk if it
        is whole and describes the log ending at ``end`` (so an idle run
        writes nothing), else write it.  Only its head is read: a run's
        start does not decode every queue's entry."""
        try:
            with open(directory / SUMMARY_FILE, "rb") as handle:
                data = handle.read(MAX_SUMMARY_BYTES + 1)
        except OSError:
            return
        if (len(data) > MAX_SUMMARY_BYTES or len(data) < _HEAD.size + _CRC.size or data[:8] != SUMMARY_MAGIC
                or zlib.crc32(data[:-_CRC.size]) != _CRC.unpack_from(data, len(data) - _CRC.size)[0]):
            return
        _magic, written, tail_crc, log_start, last_base, segments, *_ = _HEAD.unpack_from(data)
        if written == end and _log_moved(directory, segments, log_start, end, tail_crc, last_base) is None:
            self.written_end = end
            self._written_size = len(data)


def tail_crc(directory: Path, base: int, end: int) -> int:
    """CRC-32 of the bytes before ``end`` in the segment at ``base`` (they are written)."""
    tail = tail_length(end, base)
    with open(directory / segment_name(base), "rb") as handle:
        data = os.pread(handle.fileno(), tail, end - base - tail)
    return zlib.crc32(data)
