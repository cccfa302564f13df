"""What the spool hands back: the values its public methods return
(:class:`DequeueToken`, :class:`Resolution`, :class:`CheckpointStats`,
:class:`SpoolStatus`, ...).

Rules of this file:
* Values only: frozen, slotted dataclasses that hold no reference to the
  spool, its lock or its files, so a caller may keep them after the spool
  closes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..queue_interface import QueueDepth


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
    requeued: tuple[str, ...]  # it did not: the messages are queued again


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

