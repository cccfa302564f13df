"""The crash-safe message spool: :class:`SpoolQueues`, the recovery-log
implementation of :class:`agent.queue_interface.MessageQueues` (DESIGN §5).

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

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from codec.errors import BadFileName
from codec.names import Kind, MessageName, check_site_name

from ..queue_interface import MessageQueues, QueueDepth, QueueError
from ._checkpoint import (Moved, content_segments, forget_empty, relog_queues, relog_threshold, restart_position,
                          segments_to_reclaim)
from ._errors import SpoolError
from ._format import (FRAME_SIZE, CplRecord, Direction, InDoubtEntry, QueueId, RecordType, RelogMode, encode_add,
                      encode_anchor, encode_checkpoint_begin, encode_cpl, encode_delete, encode_end, encode_prepare,
                      encode_undo_delete)
from ._recovery import InDoubt, MbState, MessageBlock, QueueBlock
from ._reopen import lock_spool, read_content, reopen
from ._span import read_anchor, read_span, write_anchor  # noqa: F401 (read_*: shared with check_spool)
from ._status import in_doubt_dequeues, queue_depths, spool_status
from ._summary import SummaryKeeper
from ._values import CheckpointStats, DequeueToken, InDoubtDequeue, Resolution, SpoolCounters, SpoolStatus

_MAX_NAME_BYTES = 1024

DEFAULT_CHECKPOINT_BYTES = 128 * 1024 * 1024
# Bytes a group commit block appends before a call waits for them (they wait
# in memory until written): a block's memory is bounded, whatever it puts.
GROUP_COMMIT_BUFFER = 16 * 1024 * 1024
# A checkpoint due by records waits for this many times what the previous one wrote to be logged.
CHECKPOINT_COST_FACTOR = 2
log = logging.getLogger("fieldsync.spool")


class _SimulatedCrash(BaseException):
    """Raised by test fault hooks; never by the spool itself."""


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
    patent's termination checkpoint).  ``cpl_pairs``: checkpoints a
    message's newest copy may age before it is relogged (the CPL's n).
    ``relog``: ``"selective"`` (the patent), ``"all"`` (relog every queued
    message at every checkpoint) or ``"off"``.  ``relog_by_reference``: relog
    a message whose content stays on disk by a REFS entry, and space
    checkpoints by their cost; ``False`` copies every relogged message
    (format version 1's behaviour).  ``fsync=False`` keeps the format but
    gives up durability (benchmark set-up only)."""

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
        self._summary = SummaryKeeper()  # the depths for `agent status` (docs/spool-format.md, "summary")
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_spool(self.path)
        try:
            self._restart()
        except BaseException:
            self._abandon()
            raise

    # -- restart -------------------------------------------------------------------------------

    def _restart(self) -> None:
        reopened = reopen(self.path, cpl_pairs=self.cpl_pairs, segment_bytes=self.segment_bytes, fsync=self.fsync,
                          fault=self._fault)
        self._log = reopened.log
        self._queues: dict[QueueId, QueueBlock] = reopened.queues
        self._next_ur = reopened.next_ur
        self._in_doubt: dict[int, InDoubt] = reopened.in_doubt
        self._cpl = reopened.cpl
        self._checkpoint_number = reopened.checkpoint_number
        self._records_since_checkpoint = reopened.records_since_checkpoint
        self._restart_rba = reopened.restart_rba
        self._checkpoint_end_rba = reopened.checkpoint_end_rba
        self._checkpoint_stats: CheckpointStats | None = None
        self._last_checkpoint_cost = reopened.last_checkpoint_cost
        self.last_restart = reopened.stats
        self.restart_problems = reopened.problems
        self._summary.reset(self._queues, read_from=reopened.stats.restart_rba)
        self._summary.adopt(self.path, self._log.next_rba)  # still current: nothing to write
        if not reopened.checkpointed:
            self.checkpoint()  # the spool's first checkpoint (CB1 in the patent's figures)
        self._write_summary(force=True)

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
        self._next_ur += 1
        return self._next_ur - 1

    def _read_content(self, block: MessageBlock) -> bytes:
        return read_content(self._log, block)

    def _durable(self, end: int) -> None:
        if getattr(self._local, "depth", 0):
            self._local.end = max(getattr(self._local, "end", 0), end)
            if end - self._log.durable_rba > GROUP_COMMIT_BUFFER:
                self._log.sync(end)  # the block's records wait in memory: not more than this
        else:
            self._log.sync(end)
            self._write_summary()
        self._maybe_checkpoint()

    def _write_summary(self, *, force: bool = False) -> None:
        """Update the summary file if due (only a saving for `agent status`: a failure is a warning)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._summary.write_if_due(self.path, self._log, self._queues, checkpoint=self._checkpoint_number,
                                           in_doubt=len(self._in_doubt), problems=self.restart_problems,
                                           force=force)
            except OSError as error:
                log.warning("%s: the spool summary was not written (%s); `agent status` reads the whole span",
                            self.path, error)

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
                self._write_summary()
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
                block = MessageBlock(irba, irba, len(data), name, epoch, enqueued_at, FRAME_SIZE + len(record))
                queue.add(block)
                self._summary.added(queue, block)
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
            self._summary.changed(queue.queue)
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
            return queue_depths(self._queues)

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
        self._write_summary()
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
                self._summary.changed(queue.queue)
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
            return in_doubt_dequeues(self._queues, self._in_doubt)

    def resolve_in_doubt(self, peer: str, log_received: int) -> Resolution:
        """Settle ``peer``'s in-doubt dequeues with the database's current
        ``log_received`` for it: a dequeue whose transaction set
        log_received to ``last`` committed iff ``log_received >= last``."""
        check_site_name(peer)
        dequeued: list[str] = []
        requeued: list[str] = []
        with self._lock:
            units = [unit.ur for unit in self._in_doubt.values() if unit.queue == QueueId(Direction.INBOUND, peer)]
        for ur in sorted(units):
            unit = self._in_doubt.get(ur)
            if unit is None:
                continue
            gone, back = self._end_dequeue(ur, commit=log_received >= unit.last, wait=True)
            dequeued += gone
            requeued += back
        return Resolution(peer, log_received, tuple(sorted(dequeued)), tuple(sorted(requeued)))

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self) -> CheckpointStats:
        """Take a checkpoint now (they also run every ``checkpoint_every`` records)."""
        with self._lock:
            self._check_open()
            self._checkpointing = True
            moved: list[Moved] = []
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

    def _checkpoint(self, moved: list[Moved]) -> CheckpointStats:
        self._cpl_written = False
        self._log.sync()  # every current copy can be read back
        number = self._checkpoint_number + 1
        begin = self._log.append(RecordType.CHECKPOINT_BEGIN, encode_checkpoint_begin(number))
        mode = self.relog_mode
        aged, threshold = relog_threshold(mode, self._cpl, begin, self.cpl_pairs)
        by_reference = self.relog_by_reference and mode is not RelogMode.OFF
        reclaim = segments_to_reclaim(self._log, self._queues, self._restart_rba) if by_reference else {}
        done = relog_queues(self._log, self._queues, self._in_doubt, begin=begin, threshold=threshold,
                            by_reference=by_reference, reclaim=reclaim, read_content=self._read_content, moved=moved)
        relogged, relogged_bytes, referenced = done.relogged, done.relogged_bytes, done.referenced
        position, pairs = restart_position(aged, done.oldest_not_logged)
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
        write_anchor(self.path, encode_anchor(cpl_rba, position, number), fsync=self.fsync)
        self._summary.read_from = position  # where a restart reads from, now that the anchor says so
        for key in forget_empty(self._queues, self._in_doubt):  # as the checkpoint did
            self._lookup.pop((key.direction, key.peer), None)
            self._summary.changed(key)
        self._fault_point("checkpoint.before_drop")
        dropped = self._log.drop_before(position, content_segments(self._log, self._queues, position))
        stats = CheckpointStats(number, begin, cpl_rba, position, relogged, relogged_bytes,
                                self._log.next_rba - begin, len(dropped), referenced)
        self._last_checkpoint_cost = stats.bytes_written
        self._checkpoints += 1
        self._referenced += referenced
        self._relogged += relogged
        self._relogged_bytes += relogged_bytes
        self._checkpoint_bytes += stats.bytes_written
        self._checkpoint_stats = stats
        self._write_summary(force=True)
        return stats

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
            return spool_status(self)

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the spool, after a termination checkpoint when a quarter of a checkpoint interval was logged
        since the last (a saving only, so the next start reads little: if it fails, the close goes on)."""
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
                self.at_rest()
            finally:
                self._closed = True
                self._log.close()
                os.close(self._lock_fd)
                self._lock_fd = -1

    def at_rest(self) -> None:
        """The agent waits now: what waits for a group commit is made durable, the summary current."""
        with self._lock:
            if not self._closed:
                self._log.sync()
                self._write_summary(force=True)

    def _abandon(self) -> None:
        """Drop everything not yet written, as a crash would (tests)."""
        self._closed = True
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()  # the unwritten buffer dies with the process
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> "SpoolQueues":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
