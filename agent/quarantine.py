"""The quarantine: files the agent refused, kept for the operator to look at.

Rules of this file:
* This module owns ``<db>.agent/quarantine/``: the agent writes it through a
  :class:`QuarantineStore`; ``status`` and ``inbox`` read it with
  :func:`read_quarantine` and never change it.
* Everything in it is the agent's own: the folder 0700, every file 0600.
  A refused file can be anything a sender chose to put in an inbox.
* Bounded (docs/security.md, "Limits"): a cap in files and in bytes per
  peer (senders that are no peer share one bucket) and in total.  A file
  that would pass a cap first drops the oldest files of its bucket, then
  the oldest overall; drops are counted and warned about in one line per
  run.  A file larger than the byte cap of its bucket keeps only its record.
* A file whose content is in the quarantine already (same SHA-256) is not
  stored twice: a flood of one junk file costs one copy.
* Evidence, not state: a file is written in place under a new name and
  not fsynced (a crash may lose it or cut it short).  The protocol counts
  every refused file as missing and asks for it again, so a copy lost in a
  crash loses no data; an fsync per refused file would let junk cost about
  11 ms a file.
* Names come from senders: the stored name is the arrival stamp and the
  name with every character outside ``[A-Za-z0-9._-]`` replaced, cut to 150
  characters; the name as it came is only in the record.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

log = logging.getLogger("fieldsync.agent")

REASON_SUFFIX = ".reason.json"
#: The bucket of files whose sender is not a peer of the site.
UNKNOWN_SENDER = "(not a peer)"
#: Warnings for single files per run; later ones are counted in one line.
LOGGED_PER_RUN = 20


@dataclass(frozen=True, slots=True)
class QuarantineLimits:
    """Caps of the quarantine (defaults in docs/security.md)."""

    peer_files: int = 1_000
    peer_bytes: int = 64 * 1024 * 1024
    total_files: int = 10_000
    total_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("peer_files", "peer_bytes", "total_files", "total_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"quarantine limit {name} must be a positive whole number, got {value!r}")
        if self.peer_files > self.total_files or self.peer_bytes > self.total_bytes:
            raise ValueError("a peer's quarantine limits cannot be larger than the total ones")


@dataclass(frozen=True, slots=True)
class QuarantinedFile:
    """One entry of the quarantine, as ``inbox`` and ``status`` show it."""

    file: str           # the file in the quarantine folder (its record beside it)
    name: str           # the name it arrived under
    peer: str | None    # the peer it came from, when known
    reason: str
    at: datetime | None
    size: int           # of the file as it arrived
    sha256: str | None
    kept: bool          # False: only the record was kept (the content was over the byte cap)


def _record_of(path: Path) -> dict:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def read_quarantine(folder: Path) -> list[QuarantinedFile]:
    """The quarantine's entries, oldest first (read only)."""
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        name = path.name
        if name.startswith("."):
            continue
        if name.endswith(REASON_SUFFIX):
            data = path.with_name(name[: -len(REASON_SUFFIX)])
            if data.exists():
                continue  # listed with its data file
            record = _record_of(path)
            if not record.get("content_dropped"):
                continue  # a record whose file was removed by hand
            stored, kept = name[: -len(REASON_SUFFIX)], False
        else:
            record, stored, kept = _record_of(path.with_name(name + REASON_SUFFIX)), name, True
            if not path.is_file():
                continue
        at = record.get("at")
        size = record.get("size")
        if not isinstance(size, int):
            try:
                size = path.stat().st_size if kept else 0
            except OSError:
                continue
        found.append(QuarantinedFile(
            file=stored, name=str(record.get("name") or stored),
            peer=record.get("peer") if isinstance(record.get("peer"), str) else None,
            reason=str(record.get("reason") or "no reason recorded"),
            at=datetime.fromtimestamp(at, timezone.utc) if isinstance(at, (int, float)) else None,
            size=size, sha256=record.get("sha256") if isinstance(record.get("sha256"), str) else None,
            kept=kept))
    return found


