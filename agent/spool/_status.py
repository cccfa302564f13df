"""What the running spool says about itself: ``status()``, ``depths()``
and ``in_doubt()`` of :class:`SpoolQueues`.

Rules of this file:
* Read only: it looks at the spool's structures (under the spool's lock,
  which the caller holds) and builds frozen values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from ..queue_interface import QueueDepth
from ._format import QueueId
from ._log import LogWriter
from ._recovery import InDoubt, QueueBlock
from ._values import InDoubtDequeue, SpoolStatus


class _Spool(Protocol):
    """What of a SpoolQueues its status reads (its own structures, under its lock)."""

    path: Path
    clock: Callable[[], float]
    checkpoint_every: int
    checkpoint_bytes: int
    cpl_pairs: int
    relog_mode: object
    _queues: dict[QueueId, QueueBlock]
    _log: LogWriter
    _in_doubt: dict[int, InDoubt]
    _checkpoint_number: int
    _records_since_checkpoint: int
    _checkpoint_end_rba: int

    @property
    def restart_rba(self) -> int: ...

    def depths(self) -> list[QueueDepth]: ...


def spool_status(spool: _Spool) -> SpoolStatus:
    messages = queued_bytes = 0
    oldest: tuple[float, str] | None = None
    for key, queue in spool._queues.items():
        for block in queue.messages.values():
            messages += 1
            queued_bytes += block.size
            if oldest is None or block.enqueued_at < oldest[0]:
                oldest = (block.enqueued_at, str(key))
    log = spool._log
    end = log.next_rba
    now = spool.clock()
    return SpoolStatus(
        path=str(spool.path), depths=tuple(spool.depths()), messages=messages, queued_bytes=queued_bytes,
        oldest_enqueued_at=oldest[0] if oldest else None,
        oldest_age_seconds=max(0.0, now - oldest[0]) if oldest else None,
        oldest_queue=oldest[1] if oldest else None, in_doubt_dequeues=len(spool._in_doubt),
        log_start_rba=log.first_rba, restart_rba=spool.restart_rba, end_rba=end,
        restart_span_bytes=end - spool.restart_rba, segments=len(log.segment_bases()),
        disk_bytes=log.disk_bytes(), checkpoints=spool._checkpoint_number,
        records_since_checkpoint=spool._records_since_checkpoint,
        bytes_since_checkpoint=end - spool._checkpoint_end_rba, checkpoint_every=spool.checkpoint_every,
        checkpoint_bytes=spool.checkpoint_bytes, cpl_pairs=spool.cpl_pairs, relog_mode=spool.relog_mode.value)


def queue_depths(queues: dict[QueueId, QueueBlock]) -> list[QueueDepth]:
    counts: dict[str, list[int]] = {}
    for key, queue in queues.items():
        counts.setdefault(key.peer, [0, 0])[int(key.direction)] = len(queue.messages)
    return [QueueDepth(peer, inbound, outbound) for peer, (inbound, outbound) in sorted(counts.items())]


def in_doubt_dequeues(queues: dict[QueueId, QueueBlock], in_doubt: dict[int, InDoubt]) -> tuple[InDoubtDequeue, ...]:
    result = []
    for unit in sorted(in_doubt.values(), key=lambda unit: unit.ur):
        queue = queues[unit.queue]
        names = tuple(sorted(queue.messages[irba].name for irba in unit.irbas if irba in queue.messages))
        result.append(InDoubtDequeue(unit.ur, unit.queue.peer, unit.last, names))
    return tuple(result)
