"""The crash-safe message spool: :class:`SpoolQueues`, the recovery-log
implementation of :class:`agent.queues.MessageQueues` (DESIGN §5).

Rules of this file:
* One lock (``self._lock``) guards the queue blocks and the order of
  appends, so the log order is the order the structures changed in.  Nobody
  waits for an fsync while holding it, except a checkpoint (which must).
* Every change is a unit of recovery appended whole under the lock:
  records, then COMMIT (or PREPARE for an in-doubt dequeue).  So a
  checkpoint never meets an inflight unit; only a torn tail can leave one,
  and restart backs it out.
* A method returns once its records are durable (group commit), except
  inside :meth:`SpoolQueues.group_commit`, where the ``with`` block's exit
  waits once for all of them, and :meth:`commit_dequeue`, whose COMMIT may
  be lost: restart resolves the dequeue from the database's log_received.
* Restart reads no further back than the Checkpoint Positioning List says;
  segments wholly before that position are deleted after each checkpoint,
  unless a queued message's content is in one (a relog by reference points
  there); one that queued content fills at most half of is copied forward.
* A checkpoint writes at most half of what was logged since the previous
  one (unless ``checkpoint_bytes`` forces it), so relogging a large queue
  costs a bounded share of the log.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from codec.atomic import write_file_atomically
from codec.errors import BadFileName
from codec.names import Kind, MessageName, check_site_name

from ..queues import MessageQueues, QueueDepth, QueueError
from ._errors import SpoolCorrupt, SpoolError, SpoolLocked
from ._format import (FRAME_SIZE, REFS_PER_RECORD, SEGMENT_HEADER_SIZE, BadPayload, CplRecord, Direction, InDoubtEntry,
                      QueueId, RecordType, Ref, RelogMode, RelogState, decode_anchor, decode_payload, encode_add,
                      encode_anchor, encode_checkpoint_begin, encode_cpl, encode_delete, encode_end, encode_prepare,
                      encode_queue_checkpoint, encode_refs, encode_relog, encode_undo_add, encode_undo_delete)
from ._log import (
    LogWriter,
    ScanResult,
    SegmentFile,
    contiguous_start,
    fsync_directory,
    list_segments,
    read_record_at,
    scan,
    segment_name,
)
from ._recovery import InDoubt, MbState, MessageBlock, QueueBlock, Restart, RestartStats

ANCHOR_FILE = "anchor"
LOCK_FILE = "LOCK"
_CONTENT_TYPES = {RecordType.ADD, RecordType.RELOG, RecordType.UNDO_DELETE}
_MAX_NAME_BYTES = 1024


@dataclass(frozen=True, slots=True)
class DequeueToken:
    """An in-doubt dequeue of inbound messages (see :meth:`SpoolQueues.begin_dequeue`)."""

    ur: int
    peer: str
    names: tuple[str, ...]
    last: int


@dataclass(frozen=True, slots=True)
class InDoubtDequeue:
    """A dequeue whose database transaction's fate is not known yet."""

    ur: int
    peer: str
    last: int  # applied iff the database's log_received for ``peer`` is >= last
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Resolution:
    """What :meth:`SpoolQueues.resolve_in_doubt` decided."""

    peer: str
    log_received: int
    dequeued: tuple[str, ...]  # their transaction committed: the messages are gone
    restored: tuple[str, ...]  # it did not: the messages are queued again


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    number: int
    begin_rba: int
    cpl_rba: int
    restart_rba: int
    relogged: int  # messages relogged, with their content or by reference
    relogged_bytes: int  # content copied
    bytes_written: int
    segments_deleted: int
    referenced: int = 0  # of the relogged, those relogged by reference


@dataclass(frozen=True, slots=True)
class SpoolStatus:
    """What ``agent status`` shows about the spool."""

    path: str
    depths: tuple[QueueDepth, ...]
    messages: int
    queued_bytes: int
    oldest_enqueued_at: float | None
    oldest_age_seconds: float | None
    oldest_queue: str | None  # "in/PEER" or "out/PEER"
    in_doubt_dequeues: int
    log_start_rba: int
    restart_rba: int
    end_rba: int
    restart_span_bytes: int  # what a restart now would read
    segments: int
    disk_bytes: int
    checkpoints: int
    records_since_checkpoint: int
    bytes_since_checkpoint: int
    checkpoint_every: int
    checkpoint_bytes: int
    cpl_pairs: int
    relog_mode: str


@dataclass(frozen=True, slots=True)
class SpoolCounters:
    """Work done since the spool was opened."""

    checkpoints: int
    relogged: int  # messages relogged (relog records and REFS entries)
    relogged_bytes: int  # message content copied by relog records
    checkpoint_bytes: int  # every byte checkpoints wrote (relog, REFS, queue and CPL records)
    group_commits: int  # fsyncs (writes) of the log
    referenced: int = 0  # of the relogged, those relogged by reference (REFS entries)


