"""The selective-relogging checkpoint's decisions (EP 0 280 773, Table 1):
which queued messages a checkpoint relogs, which old segments it empties,
and where restart starts afterwards.  ``SpoolQueues.checkpoint`` calls
them in that order and writes the CPL record and the anchor.

Rules of this file:
* A message's newest copy may age ``cpl_pairs`` checkpoints; an older one
  is relogged (``relog="all"``: every one; ``"off"``: none).
* Relogged by reference (a REFS entry) where its content stays on disk;
  with its content where the segment holding it is to be reclaimed: one
  that restart no longer reads and queued content fills at most
  RECLAIM_FILL of.
* Restart starts at the newest checkpoint start at or before every copy not
  relogged now (or at the oldest such copy); the CPL's entries are raised
  to it.
* Every relogged message is recorded in ``moved`` with its old copy, so
  that a checkpoint that fails before its CPL record can put them back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ._format import (FRAME_SIZE, REFS_PER_RECORD, QueueId, RecordType, Ref, RelogMode, RelogState,
                      encode_queue_checkpoint, encode_refs, encode_relog)
from ._log import LogWriter
from ._recovery import InDoubt, MbState, MessageBlock, QueueBlock
from ._span import segment_holding

# A segment kept only for queued messages' content is copied forward once they fill at most this share of it.
RECLAIM_FILL = 0.5

#: (block, its content RBA, length and last-logged RBA before the checkpoint)
Moved = tuple[MessageBlock, int, int, int]


@dataclass(frozen=True, slots=True)
class Relogged:
    """What :func:`relog_queues` wrote."""

    oldest_not_logged: int  # the oldest copy left where it was (the checkpoint's start if none)
    relogged: int  # messages relogged, with their content or by reference
    relogged_bytes: int  # content copied
    referenced: int  # of the relogged, those relogged by reference


def relog_threshold(mode: RelogMode, cpl: list[tuple[int, int]], begin: int,
                    cpl_pairs: int) -> tuple[list[tuple[int, int]], int]:
    """The CPL pairs kept with this checkpoint's (begun at ``begin``) and
    the RBA at or before which a message's newest copy is relogged."""
    aged = (cpl + [(begin, 0)])[-cpl_pairs:]
    if mode is RelogMode.OFF:
        threshold = -1
    elif mode is RelogMode.ALL or len(aged) == 1:
        threshold = begin  # every copy older than this checkpoint
    else:
        threshold = aged[0][1]  # copies at or before the end of the oldest checkpoint kept
    return aged, threshold


def segments_to_reclaim(log: LogWriter, queues: dict[QueueId, QueueBlock], restart_rba: int) -> dict[int, int]:
    """Base and end of the segments restart no longer reads that queued
    messages' content fills at most RECLAIM_FILL of: their messages
    are relogged with content, so that the segments can go."""
    old = {base: end for base, end in log.segment_extents() if end <= restart_rba}
    if not old:
        return {}
    bases = log.segment_bases()
    filled = dict.fromkeys(old, 0)
    limit = max(old.values())
    for queue in queues.values():
        for block in queue.messages.values():
            if block.crba < limit:
                base = segment_holding(bases, block.crba)
                if base in filled:
                    filled[base] += block.length or block.size
    return {base: old[base] for base, used in filled.items() if used <= RECLAIM_FILL * (old[base] - base)}


def content_segments(log: LogWriter, queues: dict[QueueId, QueueBlock], before: int) -> set[int]:
    """Bases of the segments ending at or before ``before`` that hold a queued message's content."""
    bases = log.segment_bases()
    keep = set()
    for queue in queues.values():
        for block in queue.messages.values():
            if block.crba < before:
                keep.add(segment_holding(bases, block.crba))
    return keep


