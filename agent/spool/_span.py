"""Reading a spool's span from disk: the anchor, the restart position it
names, and phase 1 of restart (every record from there fed to
:class:`Restart`); shared by the spool's restart and ``check_spool``.

Rules of this file:
* Read only, but for the anchor, which a checkpoint writes here whole (a
  temporary file renamed over it): nothing else is written, truncated or
  deleted.
* The anchor is a hint: a restart position is used only when the CPL
  record it names verifies; else the whole retained log is read, unless
  segment files are missing, which is corruption (never a silent loss).
* Every queued message's content must be in a segment file that exists.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from pathlib import Path

from codec.atomic import write_file_atomically

from ._errors import SpoolCorrupt, SpoolError
from ._format import FRAME_SIZE, SEGMENT_HEADER_SIZE, BadPayload, CplRecord, decode_anchor, decode_payload
from ._log import ScanResult, SegmentFile, contiguous_start, list_segments, read_record_at, scan, segment_name
from ._recovery import Restart

ANCHOR_FILE = "anchor"


def segment_holding(bases: list[int], rba: int) -> int:
    """The base of the segment holding ``rba`` (bases sorted)."""
    return bases[bisect.bisect_right(bases, rba) - 1]


def check_content_segments(restart: Restart, segments: list[SegmentFile], start: int) -> None:
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



@dataclass(slots=True)
class Span:
    restart: Restart
    result: ScanResult
    segments: list[SegmentFile]
    start: int
    from_anchor: bool
    anchor: tuple[int, int, int] | None


def write_anchor(directory: Path, anchor: bytes, *, fsync: bool) -> None:
    """Replace the anchor whole; ``fsync=False`` (benchmarks) skips the syncs."""
    if fsync:
        write_file_atomically(directory / ANCHOR_FILE, anchor)
    else:
        temporary = directory / (ANCHOR_FILE + ".tmp")
        temporary.write_bytes(anchor)
        os.replace(temporary, directory / ANCHOR_FILE)


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
