"""Opening a spool's files: the lock, and restart (EP 0 280 773's four
phases, run by :class:`Restart` over the span :func:`read_span` reads),
handing back the state the running :class:`SpoolQueues` continues from.

Rules of this file:
* One opener at a time: the ``LOCK`` file's flock is the lock; its text
  only names the holder, for the message another opener gets (a holder
  that died leaves a stale number, which means nothing).
* A torn tail (the writer crashed mid-record) is cut off before anything
  is appended; a dropped last segment is removed.
* Phase 3's compensation records, and the COMMITs of in-doubt units found
  finished, are appended and synced before the spool is used.
* Nothing here holds the spool object: it gets the path and its settings
  and returns a :class:`Reopened`; if restart fails, the log it opened is
  closed as a crash would (unwritten records dropped).
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from codec.fsutil import fsync_directory

from ._checkpoint import forget_empty
from ._errors import SpoolCorrupt, SpoolLocked
from ._format import SEGMENT_HEADER_SIZE, QueueId, RecordType, encode_end, encode_undo_add, encode_undo_delete
from ._log import LogWriter, SegmentFile
from ._recovery import InDoubt, MessageBlock, QueueBlock, RestartStats
from ._span import check_content_segments, read_span

LOCK_FILE = "LOCK"
_CONTENT_TYPES = {RecordType.ADD, RecordType.RELOG, RecordType.UNDO_DELETE}


def lock_spool(path: Path) -> int:
    """Take the spool's lock: the open LOCK file's descriptor, or SpoolLocked."""
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise SpoolLocked(f"{path}: the spool is open in {holder}; stop that agent first") from None
    # Who holds it, for the message another opener gets (the lock is the
    # flock, not this text: a holder that died left only a stale number).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


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


def read_content(log: LogWriter, block: MessageBlock) -> bytes:
    """The content of a queued message, read back from its copy in the log."""
    record_type, payload = log.read(block.crba, block.length)
    if record_type not in _CONTENT_TYPES or len(payload) < block.size:
        raise SpoolCorrupt(block.crba, "?", f"the copy of {block.name} is not a message record")
    return payload[len(payload) - block.size:] if block.size else b""


@dataclass(slots=True)
class Reopened:
    """The state a spool continues from after restart."""

    log: LogWriter
    queues: dict[QueueId, QueueBlock]
    next_ur: int
    in_doubt: dict[int, InDoubt]
    cpl: list[tuple[int, int]]
    checkpoint_number: int
    records_since_checkpoint: int
    restart_rba: int
    checkpoint_end_rba: int  # where the last complete checkpoint ended (bytes logged since count toward the next)
    last_checkpoint_cost: int  # what the last checkpoint wrote (the next waits for twice that to be logged)
    stats: RestartStats
    problems: tuple[str, ...]
    checkpointed: bool  # False: the log holds no complete checkpoint yet


def reopen(path: Path, *, cpl_pairs: int, segment_bytes: int, fsync: bool,
           fault: Callable[[str], None] | None = None) -> Reopened:
    """Restart from the spool's files in ``path``.  ``fault`` (tests) is
    called at the named crash point, after a sync."""
    started = time.perf_counter()
    span = read_span(path, cpl_pairs)
    restart, result = span.restart, span.result
    segments = span.segments
    torn_bytes = result.torn.discarded if result.torn is not None else 0
    if result.torn is not None:  # (spare zeros after the end are kept for the writer)
        if result.dropped_segment is not None:
            (path / result.dropped_segment).unlink()
            segments = segments[:-1]
        else:
            last = segments[-1]
            with open(last.path, "r+b") as handle:
                handle.truncate(result.end - last.base)
                if fsync:
                    os.fsync(handle.fileno())
            segments[-1] = SegmentFile(last.base, last.path, result.end - last.base)
        if fsync:
            fsync_directory(path)
    restart.forward()
    check_content_segments(restart, segments, span.start)
    end = result.end if segments else SEGMENT_HEADER_SIZE
    log = LogWriter(path, segments=segments, end=end, segment_bytes=segment_bytes, fsync=fsync)
    try:
        def emit_compensation(kind: str, fields: dict) -> int:
            if kind == "undo_add":
                rba = log.append(RecordType.UNDO_ADD, encode_undo_add(fields["ur"], fields["irba"],
                                                                      fields["undone"], fields["queue"]))
            elif kind == "undo_delete":
                rba = log.append(RecordType.UNDO_DELETE, encode_undo_delete(
                    fields["ur"], fields["irba"], fields["undone"], fields["queue"], fields["name"], fields["epoch"],
                    fields["enqueued_at"], fields["data"]))
            else:
                rba = log.append(RecordType.ABORT, encode_end(fields["ur"]))
            if fault is not None:
                log.sync()  # what happened before the crash point is on disk
                fault("restart.compensating")
            return rba

        restart.backward(emit_compensation, lambda block: read_content(log, block))
        for ur in restart.finished_in_doubt_units():
            log.append(RecordType.COMMIT, encode_end(ur))
        log.sync()
        cpl = restart.cleanup(restart.cpl(span.start))
        forget_empty(restart.queues, restart.in_doubt)  # as the running spool does at a checkpoint
    except BaseException:
        log.close()  # the unwritten buffer dies, as with a crash
        raise
    last_cpl = restart.last_cpl
    stats = RestartStats(
        restart_rba=span.start, end_rba=log.next_rba, bytes_read=result.bytes_read,
        records_read=result.records, checkpoint_rba=last_cpl[0] if last_cpl else None,
        from_anchor=span.from_anchor, relogs_honoured=restart.relogs_honoured,
        relogs_ignored=restart.relogs_ignored, pending_deletes=restart.pending_created,
        pending_deletes_matched=restart.pending_matched, units_backed_out=restart.backed_out,
        compensation_records=restart.compensations, in_doubt=len(restart.in_doubt), torn_bytes=torn_bytes,
        seconds=time.perf_counter() - started)
    return Reopened(
        log=log, queues=restart.queues, next_ur=restart.max_ur + 1, in_doubt=restart.in_doubt, cpl=cpl,
        checkpoint_number=restart.max_checkpoint,
        records_since_checkpoint=restart.records_since_checkpoint + restart.compensations,
        restart_rba=last_cpl[1].restart if last_cpl else span.start,
        checkpoint_end_rba=last_cpl[0] if last_cpl else span.start,
        last_checkpoint_cost=last_cpl[0] - last_cpl[1].begin if last_cpl else 0,
        stats=stats, problems=tuple(restart.problems), checkpointed=last_cpl is not None)