@dataclass(slots=True)
class _Entry:
    stored: str
    bucket: str
    size: int       # bytes the entry holds on disk (0 when only its record is kept)
    sha256: str | None


def _write(path: Path, data: bytes) -> None:
    """0600, not fsynced, written in place (see the rules above): names are
    new stamps, so nothing is overwritten, and a file cut short by a crash
    is evidence cut short."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class QuarantineStore:
    """The agent's quarantine folder, with its caps.  Blocking: call it in a thread."""

    def __init__(self, folder: Path, limits: QuarantineLimits | None = None, *,
                 clock: Callable[[], float]) -> None:
        self.folder = folder
        self.limits = limits or QuarantineLimits()
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] | None = None  # by stored name, oldest first
        self._buckets: dict[str, OrderedDict[str, _Entry]] = {}
        self._bucket_bytes: dict[str, int] = {}
        self._bytes = 0
        self._by_sha: dict[str, str] = {}
        self._last_stamp = 0
        self.stored = 0       # files set aside this run (a content met again counts too)
        self.dropped = 0      # older files dropped for the caps this run
        self._logged = 0

    def secure(self) -> None:
        """Make the folder the agent's own: created 0700; one from before
        the quarantine had modes (files 0644) is set right once."""
        try:
            mode = stat.S_IMODE(os.stat(self.folder, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            self.folder.mkdir(mode=0o700, parents=True)
            os.chmod(self.folder, 0o700)
            return
        if mode == 0o700:
            return
        os.chmod(self.folder, 0o700)
        with os.scandir(self.folder) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    os.chmod(entry.path, 0o600)

    # -- the index -----------------------------------------------------------------------

    def _index(self) -> OrderedDict[str, _Entry]:
        """Read the folder once, at the first file quarantined in this run."""
        if self._entries is None:
            self.secure()
            self._entries = OrderedDict()
            for item in read_quarantine(self.folder):
                bucket = item.peer if item.peer is not None else UNKNOWN_SENDER
                self._add(_Entry(item.file, bucket, item.size if item.kept else 0, item.sha256))
            self._enforce(None, 0)  # caps lowered since the last run
        return self._entries

    def contains(self, data: bytes) -> bool:
        """Whether this content is in the quarantine (``--keep`` asks)."""
        self._index()
        return hashlib.sha256(data).hexdigest() in self._by_sha

    # -- adding ------------------------------------------------------------------------

    def put(self, peer: str | None, name: str, data: bytes, reason: str) -> None:
        """Set ``data`` aside with its reason; the caps hold afterwards."""
        self._index()
        self.stored += 1
        self._note(name, reason)
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._by_sha:
            return  # this very content is kept already: its first record stays
        bucket = peer if peer is not None else UNKNOWN_SENDER
        stored = self._stored_name(name)
        keep = len(data) <= self.limits.peer_bytes
        self._enforce(bucket, len(data) if keep else 0)
        record = {"name": name, "peer": peer, "reason": reason, "at": self.clock(), "sha256": digest,
                  "size": len(data)}
        if keep:
            _write(self.folder / stored, data)
        else:
            record["content_dropped"] = f"{len(data)} bytes, over the quarantine's {self.limits.peer_bytes}-byte cap"
        _write(self.folder / (stored + REASON_SUFFIX), json.dumps(record).encode())
        self._add(_Entry(stored, bucket, len(data) if keep else 0, digest))

    def _stored_name(self, name: str) -> str:
        stamp = max(int(self.clock() * 1e9), self._last_stamp + 1)
        self._last_stamp = stamp
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)[:150]
        return f"{stamp:020d}-{safe.lstrip('.') or 'unnamed'}"

    def _enforce(self, bucket: str | None, incoming: int) -> None:
        """Drop the oldest entries until one more entry of ``incoming`` bytes
        in ``bucket`` fits every cap (``None``: no entry comes; the caps
        hold after a change of limits)."""
        limits = self.limits
        more = 1 if bucket is not None else 0
        if bucket is not None:
            mine = self._buckets.get(bucket)
            while mine and (len(mine) + more > limits.peer_files
                            or self._bucket_bytes[bucket] + incoming > limits.peer_bytes):
                self._drop(next(iter(mine.values())))
        entries = self._entries
        assert entries is not None
        while entries and (len(entries) + more > limits.total_files or self._bytes + incoming > limits.total_bytes):
            self._drop(next(iter(entries.values())))

    def _add(self, entry: _Entry) -> None:
        assert self._entries is not None
        self._entries[entry.stored] = entry
        self._buckets.setdefault(entry.bucket, OrderedDict())[entry.stored] = entry
        self._bucket_bytes[entry.bucket] = self._bucket_bytes.get(entry.bucket, 0) + entry.size
        self._bytes += entry.size
        if entry.sha256 is not None and entry.size:
            self._by_sha[entry.sha256] = entry.stored

    def _drop(self, entry: _Entry) -> None:
        assert self._entries is not None
        del self._entries[entry.stored]
        del self._buckets[entry.bucket][entry.stored]
        self._bucket_bytes[entry.bucket] -= entry.size
        self._bytes -= entry.size
        if entry.sha256 is not None and self._by_sha.get(entry.sha256) == entry.stored:
            del self._by_sha[entry.sha256]
        _remove(self.folder / entry.stored)
        _remove(self.folder / (entry.stored + REASON_SUFFIX))
        self.dropped += 1

    # -- telling -------------------------------------------------------------------------

    def _note(self, name: str, reason: str) -> None:
        self._logged += 1
        if self._logged <= LOGGED_PER_RUN:
            log.warning("quarantined %s: %s", name, reason)
        elif self._logged == LOGGED_PER_RUN + 1:
            log.warning("more files are being quarantined; the rest of this run's are counted, not listed "
                        "(see `agent inbox`)")

    def summary(self) -> str | None:
        """One line for the end of a run, or None when nothing was set aside."""
        if not self.stored:
            return None
        text = f"{self.stored} file(s) quarantined in this run"
        if self.dropped:
            text += (f"; {self.dropped} older quarantined file(s) were dropped to keep the quarantine within its "
                     f"caps ({self.limits.peer_files} files / {self.limits.peer_bytes} bytes a peer, "
                     f"{self.limits.total_files} files / {self.limits.total_bytes} bytes in all)")
        return text


class SetAside:
    """Files refused on receipt on their way into a :class:`QuarantineStore`,
    written a block at a time: one worker-thread hop per block, not per
    file, so a flood of junk is read at the speed of its listing.  A block
    holds at most ``FILES`` files or ``BYTES`` bytes.

    A file may be acknowledged to its transport before its block is
    written: the quarantine is evidence, not state (see above)."""

    FILES = 256
    BYTES = 16 * 1024 * 1024

    def __init__(self, store: QuarantineStore) -> None:
        self.store = store
        self._block: list[tuple[str | None, str, bytes, str]] = []
        self._bytes = 0

    def add(self, peer: str | None, name: str, data: bytes, reason: str) -> bool:
        """Add a file to the block; True when the block is full (write it)."""
        self._block.append((peer, name, data, reason))
        self._bytes += len(data)
        return len(self._block) >= self.FILES or self._bytes >= self.BYTES

    def take(self) -> list[tuple[str | None, str, bytes, str]]:
        """The block so far, for :meth:`write`; the next block starts empty."""
        block, self._block, self._bytes = self._block, [], 0
        return block

    def write(self, block: list[tuple[str | None, str, bytes, str]]) -> None:
        """Blocking: put a block into the store."""
        for peer, name, data, reason in block:
            self.store.put(peer, name, data, reason)
