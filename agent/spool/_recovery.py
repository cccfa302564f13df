"""The queue structures and the four restart phases of EP 0 280 773.

Rules of this file:
* The structures (queue blocks, message blocks, in-doubt units of
  recovery) are the patent's QB, MB and WUB; the running spool and the
  restart build the very same objects.
* :class:`Restart` is driven only by decoded records: it reads no file and
  writes none.  Phase 3 hands the records it must log to an ``emit``
  callback and asks for message content through ``read``; everything else
  is pure, so ``check_spool`` can run a restart without touching the spool.
* Table 3's UR states come from the whole span read in phase 1 (the
  recovery manager's part), so each REDO record is judged knowing how its
  unit of recovery ended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

from ._format import (Abort, Add, CheckpointBegin, Commit, CplRecord, Delete, InDoubtEntry, Prepare, QueueCheckpoint,
                      QueueId, Record, Refs, Relog, RelogState, UndoAdd, UndoDelete)


class MbState(enum.Enum):
    COMMITTED = "committed"
    IN_DOUBT_DELETE = "in-doubt delete"


class MessageBlock:
    """One queued message (the patent's MB).  Its content is the last
    ``size`` bytes of the record at ``crba``."""

    __slots__ = ("irba", "crba", "lrba", "length", "size", "name", "epoch", "enqueued_at", "state", "ur")

    def __init__(self, irba: int, crba: int, size: int, name: str, epoch: int | None, enqueued_at: float,
                 length: int = 0, lrba: int = 0) -> None:
        self.irba = irba  # RBA of the record that first queued it
        self.crba = crba  # RBA of the record holding its content (ADD, RELOG or UNDO_DELETE)
        self.lrba = lrba or crba  # RBA of the newest record restart reads for it (those, or a REFS record)
        self.length = length  # the content record's whole length, when known (saves a read)
        self.size = size
        self.name = name
        self.epoch = epoch
        self.enqueued_at = enqueued_at
        self.state = MbState.COMMITTED
        self.ur = 0  # the in-doubt unit of recovery deleting it, if any

    def __repr__(self) -> str:
        return f"MB({self.name!r} irba={self.irba} crba={self.crba} lrba={self.lrba} {self.state.value})"


class QueueBlock:
    """One queue (the patent's QB): messages by IRBA, and their names."""

    __slots__ = ("queue", "messages", "names")

    def __init__(self, queue: QueueId) -> None:
        self.queue = queue
        self.messages: dict[int, MessageBlock] = {}
        self.names: dict[str, int] = {}

    def add(self, block: MessageBlock) -> None:
        self.messages[block.irba] = block
        self.names[block.name] = block.irba

    def remove(self, irba: int) -> MessageBlock | None:
        block = self.messages.pop(irba, None)
        if block is not None and self.names.get(block.name) == irba:
            del self.names[block.name]
        return block

    def by_name(self, name: str) -> MessageBlock | None:
        irba = self.names.get(name)
        return None if irba is None else self.messages[irba]

    def in_order(self) -> list[MessageBlock]:
        return sorted(self.messages.values(), key=lambda block: block.irba)


@dataclass(slots=True)
class InDoubt:
    """A dequeue waiting for the database's verdict (the patent's WUB)."""

    ur: int
    queue: QueueId
    last: int  # committed iff the peer's log_received >= last
    irbas: set[int] = field(default_factory=set)


class Outcome(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    IN_DOUBT = "in-doubt"
    INFLIGHT = "inflight"  # never finished: backed out by phase 3


@dataclass(slots=True)
class _Unit:
    ur: int
    prepared: bool = False
    ended: Outcome | None = None
    compensated: set[int] = field(default_factory=set)  # IRBAs of the messages already put back or taken away
    originals: list[tuple[int, Add | Delete]] = field(default_factory=list)
    last: int = 0
    queue: QueueId | None = None

    @property
    def outcome(self) -> Outcome:
        if self.ended is not None:
            return self.ended
        if self.compensated or not self.prepared:
            return Outcome.INFLIGHT  # an abort in progress is finished as one
        return Outcome.IN_DOUBT


@dataclass(frozen=True, slots=True)
class RestartStats:
    """What the last restart did (exposed as ``SpoolQueues.last_restart``)."""

    restart_rba: int
    end_rba: int
    bytes_read: int
    records_read: int
    checkpoint_rba: int | None  # the CPL record phase 1 started from
    from_anchor: bool
    relogs_honoured: int
    relogs_ignored: int  # relog records (and REFS entries) of checkpoints that never completed
    pending_deletes: int  # deletes read before the relog record they match
    pending_deletes_matched: int
    units_backed_out: int
    compensation_records: int
    in_doubt: int
    torn_bytes: int
    seconds: float


class Restart:
    """Phases 1-4 over the records of one span of the log."""

    def __init__(self, pairs: int) -> None:
        self.pairs = pairs
        self.records: list[tuple[int, Record]] = []
        self.lengths: dict[int, int] = {}
        self.queues: dict[QueueId, QueueBlock] = {}
        self.units: dict[int, _Unit] = {}
        self.completed: list[tuple[int, int]] = []  # (begin, end) of every completed checkpoint in the span
        self.last_cpl: tuple[int, CplRecord] | None = None
        self.max_ur = 0
        self.max_checkpoint = 0
        self.pending: dict[tuple[QueueId, int], int] = {}  # (queue, irba) -> ur of the delete
        self.in_doubt: dict[int, InDoubt] = {}
        self.relogs_honoured = self.relogs_ignored = 0
        self.pending_created = self.pending_matched = 0
        self.backed_out = self.compensations = 0
        self.problems: list[str] = []
        self.records_since_checkpoint = 0

    # -- phase 1: current status rebuild --------------------------------------------------------

    def _unit(self, ur: int) -> _Unit:
        unit = self.units.get(ur)
        if unit is None:
            unit = self.units[ur] = _Unit(ur)
            self.max_ur = max(self.max_ur, ur)
        return unit

    def _queue(self, queue: QueueId) -> QueueBlock:
        block = self.queues.get(queue)
        if block is None:
            block = self.queues[queue] = QueueBlock(queue)
        return block

    def feed(self, rba: int, record: Record, length: int = 0) -> None:
        """Phase 1: take one record of the span (in log order); ``length``
        is its whole length in the log."""
        self.records.append((rba, record))
        if length and isinstance(record, (Add, UndoDelete, Relog)):
            self.lengths[rba] = length
        self.records_since_checkpoint += 1
        if isinstance(record, (Add, Delete, UndoDelete, UndoAdd)):
            unit = self._unit(record.ur)
            self._queue(record.queue)
            if isinstance(record, (Add, Delete)):
                unit.originals.append((rba, record))
            else:
                unit.compensated.add(record.irba)
        elif isinstance(record, Prepare):
            unit = self._unit(record.ur)
            unit.prepared, unit.last, unit.queue = True, record.last, record.queue
        elif isinstance(record, (Commit, Abort)):
            self._unit(record.ur).ended = Outcome.COMMITTED if isinstance(record, Commit) else Outcome.ABORTED
        elif isinstance(record, Relog):
            self._queue(record.queue)
            if record.state is RelogState.IN_DOUBT_DELETE:
                unit = self._unit(record.ur)
                unit.prepared, unit.last, unit.queue = True, record.last, record.queue
        elif isinstance(record, Refs):
            self._queue(record.queue)
            for entry in record.entries:
                if entry[4] is RelogState.IN_DOUBT_DELETE:
                    unit = self._unit(entry[8])
                    unit.prepared, unit.last, unit.queue = True, entry[9], record.queue
        elif isinstance(record, QueueCheckpoint):
            self._queue(record.queue)
        elif isinstance(record, CheckpointBegin):
            self.max_checkpoint = max(self.max_checkpoint, record.number)
        elif isinstance(record, CplRecord):
            self.completed.append((record.begin, rba))
            self.last_cpl = (rba, record)
            self.max_checkpoint = max(self.max_checkpoint, record.number)
            self.records_since_checkpoint = 0
            self.max_ur = max(self.max_ur, record.next_ur - 1)
            for entry in record.in_doubt:
                unit = self._unit(entry.ur)
                unit.prepared, unit.last, unit.queue = True, entry.last, entry.queue
                self._queue(entry.queue)

    def cpl(self, start: int) -> list[tuple[int, int]]:
        """The Checkpoint Positioning List as of the end of the log (Table 2):
        the last CPL record's pairs, its own pair ending at its RBA; without
        one, every pair at the start of the span."""
        if self.last_cpl is None:
            return [(start, start)] * self.pairs
        rba, record = self.last_cpl
        return [(begin, end or rba) for begin, end in record.pairs]

    # -- phase 2: forward recovery -------------------------------------------------------------

    def _within_completed_checkpoint(self, rba: int) -> bool:
        return any(begin < rba < end for begin, end in self.completed)

    def forward(self) -> None:
        for rba, record in self.records:
            if isinstance(record, Add):
                outcome = self.units[record.ur].outcome
                if outcome in (Outcome.COMMITTED, Outcome.ABORTED):
                    self._queue(record.queue).add(MessageBlock(rba, rba, record.size, record.name, record.epoch,
                                                               record.enqueued_at, self.lengths.get(rba, 0)))
            elif isinstance(record, Delete):
                self._forward_delete(rba, record)
            elif isinstance(record, UndoDelete):
                queue = self._queue(record.queue)
                self.pending.pop((record.queue, record.irba), None)
                block = queue.messages.get(record.irba)
                if block is None:
                    block = MessageBlock(record.irba, rba, record.size, record.name, record.epoch,
                                         record.enqueued_at)
                    queue.add(block)
                block.crba, block.size, block.state, block.ur = rba, record.size, MbState.COMMITTED, 0
                block.lrba, block.length = rba, self.lengths.get(rba, 0)
            elif isinstance(record, UndoAdd):
                self._queue(record.queue).remove(record.irba)
            elif isinstance(record, Relog):
                if self._within_completed_checkpoint(rba):
                    self.relogs_honoured += 1
                    self._forward_relog(rba, record.queue, record.irba, record.state, record.ur, record.name,
                                        record.epoch, record.enqueued_at, record.size, rba, self.lengths.get(rba, 0))
                else:
                    self.relogs_ignored += 1
            elif isinstance(record, Refs):
                if self._within_completed_checkpoint(rba):
                    self.relogs_honoured += len(record.entries)
                    self._forward_refs(rba, record)
                else:
                    self.relogs_ignored += len(record.entries)

    def _forward_delete(self, rba: int, record: Delete) -> None:
        outcome = self.units[record.ur].outcome
        if outcome is Outcome.INFLIGHT:
            return
        queue = self._queue(record.queue)
        block = queue.messages.get(record.irba)
        if block is None:
            # Its copy lies before the span; a relog record of it may follow (Table 3).
            self.pending[(record.queue, record.irba)] = record.ur
            self.pending_created += 1
        elif outcome is Outcome.IN_DOUBT:
            block.state, block.ur = MbState.IN_DOUBT_DELETE, record.ur
        else:
            queue.remove(record.irba)

    def _forward_refs(self, rba: int, record: Refs) -> None:
        """The entries of a REFS record: each as a RELOG record, the common
        case (a committed message not seen yet, no pending delete) inline
        because restart meets one per queued message."""
        key = record.queue
        queue = self._queue(key)
        messages, names, pending = queue.messages, queue.names, self.pending
        committed = RelogState.COMMITTED
        for irba, crba, length, size, state, epoch, enqueued_at, name, ur, _last in record.entries:
            if state is committed and irba not in messages and not (pending and (key, irba) in pending):
                messages[irba] = MessageBlock(irba, crba, size, name, epoch, enqueued_at, length, rba)
                names[name] = irba
            else:
                self._forward_relog(rba, key, irba, state, ur, name, epoch, enqueued_at, size, crba, length)

    def _forward_relog(self, rba: int, key: QueueId, irba: int, relog_state: RelogState, relog_ur: int, name: str,
                       epoch: int | None, enqueued_at: float, size: int, crba: int, length: int) -> None:
        """A RELOG record at ``rba``, or a REFS entry there whose content is at ``crba``."""
        queue = self._queue(key)
        pending_ur = self.pending.pop((key, irba), None) if self.pending else None
        if pending_ur is not None:
            self.pending_matched += 1
            outcome = self.units[pending_ur].outcome
            if outcome is Outcome.COMMITTED:
                return  # the delete read earlier removes this copy
            state = MbState.IN_DOUBT_DELETE if outcome is Outcome.IN_DOUBT else MbState.COMMITTED
            ur = pending_ur if state is MbState.IN_DOUBT_DELETE else 0
        elif irba in queue.messages:
            block = queue.messages[irba]
            block.crba, block.lrba, block.size, block.length = crba, rba, size, length
            return
        elif relog_state is RelogState.IN_DOUBT_DELETE:
            outcome = self.units[relog_ur].outcome
            if outcome is Outcome.COMMITTED:
                return
            state = MbState.IN_DOUBT_DELETE if outcome is Outcome.IN_DOUBT else MbState.COMMITTED
            ur = relog_ur if state is MbState.IN_DOUBT_DELETE else 0
        else:
            queue.add(MessageBlock(irba, crba, size, name, epoch, enqueued_at, length, rba))
            return
        block = MessageBlock(irba, crba, size, name, epoch, enqueued_at, length, rba)
        block.state, block.ur = state, ur
        queue.add(block)

    # -- phase 3: backward recovery ------------------------------------------------------------

    def backward(self, emit: Callable[[str, dict], int], read: Callable[[MessageBlock], bytes]) -> None:
        """Back out every unit that never finished, newest record first,
        logging a compensation record for each action and then ABORT.
        ``emit(kind, fields)`` appends a record and returns its RBA."""
        inflight = [unit for unit in self.units.values() if unit.outcome is Outcome.INFLIGHT and unit.ended is None]
        undo: list[tuple[int, _Unit, Add | Delete]] = []
        for unit in inflight:
            undo.extend((rba, unit, record) for rba, record in unit.originals
                        if (rba if isinstance(record, Add) else record.irba) not in unit.compensated)
        undo.sort(key=lambda item: item[0], reverse=True)
        for rba, unit, record in undo:
            queue = self._queue(record.queue)
            if isinstance(record, Add):
                emit("undo_add", {"ur": unit.ur, "irba": rba, "undone": rba, "queue": record.queue})
                queue.remove(rba)
            else:
                block = queue.messages.get(record.irba)
                if block is None:
                    self.problems.append(f"RBA {rba}: an unfinished delete of a message the log no longer holds "
                                         f"(queue {record.queue}, IRBA {record.irba})")
                    continue
                new = emit("undo_delete", {"ur": unit.ur, "irba": block.irba, "undone": rba, "queue": record.queue,
                                           "name": block.name, "epoch": block.epoch,
                                           "enqueued_at": block.enqueued_at, "data": read(block)})
                block.crba, block.lrba, block.length, block.state, block.ur = new, new, 0, MbState.COMMITTED, 0
            self.compensations += 1
        for unit in sorted(inflight, key=lambda unit: unit.ur):
            emit("abort", {"ur": unit.ur})
            unit.ended = Outcome.ABORTED
            self.backed_out += 1

    # -- phase 4: cleanup ----------------------------------------------------------------------

    def cleanup(self, cpl: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Drop unmatched pending deletes, settle message states, gather the
        in-doubt units, and fit the CPL to the configured number of pairs
        (Table 5).  Returns the fitted CPL."""
        self.pending.clear()
        for queue in self.queues.values():
            for block in list(queue.messages.values()):
                if block.state is not MbState.IN_DOUBT_DELETE:
                    continue
                unit = self.units.get(block.ur)
                outcome = unit.outcome if unit is not None else Outcome.ABORTED
                if outcome is Outcome.IN_DOUBT:
                    assert unit is not None
                    entry = self.in_doubt.get(unit.ur)
                    if entry is None:
                        entry = self.in_doubt[unit.ur] = InDoubt(unit.ur, unit.queue or queue.queue, unit.last)
                    entry.irbas.add(block.irba)
                elif outcome is Outcome.COMMITTED:
                    queue.remove(block.irba)
                else:
                    block.state, block.ur = MbState.COMMITTED, 0
        fitted = list(cpl)
        if len(fitted) < self.pairs:
            fitted += [fitted[-1]] * (self.pairs - len(fitted))
        elif len(fitted) > self.pairs:
            fitted = fitted[len(fitted) - self.pairs:]
        return fitted

    def finished_in_doubt_units(self) -> list[int]:
        """In-doubt units none of whose messages is still queued: nothing is
        left to decide, so the spool closes them with COMMIT."""
        holding = {block.ur for queue in self.queues.values() for block in queue.messages.values()
                   if block.state is MbState.IN_DOUBT_DELETE}
        return sorted(unit.ur for unit in self.units.values()
                      if unit.outcome is Outcome.IN_DOUBT and unit.ur not in holding)

    def in_doubt_entries(self) -> tuple[InDoubtEntry, ...]:
        return tuple(InDoubtEntry(entry.ur, entry.last, entry.queue) for entry in self.in_doubt.values())