DEFAULT_CHECKPOINT_BYTES = 128 * 1024 * 1024
# Bytes a group commit block appends before a call waits for them (they wait
# in memory until written): a block's memory is bounded, whatever it puts.
GROUP_COMMIT_BUFFER = 16 * 1024 * 1024
# A segment kept only for queued messages' content is copied forward once they fill at most this share of it.
RECLAIM_FILL = 0.5
# A checkpoint due by records waits for this many times what the previous one wrote to be logged.
CHECKPOINT_COST_FACTOR = 2
log = logging.getLogger("fieldsync.spool")


class _SimulatedCrash(BaseException):
    """Raised by test fault hooks; never by the spool itself."""


def _lock_holder(fd: int) -> str:
    """Who holds the spool's lock, as its LOCK file says: a process id
    (this one: another object of this process), or 'another process'."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        pid = int(text)
    except (OSError, UnicodeDecodeError, ValueError):
        return "another process"
    if pid == os.getpid():
        return f"another object of this process ({pid})"
    return f"process {pid}"


def _check_name(name: str) -> str:
    if (type(name) is not str or not name or "/" in name or "\\" in name or name.startswith(".")
            or "\x00" in name or len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES):
        raise QueueError(f"refusing unsafe queue entry name {name!r}")
    return name


class SpoolQueues(MessageQueues):
    """Inbound (per publisher) and outbound (per destination) message queues
    in a recovery log with selective-relogging checkpoints (EP 0 280 773).

    ``checkpoint_every`` / ``checkpoint_bytes``: a checkpoint runs after that
    many log records or bytes, whichever comes first; a clean close takes
    one when a quarter of either has been logged since the last (the
    patent's termination checkpoint).  ``cpl_pairs``:
    checkpoints a message's newest copy may age before it is relogged (the
    CPL's n).  ``relog``: ``"selective"`` (the patent), ``"all"`` (relog every
    queued message at every checkpoint) or ``"off"``.  ``relog_by_reference``:
    relog a message whose content stays on disk by a REFS entry, and space
    checkpoints by their cost; ``False`` copies every relogged message
    (format version 1's behaviour).  ``fsync=False`` keeps
    the format but gives up durability (benchmark set-up only).
    """

    def __init__(self, path: str | os.PathLike[str], *, checkpoint_every: int = 10_000,
                 checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES, cpl_pairs: int = 3,
                 relog: str | RelogMode = RelogMode.SELECTIVE, segment_bytes: int = 64 * 1024 * 1024,
                 fsync: bool = True, relog_by_reference: bool = True, clock: Callable[[], float] = time.time,
                 _fault: Callable[[str], None] | None = None) -> None:
        if checkpoint_every < 1:
            raise SpoolError("checkpoint_every must be at least 1 record")
        if checkpoint_bytes < 4096:
            raise SpoolError("checkpoint_bytes must be at least 4096")
        if not 1 <= cpl_pairs <= 1000:
            raise SpoolError("cpl_pairs must be between 1 and 1000")
        if segment_bytes < 4096:
            raise SpoolError("segment_bytes must be at least 4096")
        self.path = Path(path)
        self.checkpoint_every = checkpoint_every
        self.checkpoint_bytes = checkpoint_bytes
        self.cpl_pairs = cpl_pairs
        self.relog_mode = RelogMode(relog)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.relog_by_reference = relog_by_reference
        self.clock = clock
        self._lock = threading.RLock()
        self._local = threading.local()
        self._fault = _fault  # tests: called at named crash points
        self._closed = False
        self._checkpointing = False
        self._cpl_written = False
        self._lookup: dict[tuple[Direction, str], QueueBlock] = {}  # a cache of self._queues
        self._checkpoints = self._relogged = self._relogged_bytes = self._checkpoint_bytes = self._referenced = 0
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(self._lock_fd)
            os.close(self._lock_fd)
            raise SpoolLocked(f"{self.path}: the spool is open in {holder}; stop that agent first") from None
        # Who holds it, for the message another opener gets (the lock is the
        # flock, not this text: a holder that died left only a stale number).
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        try:
            self._restart()
        except BaseException:
            self._abandon()
            raise

    # -- restart -------------------------------------------------------------------------------

    def _restart(self) -> None:
        started = time.perf_counter()
        span = read_span(self.path, self.cpl_pairs)
        restart, result = span.restart, span.result
        segments = span.segments
        torn_bytes = result.torn.discarded if result.torn is not None else 0
        if result.torn is not None:  # (spare zeros after the end are kept for the writer)
            if result.dropped_segment is not None:
                (self.path / result.dropped_segment).unlink()
                segments = segments[:-1]
            else:
                last = segments[-1]
                with open(last.path, "r+b") as handle:
                    handle.truncate(result.end - last.base)
                    if self.fsync:
                        os.fsync(handle.fileno())
                segments[-1] = SegmentFile(last.base, last.path, result.end - last.base)
            if self.fsync:
                fsync_directory(self.path)
        restart.forward()
        _check_content_segments(restart, segments, span.start)
        end = result.end if segments else SEGMENT_HEADER_SIZE
        self._log = LogWriter(self.path, segments=segments, end=end, segment_bytes=self.segment_bytes,
                              fsync=self.fsync)
        self._queues: dict[QueueId, QueueBlock] = restart.queues
        self._next_ur = restart.max_ur + 1
        restart.backward(self._emit_compensation, self._read_content)
        for ur in restart.finished_in_doubt_units():
            self._log.append(RecordType.COMMIT, encode_end(ur))
        self._log.sync()
        cpl = restart.cleanup(restart.cpl(span.start))
        self._in_doubt: dict[int, InDoubt] = restart.in_doubt
        self._cpl = cpl
        self._checkpoint_number = restart.max_checkpoint
        self._records_since_checkpoint = restart.records_since_checkpoint + restart.compensations
        self._restart_rba = restart.last_cpl[1].restart if restart.last_cpl else span.start
        # Where the last complete checkpoint ended (bytes logged since count toward the next).
        self._checkpoint_end_rba = restart.last_cpl[0] if restart.last_cpl else span.start
        self._checkpoint_stats: CheckpointStats | None = None
        # What the last checkpoint wrote (the next waits for twice that to be logged).
        self._last_checkpoint_cost = restart.last_cpl[0] - restart.last_cpl[1].begin if restart.last_cpl else 0
        self.last_restart = RestartStats(
            restart_rba=span.start, end_rba=self._log.next_rba, bytes_read=result.bytes_read,
            records_read=result.records, checkpoint_rba=restart.last_cpl[0] if restart.last_cpl else None,
            from_anchor=span.from_anchor, relogs_honoured=restart.relogs_honoured,
            relogs_ignored=restart.relogs_ignored, pending_deletes=restart.pending_created,
            pending_deletes_matched=restart.pending_matched, units_backed_out=restart.backed_out,
            compensation_records=restart.compensations, in_doubt=len(self._in_doubt), torn_bytes=torn_bytes,
            seconds=time.perf_counter() - started)
        self.restart_problems = tuple(restart.problems)
        if restart.last_cpl is None:
            self.checkpoint()  # the spool's first checkpoint (CB1 in the patent's figures)

    def _emit_compensation(self, kind: str, fields: dict) -> int:
        if kind == "undo_add":
            rba = self._log.append(RecordType.UNDO_ADD, encode_undo_add(fields["ur"], fields["irba"],
                                                                         fields["undone"], fields["queue"]))
        elif kind == "undo_delete":
            rba = self._log.append(RecordType.UNDO_DELETE, encode_undo_delete(
                fields["ur"], fields["irba"], fields["undone"], fields["queue"], fields["name"], fields["epoch"],
                fields["enqueued_at"], fields["data"]))
        else:
            rba = self._log.append(RecordType.ABORT, encode_end(fields["ur"]))
        self._fault_point("restart.compensating")
        return rba

    # -- plumbing ------------------------------------------------------------------------------

    def _fault_point(self, where: str) -> None:
        if self._fault is not None:
            self._log.sync()  # what happened before the crash point is on disk
            self._fault(where)

    def _check_open(self) -> None:
        if self._closed:
            raise SpoolError(f"{self.path}: the spool is closed")

    def _queue(self, direction: Direction, peer: str, create: bool = False) -> QueueBlock | None:
        block = self._lookup.get((direction, peer))
        if block is None:
            check_site_name(peer)
            key = QueueId(direction, peer)
            block = self._queues.get(key)
            if block is None and create:
                block = self._queues[key] = QueueBlock(key)
            if block is not None:
                self._lookup[(direction, peer)] = block
        return block

    def _new_ur(self) -> int:
        ur = self._next_ur
        self._next_ur += 1
        return ur

    def _read_content(self, block: MessageBlock) -> bytes:
        record_type, payload = self._log.read(block.crba, block.length)
        if record_type not in _CONTENT_TYPES or len(payload) < block.size:
            raise SpoolCorrupt(block.crba, "?", f"the copy of {block.name} is not a message record")
        return payload[len(payload) - block.size:] if block.size else b""

    def _durable(self, end: int) -> None:
        if getattr(self._local, "depth", 0):
            self._local.end = max(getattr(self._local, "end", 0), end)
            if end - self._log.durable_rba > GROUP_COMMIT_BUFFER:
                self._log.sync(end)  # the block's records wait in memory: not more than this
        else:
            self._log.sync(end)
        self._maybe_checkpoint()

    def _checkpoint_due(self, fraction: int = 1) -> bool:
        """Whether 1/``fraction`` of a checkpoint interval has been logged:
        ``checkpoint_bytes``, or ``checkpoint_every`` records once the log
        since the last checkpoint is twice what that one wrote."""
        logged = (self._log.next_rba - self._checkpoint_end_rba) * fraction
        if logged >= self.checkpoint_bytes:
            return True
        if self._records_since_checkpoint * fraction < self.checkpoint_every:
            return False
        return not self.relog_by_reference or logged >= CHECKPOINT_COST_FACTOR * self._last_checkpoint_cost

    def _maybe_checkpoint(self) -> None:
        if self._checkpoint_due():
            with self._lock:
                if self._checkpoint_due() and not self._checkpointing and not self._closed:
                    self.checkpoint()

    def _append(self, record_type: RecordType, payload: bytes) -> int:
        self._records_since_checkpoint += 1
        return self._log.append(record_type, payload)

    @contextlib.contextmanager
    def group_commit(self) -> Iterator[None]:
        """Let the enclosed puts and deletes (of this thread) share one wait
        for durability, when the block exits."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.end = 0
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0 and self._local.end:
                end, self._local.end = self._local.end, 0
                self._log.sync(end)
                self._maybe_checkpoint()

    # -- enqueue / dequeue ---------------------------------------------------------------------

    def _put(self, direction: Direction, peer: str, name: str, data: bytes, epoch: int | None) -> None:
        _check_name(name)
        if epoch is not None and not 0 <= epoch < 2**63:
            raise QueueError(f"bad epoch {epoch} for {name}")
        data = bytes(data)
        with self._lock:
            self._check_open()
            queue = self._queue(direction, peer, create=True)
            assert queue is not None
            if queue.by_name(name) is None:
                enqueued_at = self.clock()
                ur = self._new_ur()
                record = encode_add(ur, queue.queue, name, epoch, enqueued_at, data)
                irba = self._log.append_many(((RecordType.ADD, record), (RecordType.COMMIT, encode_end(ur))))[0]
                self._records_since_checkpoint += 2
                queue.add(MessageBlock(irba, irba, len(data), name, epoch, enqueued_at, FRAME_SIZE + len(record)))
            end = self._log.next_rba  # an earlier put of the same name may still be on its way
        self._durable(end)

    def _delete(self, direction: Direction, peer: str, names: list[str] | tuple[str, ...],
                predicate: Callable[[MessageBlock], bool] | None = None) -> list[str]:
        with self._lock:
            self._check_open()
            queue = self._queue(direction, peer)
            if queue is None:
                return []
            if predicate is not None:
                blocks = [block for block in queue.in_order() if predicate(block)]
            else:
                blocks = []
                for name in dict.fromkeys(names):
                    block = queue.by_name(_check_name(name))
                    if block is not None:
                        blocks.append(block)
            if not blocks:
                return []
            ur = self._new_ur()
            records = [(RecordType.DELETE, encode_delete(ur, block.irba, queue.queue)) for block in blocks]
            records.append((RecordType.COMMIT, encode_end(ur)))
            self._log.append_many(records)
            self._records_since_checkpoint += len(records)
            for block in blocks:
                queue.remove(block.irba)
                if block.state is MbState.IN_DOUBT_DELETE:
                    self._detach_in_doubt(block)
            end = self._log.next_rba
        self._durable(end)
        return [block.name for block in blocks]

    def _detach_in_doubt(self, block: MessageBlock) -> None:
        unit = self._in_doubt.get(block.ur)
        if unit is None:
            return
        unit.irbas.discard(block.irba)
        if not unit.irbas:  # nothing left to decide
            del self._in_doubt[unit.ur]
            self._append(RecordType.COMMIT, encode_end(unit.ur))

    def _read(self, direction: Direction, peer: str, name: str) -> bytes:
        _check_name(name)
        with self._lock:
            self._check_open()
            queue = self._queue(direction, peer)
            block = queue.by_name(name) if queue is not None else None
            if block is None:
                where = f"from {peer}" if direction is Direction.INBOUND else f"to {peer}"
                raise QueueError(f"{direction.label}bound message {name} {where} is not queued")
            return self._read_content(block)

    def _names(self, direction: Direction, peer: str) -> list[MessageBlock]:
        with self._lock:
            self._check_open()
            queue = self._queue(direction, peer)
            return [] if queue is None else queue.in_order()

    # -- MessageQueues -------------------------------------------------------------------------

    def put_inbound(self, peer: str, name: str, data: bytes) -> None:
        self._put(Direction.INBOUND, peer, name, data, None)

    def inbound(self, peer: str) -> list[str]:
        return sorted(block.name for block in self._names(Direction.INBOUND, peer))

    def read_inbound(self, peer: str, name: str) -> bytes:
        return self._read(Direction.INBOUND, peer, name)

    def delete_inbound(self, peer: str, names: tuple[str, ...] | list[str]) -> None:
        self._delete(Direction.INBOUND, peer, names)

    def put_outbound(self, peer: str, name: str, data: bytes, resend_count: int | None) -> None:
        self._put(Direction.OUTBOUND, peer, name, data, resend_count)

    def outbound(self, peer: str) -> list[str]:
        return [block.name for block in self._names(Direction.OUTBOUND, peer)]

    def read_outbound(self, peer: str, name: str) -> bytes:
        return self._read(Direction.OUTBOUND, peer, name)

    def delete_outbound(self, peer: str, name: str) -> None:
        self._delete(Direction.OUTBOUND, peer, [name])

    def purge_outbound(self, peer: str, below_resend_count: int) -> int:
        def stale(block: MessageBlock) -> bool:
            try:
                parsed = MessageName.parse(block.name)
            except BadFileName:  # a foreign entry is left alone
                return False
            return parsed.kind is Kind.DATA and parsed.header.resend_count < below_resend_count

        return len(self._delete(Direction.OUTBOUND, peer, (), predicate=stale))

    def depths(self) -> list[QueueDepth]:
        with self._lock:
            self._check_open()
            counts: dict[str, list[int]] = {}
            for key, queue in self._queues.items():
                counts.setdefault(key.peer, [0, 0])[int(key.direction)] = len(queue.messages)
        return [QueueDepth(peer, inbound, outbound) for peer, (inbound, outbound) in sorted(counts.items())]

    # -- in-doubt dequeues ---------------------------------------------------------------------

    def begin_dequeue(self, peer: str, names: tuple[str, ...] | list[str], log_received: int) -> DequeueToken:
        """Start dequeuing inbound messages that the database transaction
        about to run will apply, setting ``log_received`` for ``peer``.

        Durable on return: call it before that transaction commits.  Then
        :meth:`commit_dequeue` after it commits, :meth:`abort_dequeue` if it
        fails; after a crash, :meth:`resolve_in_doubt` decides."""
        if not 0 <= log_received < 2**63:
            raise QueueError(f"bad log_received {log_received}")
        with self._lock:
            self._check_open()
            queue = self._queue(Direction.INBOUND, peer)
            blocks = []
            for name in dict.fromkeys(names):
                block = queue.by_name(_check_name(name)) if queue is not None else None
                if block is None:
                    raise QueueError(f"inbound message {name} from {peer} is not queued")
                if block.state is not MbState.COMMITTED:
                    raise QueueError(f"inbound message {name} from {peer} is already being dequeued")
                blocks.append(block)
            if not blocks:
                raise QueueError("begin_dequeue needs at least one message")
            assert queue is not None
            ur = self._new_ur()
            for block in blocks:
                self._append(RecordType.DELETE, encode_delete(ur, block.irba, queue.queue))
            self._append(RecordType.PREPARE, encode_prepare(ur, log_received, queue.queue))
            for block in blocks:
                block.state, block.ur = MbState.IN_DOUBT_DELETE, ur
            self._in_doubt[ur] = InDoubt(ur, queue.queue, log_received, {block.irba for block in blocks})
            end = self._log.next_rba
        self._log.sync(end)
        return DequeueToken(ur, peer, tuple(block.name for block in blocks), log_received)

    def commit_dequeue(self, token: DequeueToken, *, wait: bool = False) -> None:
        """The database transaction committed: the messages are gone.  The
        COMMIT record rides on the next group commit unless ``wait``; if it
        is lost, restart finds the dequeue in doubt and the database's
        log_received settles it."""
        self._end_dequeue(token.ur, commit=True, wait=wait)

    def abort_dequeue(self, token: DequeueToken) -> None:
        """The database transaction failed: the messages stay queued."""
        self._end_dequeue(token.ur, commit=False, wait=True)

    def _end_dequeue(self, ur: int, *, commit: bool, wait: bool) -> tuple[list[str], list[str]]:
        with self._lock:
            self._check_open()
            unit = self._in_doubt.pop(ur, None)
            if unit is None:
                return [], []
            queue = self._queues[unit.queue]
            blocks = sorted((queue.messages[irba] for irba in unit.irbas if irba in queue.messages),
                            key=lambda block: block.irba)
            if commit:
                self._append(RecordType.COMMIT, encode_end(ur))
                for block in blocks:
                    queue.remove(block.irba)
            else:
                for block in reversed(blocks):
                    data = self._read_content(block)
                    record = encode_undo_delete(ur, block.irba, 0, queue.queue, block.name, block.epoch,
                                                block.enqueued_at, data)
                    block.crba = block.lrba = self._append(RecordType.UNDO_DELETE, record)
                    block.length = FRAME_SIZE + len(record)
                    block.state, block.ur = MbState.COMMITTED, 0
                self._append(RecordType.ABORT, encode_end(ur))
            end = self._log.next_rba
        if wait:
            self._durable(end)
        names = [block.name for block in blocks]
        return (names, []) if commit else ([], names)

    def in_doubt(self) -> tuple[InDoubtDequeue, ...]:
        """Dequeues waiting for :meth:`resolve_in_doubt` (after a restart)."""
        with self._lock:
            result = []
            for unit in sorted(self._in_doubt.values(), key=lambda unit: unit.ur):
                queue = self._queues[unit.queue]
                names = tuple(sorted(queue.messages[irba].name for irba in unit.irbas if irba in queue.messages))
                result.append(InDoubtDequeue(unit.ur, unit.queue.peer, unit.last, names))
            return tuple(result)

    def resolve_in_doubt(self, peer: str, log_received: int) -> Resolution:
        """Settle ``peer``'s in-doubt dequeues with the database's current
        ``log_received`` for it: a dequeue whose transaction set
        log_received to ``last`` committed iff ``log_received >= last``."""
        check_site_name(peer)
        dequeued: list[str] = []
        restored: list[str] = []
        with self._lock:
            units = [unit.ur for unit in self._in_doubt.values()
                     if unit.queue == QueueId(Direction.INBOUND, peer)]
        for ur in sorted(units):
            unit = self._in_doubt.get(ur)
            if unit is None:
                continue
            gone, back = self._end_dequeue(ur, commit=log_received >= unit.last, wait=True)
            dequeued += gone
            restored += back
        return Resolution(peer, log_received, tuple(sorted(dequeued)), tuple(sorted(restored)))

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self) -> CheckpointStats:
        """Take a checkpoint now (they also run every ``checkpoint_every`` records)."""
        with self._lock:
            self._check_open()
            self._checkpointing = True
            moved: list[tuple[MessageBlock, int, int, int]] = []
            try:
                return self._checkpoint(moved)
            except BaseException:
                # Relog records of a checkpoint without its CPL record are
                # ignored by restart: the messages' copies are still the old ones.
                if not self._cpl_written:
                    for block, crba, length, lrba in moved:
                        block.crba, block.length, block.lrba = crba, length, lrba
                raise
            finally:
                self._checkpointing = False

    def _checkpoint(self, moved: list[tuple[MessageBlock, int, int, int]]) -> CheckpointStats:
        self._cpl_written = False
        self._log.sync()  # every current copy can be read back
        number = self._checkpoint_number + 1
        begin = self._log.append(RecordType.CHECKPOINT_BEGIN, encode_checkpoint_begin(number))
        aged = (self._cpl + [(begin, 0)])[-self.cpl_pairs:]
        mode = self.relog_mode
        if mode is RelogMode.OFF:
            threshold = -1
        elif mode is RelogMode.ALL or len(aged) == 1:
            threshold = begin  # every copy older than this checkpoint
        else:
            threshold = aged[0][1]  # copies at or before the end of the oldest checkpoint kept
        by_reference = self.relog_by_reference and mode is not RelogMode.OFF
        bases, reclaim = self._log.segment_bases(), self._segments_to_reclaim() if by_reference else {}
        reclaim_end = max(reclaim.values(), default=0)

        def reclaimed(rba: int) -> bool:
            return rba < reclaim_end and _holder(bases, rba) in reclaim

        oldest_not_logged = begin
        relogged = relogged_bytes = referenced = 0
        for key in sorted(self._queues, key=lambda key: (key.direction, key.peer)):
            queue = self._queues[key]
            blocks = queue.in_order()
            content = 0
            refs: list[tuple[MessageBlock, Ref]] = []
            for block in blocks:
                content += block.size
                copy = not by_reference or reclaimed(block.crba)
                if block.lrba > threshold and not (by_reference and copy):
                    oldest_not_logged = min(oldest_not_logged, block.lrba)
                    continue
                unit = self._in_doubt.get(block.ur) if block.state is MbState.IN_DOUBT_DELETE else None
                state = RelogState.IN_DOUBT_DELETE if unit is not None else RelogState.COMMITTED
                ur, last = (unit.ur, unit.last) if unit is not None else (0, 0)
                moved.append((block, block.crba, block.length, block.lrba))
                relogged += 1
                if not copy:
                    if not block.length:
                        block.length = FRAME_SIZE + len(self._log.read(block.crba)[1])
                    refs.append((block, (block.irba, block.crba, block.length, block.size, state, block.epoch,
                                         block.enqueued_at, block.name, ur, last)))
                    continue
                data = self._read_content(block)
                record = encode_relog(block.irba, state, ur, last, key, block.name, block.epoch, block.enqueued_at,
                                      data)
                block.crba = block.lrba = self._log.append(RecordType.RELOG, record)
                block.length = FRAME_SIZE + len(record)
                relogged_bytes += len(data)
            for first in range(0, len(refs), REFS_PER_RECORD):
                chunk = refs[first:first + REFS_PER_RECORD]
                rba = self._log.append(RecordType.REFS, encode_refs(key, [entry for _block, entry in chunk]))
                for block, _entry in chunk:
                    block.lrba = rba
            referenced += len(refs)
            self._log.append(RecordType.QUEUE_CHECKPOINT, encode_queue_checkpoint(
                key, len(blocks), content, blocks[0].irba if blocks else 0))
        # Position restart at the newest checkpoint start at or before every
        # copy not relogged now (or at the oldest such copy), and raise the
        # CPL's entries to it (Table 1's oldest-not-logged-rba).
        starts = [pair_begin for pair_begin, _ in aged if pair_begin <= oldest_not_logged]
        position = max(starts) if starts else oldest_not_logged
        pairs = tuple((max(pair_begin, position), max(pair_end, position) if pair_end else 0)
                      for pair_begin, pair_end in aged)
        in_doubt = tuple(sorted(((unit.ur, unit.last, unit.queue) for unit in self._in_doubt.values()),
                                key=lambda entry: entry[0]))
        self._fault_point("checkpoint.before_cpl")
        cpl_rba = self._log.append(RecordType.CPL, encode_cpl(CplRecord(
            number, begin, position, self._next_ur, mode, pairs,
            tuple(InDoubtEntry(ur, last, queue) for ur, last, queue in in_doubt))))
        self._log.sync()
        self._cpl_written = True
        self._cpl = [(pair_begin, pair_end or cpl_rba) for pair_begin, pair_end in pairs]
        self._checkpoint_number = number
        self._restart_rba = position
        self._records_since_checkpoint = 0
        self._checkpoint_end_rba = self._log.next_rba
        self._fault_point("checkpoint.before_anchor")
        anchor = encode_anchor(cpl_rba, position, number)
        if self.fsync:
            write_file_atomically(self.path / ANCHOR_FILE, anchor)
        else:
            temporary = self.path / (ANCHOR_FILE + ".tmp")
            temporary.write_bytes(anchor)
            os.replace(temporary, self.path / ANCHOR_FILE)
        self._fault_point("checkpoint.before_drop")
        dropped = self._log.drop_before(position, self._content_segments(position))
        stats = CheckpointStats(number, begin, cpl_rba, position, relogged, relogged_bytes,
                                self._log.next_rba - begin, len(dropped), referenced)
        self._last_checkpoint_cost = stats.bytes_written
        self._checkpoints += 1
        self._referenced += referenced
        self._relogged += relogged
        self._relogged_bytes += relogged_bytes
        self._checkpoint_bytes += stats.bytes_written
        self._checkpoint_stats = stats
        return stats

    def _segments_to_reclaim(self) -> dict[int, int]:
        """Base and end of the segments restart no longer reads that queued
        messages' content fills at most RECLAIM_FILL of: their messages
        are relogged with content, so that the segments can go."""
        old = {base: end for base, end in self._log.segment_extents() if end <= self._restart_rba}
        if not old:
            return {}
        bases = self._log.segment_bases()
        filled = dict.fromkeys(old, 0)
        limit = max(old.values())
        for queue in self._queues.values():
            for block in queue.messages.values():
                if block.crba < limit:
                    base = _holder(bases, block.crba)
                    if base in filled:
                        filled[base] += block.length or block.size
        return {base: old[base] for base, used in filled.items() if used <= RECLAIM_FILL * (old[base] - base)}

    def _content_segments(self, before: int) -> set[int]:
        """Bases of the segments ending at or before ``before`` that hold a queued message's content."""
        bases = self._log.segment_bases()
        keep = set()
        for queue in self._queues.values():
            for block in queue.messages.values():
                if block.crba < before:
                    keep.add(_holder(bases, block.crba))
        return keep

    @property
    def last_checkpoint(self) -> CheckpointStats | None:
        return self._checkpoint_stats

    @property
    def counters(self) -> SpoolCounters:
        return SpoolCounters(self._checkpoints, self._relogged, self._relogged_bytes, self._checkpoint_bytes,
                             self._log.syncs, self._referenced)

    @property
    def restart_rba(self) -> int:
        return self._restart_rba

    @property
    def cpl(self) -> tuple[tuple[int, int], ...]:
        """The Checkpoint Positioning List, oldest pair first: (begin RBA, end RBA)."""
        return tuple(self._cpl)

    # -- status --------------------------------------------------------------------------------

    def status(self) -> SpoolStatus:
        with self._lock:
            self._check_open()
            messages = queued_bytes = 0
            oldest: tuple[float, str] | None = None
            for key, queue in self._queues.items():
                for block in queue.messages.values():
                    messages += 1
                    queued_bytes += block.size
                    if oldest is None or block.enqueued_at < oldest[0]:
                        oldest = (block.enqueued_at, str(key))
            end = self._log.next_rba
            now = self.clock()
            return SpoolStatus(
                path=str(self.path), depths=tuple(self.depths()), messages=messages, queued_bytes=queued_bytes,
                oldest_enqueued_at=oldest[0] if oldest else None,
                oldest_age_seconds=max(0.0, now - oldest[0]) if oldest else None,
                oldest_queue=oldest[1] if oldest else None, in_doubt_dequeues=len(self._in_doubt),
                log_start_rba=self._log.first_rba, restart_rba=self._restart_rba, end_rba=end,
                restart_span_bytes=end - self._restart_rba, segments=len(self._log.segment_bases()),
                disk_bytes=self._log.disk_bytes(), checkpoints=self._checkpoint_number,
                records_since_checkpoint=self._records_since_checkpoint,
                bytes_since_checkpoint=end - self._checkpoint_end_rba, checkpoint_every=self.checkpoint_every,
                checkpoint_bytes=self.checkpoint_bytes,
                cpl_pairs=self.cpl_pairs, relog_mode=self.relog_mode.value)

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the spool.  When a quarter of a checkpoint interval has been
        logged since the last checkpoint, a termination checkpoint is taken
        first, so the next start reads little and old segments go now.  It
        is only a saving: if it fails, the close goes on and the next start
        reads a longer span."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._checkpoint_due(fraction=4) and not self._checkpointing:
                    try:
                        self.checkpoint()
                    except (OSError, SpoolError) as error:
                        log.warning("%s: no termination checkpoint (%s); the next start reads a longer span",
                                    self.path, error)
                self._log.sync()
            finally:
                self._closed = True
                self._log.close()
                os.close(self._lock_fd)
                self._lock_fd = -1

    def _abandon(self) -> None:
        """Drop everything not yet written, as a crash would (tests)."""
        self._closed = True
        log = getattr(self, "_log", None)
        if log is not None:
            log.close(clean=False)  # the unwritten buffer dies with the process
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> "SpoolQueues":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _holder(bases: list[int], rba: int) -> int:
    """The base of the segment holding ``rba`` (bases sorted)."""
    return bases[bisect.bisect_right(bases, rba) - 1]


