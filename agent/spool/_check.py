"""``check_spool``: verify a spool offline and say what it holds.

Rules of this file:
* Read only: no lock is taken, nothing is written, truncated or deleted,
  so it may run beside a live agent (whose unfinished tail then shows as a
  torn tail).
* It reads the whole log (every segment, every record) for the counts and
  the corruption list, then runs restart phases 1-4 as a dry run from the
  position a real restart would use, for the queue contents.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from dataclasses import replace as _replace
from pathlib import Path

from ._errors import SpoolCorrupt
from ._format import SEGMENT_HEADER_SIZE, Direction, RecordType
from ._log import ScanResult, TornTail, list_segments, read_record_at, scan
from ._recovery import MessageBlock, Outcome
from ._spool import read_anchor, read_span


@dataclass(frozen=True, slots=True)
class SegmentReport:
    name: str
    base_rba: int
    size: int


@dataclass(frozen=True, slots=True)
class CorruptionReport:
    rba: int
    segment: str
    reason: str
    needed: bool  # inside the span a restart reads: the spool cannot open


@dataclass(frozen=True, slots=True)
class QueueReport:
    queue: str  # "in/PEER" (messages from PEER) or "out/PEER" (messages to PEER)
    peer: str
    direction: str  # "in" or "out"
    names: tuple[str, ...]  # inbound in name order, outbound oldest first
    content_bytes: int
    oldest_enqueued_at: float | None


@dataclass(frozen=True, slots=True)
class InDoubtReport:
    ur: int
    peer: str
    last: int
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SpoolCheck:
    """The report of :func:`check_spool`; ``lines()`` words it for people."""

    path: str
    ok: bool
    segments: tuple[SegmentReport, ...]
    log_start_rba: int
    end_rba: int
    records: int
    records_by_type: tuple[tuple[str, int], ...]
    anchor: tuple[int, int, int] | None  # (CPL record RBA, restart RBA, checkpoint number)
    last_checkpoint: int | None
    restart_rba: int
    restart_span_bytes: int
    torn_tail: TornTail | None
    corruption: tuple[CorruptionReport, ...]
    queues: tuple[QueueReport, ...]
    in_doubt: tuple[InDoubtReport, ...]
    units_to_back_out: int
    relogs_ignored: int
    problems: tuple[str, ...]

    @property
    def messages(self) -> int:
        return sum(len(queue.names) for queue in self.queues)

    def lines(self) -> list[str]:
        out = [f"spool {self.path}: {'OK' if self.ok else 'NOT OK'}"]
        out.append(f"  log: RBA {self.log_start_rba} .. {self.end_rba} in {len(self.segments)} segment(s), "
                   f"{self.records} records ({', '.join(f'{name} {count}' for name, count in self.records_by_type)})")
        if self.anchor is not None:
            out.append(f"  last checkpoint: #{self.anchor[2]} (CPL record at RBA {self.anchor[0]})")
        out.append(f"  restart reads from RBA {self.restart_rba}: {self.restart_span_bytes} bytes")
        if self.torn_tail is not None:
            out.append(f"  torn tail at RBA {self.torn_tail.rba} ({self.torn_tail.segment}): "
                       f"{self.torn_tail.discarded} bytes of an unfinished write, dropped at the next open "
                       f"({self.torn_tail.reason})")
        for bad in self.corruption:
            where = "NEEDED by restart" if bad.needed else "before the restart position (will be reclaimed)"
            out.append(f"  CORRUPT at RBA {bad.rba} ({bad.segment}), {where}: {bad.reason}")
        out.append(f"  {self.messages} queued message(s):")
        for queue in self.queues:
            out.append(f"    {queue.queue}: {len(queue.names)} message(s), {queue.content_bytes} bytes")
            for name in queue.names:
                out.append(f"      {name}")
        for unit in self.in_doubt:
            out.append(f"  in-doubt dequeue #{unit.ur} from {unit.peer} (applied iff log_received >= {unit.last}): "
                       + ", ".join(unit.names))
        if self.units_to_back_out:
            out.append(f"  {self.units_to_back_out} unfinished unit(s) of recovery will be backed out at the next open")
        if self.relogs_ignored:
            out.append(f"  {self.relogs_ignored} relog record(s) of an unfinished checkpoint will be ignored")
        for problem in self.problems:
            out.append(f"  problem: {problem}")
        return out


def check_spool(path: str | Path) -> SpoolCheck:
    """Verify the spool at ``path`` without changing it."""
    directory = Path(path)
    problems: list[str] = []
    if not directory.is_dir():
        return _empty(directory, f"{directory} is not a directory")
    segments = list_segments(directory)
    if not segments:
        if read_anchor(directory) is not None:
            return _empty(directory, "no segment files, but an anchor names a checkpoint: the spool's log is "
                                     "missing and what it held is lost; restore it from a backup, or move the "
                                     "spool aside and let the peers resend")
        return _empty(directory, "no segment files: the spool was never opened")
    counts: Counter[str] = Counter()
    full = ScanResult(segments[0].base + SEGMENT_HEADER_SIZE)
    # Gaps between segments are reclaimed segments (only before the restart
    # position, which read_span below checks).
    for _rba, type_byte, _payload in scan(segments, full.start, full, salvage=True, gaps=True):
        try:
            counts[RecordType(type_byte & 0x7F).name] += 1
        except ValueError:
            counts["unknown"] += 1

    failed = None
    pairs = 3
    try:
        span = read_span(directory, pairs)
    except SpoolCorrupt as error:
        failed = error
        problems.append(f"the spool cannot be opened: {error.reason} at RBA {error.rba}")
        try:
            span = read_span(directory, pairs, salvage=True)
        except SpoolCorrupt as again:  # not even a salvaging read gets through
            problems.append(f"nothing can be read from RBA {again.rba}: {again.reason}")
            report = _empty(directory, problems[0])
            return _replace(report, problems=tuple(problems), records=full.records,
                            records_by_type=tuple(sorted(counts.items())),
                            corruption=tuple(CorruptionReport(bad.rba, bad.segment, bad.reason, True)
                                             for bad in full.corruption))
    restart = span.restart
    if restart.last_cpl is not None:
        restart.pairs = len(restart.last_cpl[1].pairs)
    restart.forward()
    unreadable = []
    for queue in restart.queues.values():
        for block in queue.messages.values():
            problem = _verify_copy(segments, block)
            if problem is not None:
                unreadable.append(f"{queue.queue} {block.name}: {problem}")
    backing_out = sum(1 for unit in restart.units.values()
                      if unit.outcome is Outcome.INFLIGHT and unit.ended is None)
    fake = [span.result.end]

    def emit(kind: str, fields: dict) -> int:
        fake[0] += 1
        return fake[0]

    restart.backward(emit, lambda block: b"")
    restart.cleanup(restart.cpl(span.start))
    problems.extend(restart.problems)
    problems.extend(f"unreadable message {entry}" for entry in unreadable)

    queues = []
    for key in sorted(restart.queues, key=lambda key: (key.direction, key.peer)):
        blocks = restart.queues[key].in_order()
        if not blocks:
            continue  # an empty queue is not listed (a checkpoint forgets it)
        names = [block.name for block in blocks]
        if key.direction is Direction.INBOUND:
            names.sort()
        queues.append(QueueReport(str(key), key.peer, key.direction.label, tuple(names),
                                  sum(block.size for block in blocks),
                                  min((block.enqueued_at for block in blocks), default=None)))
    in_doubt = []
    for unit in sorted(restart.in_doubt.values(), key=lambda unit: unit.ur):
        queue = restart.queues[unit.queue]
        in_doubt.append(InDoubtReport(unit.ur, unit.queue.peer, unit.last,
                                      tuple(sorted(queue.messages[irba].name for irba in unit.irbas
                                                   if irba in queue.messages))))
    corruption = tuple(CorruptionReport(bad.rba, bad.segment, bad.reason, bad.rba >= span.start)
                       for bad in full.corruption)
    if failed is not None and not any(bad.rba == failed.rba for bad in corruption):
        corruption += (CorruptionReport(failed.rba, failed.segment, failed.reason, True),)
    end = full.end
    ok = failed is None and not unreadable and not any(bad.needed for bad in corruption) and not restart.problems
    return SpoolCheck(
        path=str(directory), ok=ok,
        segments=tuple(SegmentReport(segment.path.name, segment.base, segment.size) for segment in segments),
        log_start_rba=segments[0].base, end_rba=end, records=full.records,
        records_by_type=tuple(sorted(counts.items())), anchor=span.anchor,
        last_checkpoint=restart.last_cpl[1].number if restart.last_cpl else None,
        restart_rba=span.start, restart_span_bytes=max(0, end - span.start), torn_tail=full.torn,
        corruption=corruption, queues=tuple(queues), in_doubt=tuple(in_doubt), units_to_back_out=backing_out,
        relogs_ignored=restart.relogs_ignored, problems=tuple(problems))


def _verify_copy(segments, block: MessageBlock) -> str | None:
    holder = None
    for segment in segments:
        if segment.base <= block.crba:
            holder = segment
    if holder is None or block.crba >= holder.base + holder.size:
        return f"its copy at RBA {block.crba} was reclaimed"
    try:
        record_type, payload = read_record_at(holder.path, holder.base, block.crba)
    except SpoolCorrupt as error:
        return f"its copy at RBA {block.crba} does not verify ({error.reason})"
    except OSError as error:
        return f"its copy at RBA {block.crba} cannot be read ({error.strerror})"
    if record_type not in (RecordType.ADD, RecordType.RELOG, RecordType.UNDO_DELETE) or len(payload) < block.size:
        return f"the record at RBA {block.crba} is not a copy of it"
    return None


def _empty(directory: Path, problem: str) -> SpoolCheck:
    return SpoolCheck(path=str(directory), ok=False, segments=(), log_start_rba=0, end_rba=0, records=0,
                      records_by_type=(), anchor=None, last_checkpoint=None, restart_rba=0, restart_span_bytes=0,
                      torn_tail=None, corruption=(), queues=(), in_doubt=(), units_to_back_out=0, relogs_ignored=0,
                      problems=(problem,))