def relog_queues(log: LogWriter, queues: dict[QueueId, QueueBlock], in_doubt: dict[int, InDoubt], *, begin: int,
                 threshold: int, by_reference: bool, reclaim: dict[int, int],
                 read_content: Callable[[MessageBlock], bytes], moved: list[Moved]) -> Relogged:
    """Relog every queue's messages whose newest copy is at or before
    ``threshold`` (and, by reference, those in a segment to ``reclaim``),
    then a QUEUE_CHECKPOINT record per queue that holds messages (one left
    empty is forgotten at the checkpoint: SpoolQueues._forget_empty)."""
    bases = log.segment_bases()
    reclaim_end = max(reclaim.values(), default=0)

    def reclaimed(rba: int) -> bool:
        return rba < reclaim_end and segment_holding(bases, rba) in reclaim

    oldest_not_logged = begin
    relogged = relogged_bytes = referenced = 0
    for key in sorted(queues, key=lambda key: (key.direction, key.peer)):
        queue = queues[key]
        blocks = queue.in_order()
        content = 0
        refs: list[tuple[MessageBlock, Ref]] = []
        for block in blocks:
            content += block.size
            copy = not by_reference or reclaimed(block.crba)
            if block.lrba > threshold and not (by_reference and copy):
                oldest_not_logged = min(oldest_not_logged, block.lrba)
                continue
            unit = in_doubt.get(block.ur) if block.state is MbState.IN_DOUBT_DELETE else None
            state = RelogState.IN_DOUBT_DELETE if unit is not None else RelogState.COMMITTED
            ur, last = (unit.ur, unit.last) if unit is not None else (0, 0)
            moved.append((block, block.crba, block.length, block.lrba))
            relogged += 1
            if not copy:
                if not block.length:
                    block.length = FRAME_SIZE + len(log.read(block.crba)[1])
                refs.append((block, (block.irba, block.crba, block.length, block.size, state, block.epoch,
                                     block.enqueued_at, block.name, ur, last)))
                continue
            data = read_content(block)
            record = encode_relog(block.irba, state, ur, last, key, block.name, block.epoch, block.enqueued_at, data)
            block.crba = block.lrba = log.append(RecordType.RELOG, record)
            block.length = FRAME_SIZE + len(record)
            relogged_bytes += len(data)
        for first in range(0, len(refs), REFS_PER_RECORD):
            chunk = refs[first:first + REFS_PER_RECORD]
            rba = log.append(RecordType.REFS, encode_refs(key, [entry for _block, entry in chunk]))
            for block, _entry in chunk:
                block.lrba = rba
        referenced += len(refs)
        if blocks:
            log.append(RecordType.QUEUE_CHECKPOINT, encode_queue_checkpoint(key, len(blocks), content,
                                                                            blocks[0].irba))
    return Relogged(oldest_not_logged, relogged, relogged_bytes, referenced)


def forget_empty(queues: dict[QueueId, QueueBlock], in_doubt: dict[int, InDoubt]) -> list[QueueId]:
    """Drop from ``queues`` those left empty (and no in-doubt dequeue's),
    as a checkpoint records none of them, so that a restart from it and
    the running spool know the same queues: a fleet's queues, each used
    once, cost nothing at each start.  Returns the queues dropped."""
    held = {unit.queue for unit in in_doubt.values()}
    empty = [key for key, queue in queues.items() if not queue.messages and key not in held]
    for key in empty:
        del queues[key]
    return empty


def restart_position(aged: list[tuple[int, int]],
                     oldest_not_logged: int) -> tuple[int, tuple[tuple[int, int], ...]]:
    """Where restart starts after this checkpoint, and the CPL pairs raised
    to it (Table 1's oldest-not-logged-rba)."""
    starts = [pair_begin for pair_begin, _ in aged if pair_begin <= oldest_not_logged]
    position = max(starts) if starts else oldest_not_logged
    pairs = tuple((max(pair_begin, position), max(pair_end, position) if pair_end else 0)
                  for pair_begin, pair_end in aged)
    return position, pairs