def _check_content_segments(restart: Restart, segments: list[SegmentFile], start: int) -> None:
    """Every queued message's content record must be in a segment file that
    exists (those before the restart position are not read, so a removed
    one would otherwise go unnoticed until the message is read)."""
    bases = [segment.base for segment in segments]
    ends = {segment.base: segment.base + segment.size for segment in segments}
    for queue in restart.queues.values():
        for block in queue.messages.values():
            if block.crba >= start:
                continue
            index = bisect.bisect_right(bases, block.crba) - 1
            if index < 0 or block.crba >= ends[bases[index]]:
                raise SpoolCorrupt(block.crba, segment_name(bases[index]) if index >= 0 else segment_name(0),
                                   f"the content of {queue.queue} {block.name} is at RBA {block.crba}, in a segment "
                                   "file that is missing: segment files were removed")


# -- reading a span (shared with check_spool) -------------------------------------------------


@dataclass(slots=True)
class Span:
    restart: Restart
    result: ScanResult
    segments: list[SegmentFile]
    start: int
    from_anchor: bool
    anchor: tuple[int, int, int] | None


def read_anchor(directory: Path) -> tuple[int, int, int] | None:
    try:
        return decode_anchor((directory / ANCHOR_FILE).read_bytes())
    except OSError:
        return None


def _anchor_start(directory: Path, segments: list[SegmentFile], anchor: tuple[int, int, int] | None) -> int | None:
    """The restart position the anchor names, if its CPL record verifies."""
    if anchor is None or not segments:
        return None
    cpl_rba, restart_rba, _number = anchor
    holder = None
    for segment in segments:
        if segment.base <= cpl_rba < segment.base + segment.size:
            holder = segment
    if holder is None or restart_rba < segments[0].base + SEGMENT_HEADER_SIZE or restart_rba > cpl_rba:
        return None
    try:
        record_type, payload = read_record_at(holder.path, holder.base, cpl_rba)
        record = decode_payload(record_type, payload)
    except (SpoolError, BadPayload, OSError):
        return None
    if not isinstance(record, CplRecord) or record.restart != restart_rba:
        return None
    return restart_rba


def read_span(directory: Path, pairs: int, *, salvage: bool = False) -> Span:
    """Phase 1's reading: find the restart position (the anchor's CPL
    record, else the start of the log) and feed every record from there."""
    segments = list_segments(directory)
    anchor = read_anchor(directory)
    start = _anchor_start(directory, segments, anchor)
    from_anchor = start is not None
    if start is None and anchor is not None and not salvage:
        # Reading the whole retained log instead of the anchor's span is
        # always correct, but only while the log still holds the anchor's
        # restart position: segments go only up to a restart position, so
        # no segment at all, or none reaching back to it, means segment
        # files were removed, and starting from what is left would drop
        # what they held without a word.
        cpl_rba, restart_rba, number = anchor
        first = segments[contiguous_start(segments)] if segments else None
        if first is None or restart_rba < first.base:
            held = (f"the log is contiguous only from RBA {first.base}" if first is not None
                    else "there are no segment files")
            raise SpoolCorrupt(restart_rba, segments[0].path.name if segments else segment_name(0),
                               f"the anchor's checkpoint #{number} restarts at RBA {restart_rba} but {held}: "
                               "segment files are missing")
    if start is None:
        # The whole retained log, from where it is contiguous (reclaimed
        # segments leave gaps only before a restart position).
        start = segments[contiguous_start(segments)].base + SEGMENT_HEADER_SIZE if segments else SEGMENT_HEADER_SIZE
    restart = Restart(pairs)
    result = ScanResult(start)
    for rba, type_byte, payload in scan(segments, start, result, salvage=salvage):
        try:
            record = decode_payload(type_byte & 0x7F, payload)
        except BadPayload as error:
            if not salvage:
                raise SpoolCorrupt(rba, "?", f"record does not decode: {error}") from None
            restart.problems.append(f"RBA {rba}: record does not decode: {error}")
            continue
        restart.feed(rba, record, FRAME_SIZE + len(payload))
    if not segments:
        result.end = start
    return Span(restart, result, segments, start, from_anchor, anchor)
