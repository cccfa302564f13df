"""Opening a site's message queues, and :class:`DirectoryQueues`, the
simplest implementation of their interface (agent/queue_interface.py).

Rules of this file:
* The interface, its values and its error are agent/queue_interface.py's;
  they are named here too because the runner, the CLI and the metrics take
  them from this module.
* Every method is blocking (file I/O): the runner calls them in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, ContextManager

from codec.atomic import write_file_atomically
from codec.errors import BadFileName
from codec.fsutil import fsync_directory
from codec.names import Kind, MessageName, check_site_name

from .keyfiles import agent_directory
from .queue_interface import MessageQueues, QueueDepth, QueueError, Settled
from .spool import SpoolQueues

__all__ = ["DirectoryQueues", "MessageQueues", "QueueDepth", "QueueError", "Settled", "log_restart", "open_queues"]

log = logging.getLogger("fieldsync.agent")


_SEQUENCE = re.compile(r"(\d{12})-(.+)\Z")


class DirectoryQueues(MessageQueues):
    """One directory per queue, one file per message, each written whole
    (temp file, fsync, rename, fsync directory).

    Outbound files are prefixed with a 12-digit sequence number so they leave
    in the order they were queued; the epoch comes from the file name.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = self.path = Path(root)
        self.last_restart = None
        self.restart_problems = ()
        self._sequence: dict[str, int] = {}

    def _dir(self, direction: str, peer: str) -> Path:
        check_site_name(peer)
        path = self.root / direction / peer
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def _check(name: str) -> str:
        if "/" in name or "\\" in name or name.startswith(".") or not name or "\x00" in name:
            raise QueueError(f"refusing unsafe queue entry name {name!r}")
        return name

    # -- inbound ------------------------------------------------------------------------

    def put_inbound(self, peer: str, name: str, data: bytes) -> None:
        path = self._dir("in", peer) / self._check(name)
        if path.exists():
            return
        write_file_atomically(path, data)

    def inbound(self, peer: str) -> list[str]:
        return sorted(p.name for p in self._dir("in", peer).iterdir()
                      if p.is_file() and not p.name.startswith("."))

    def read_inbound(self, peer: str, name: str) -> bytes:
        try:
            return (self._dir("in", peer) / self._check(name)).read_bytes()
        except OSError as error:
            raise QueueError(f"inbound message {name} from {peer} cannot be read: {error.strerror}") from None

    def delete_inbound(self, peer: str, names: tuple[str, ...] | list[str]) -> None:
        directory = self._dir("in", peer)
        for name in names:
            try:
                (directory / self._check(name)).unlink()
            except FileNotFoundError:
                pass
        fsync_directory(directory)

    # -- outbound -----------------------------------------------------------------------

    def _next_sequence(self, peer: str, directory: Path) -> int:
        if peer not in self._sequence:
            numbers = [int(m.group(1)) for p in directory.iterdir() if (m := _SEQUENCE.match(p.name))]
            self._sequence[peer] = max(numbers, default=0)
        self._sequence[peer] += 1
        return self._sequence[peer]

    def _outbound_files(self, peer: str) -> list[tuple[Path, str]]:
        directory = self._dir("out", peer)
        found = []
        for path in directory.iterdir():
            match = _SEQUENCE.match(path.name)
            if match and path.is_file():
                found.append((path, match.group(2)))
        found.sort()
        return found

    def put_outbound(self, peer: str, name: str, data: bytes, resend_count: int | None) -> None:
        directory = self._dir("out", peer)
        self._check(name)
        if any(queued == name for _, queued in self._outbound_files(peer)):
            return
        sequence = self._next_sequence(peer, directory)
        write_file_atomically(directory / f"{sequence:012d}-{name}", data)

    def outbound(self, peer: str) -> list[str]:
        return [name for _, name in self._outbound_files(peer)]

    def _path(self, peer: str, name: str) -> Path:
        for path, queued in self._outbound_files(peer):
            if queued == name:
                return path
        raise QueueError(f"outbound message {name} to {peer} is not queued")

    def read_outbound(self, peer: str, name: str) -> bytes:
        try:
            return self._path(peer, name).read_bytes()
        except OSError as error:
            raise QueueError(f"outbound message {name} to {peer} cannot be read: {error.strerror}") from None

    def delete_outbound(self, peer: str, name: str) -> None:
        try:
            path = self._path(peer, name)
        except QueueError:
            return
        path.unlink(missing_ok=True)
        fsync_directory(path.parent)

    def purge_outbound(self, peer: str, below_resend_count: int) -> int:
        purged = 0
        for path, name in self._outbound_files(peer):
            try:
                parsed = MessageName.parse(name)
            except BadFileName:  # a foreign file is left alone
                continue
            if parsed.kind is Kind.DATA and parsed.header.resend_count < below_resend_count:
                path.unlink(missing_ok=True)
                purged += 1
        if purged:
            fsync_directory(self._dir("out", peer))
        return purged

    def depths(self) -> list[QueueDepth]:
        peers: set[str] = set()
        for direction in ("in", "out"):
            base = self.root / direction
            if base.is_dir():
                peers.update(p.name for p in base.iterdir() if p.is_dir())
        return [QueueDepth(peer, len(self.inbound(peer)), len(self.outbound(peer))) for peer in sorted(peers)]

    # A file deleted is gone: the dequeue commits when it is deleted, after
    # the database transaction (a crash in between leaves duplicates, which
    # rule 1 deletes), and nothing is ever in doubt.

    def begin_dequeue(self, peer: str, names: tuple[str, ...] | list[str], log_received: int) -> Any:
        return peer, tuple(names)

    def commit_dequeue(self, token: Any) -> None:
        self.delete_inbound(*token)

    def abort_dequeue(self, token: Any) -> None:
        pass

    def resolve_in_doubt(self, peer: str, log_received: int) -> Settled:
        return Settled()

    def group_commit(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


def open_queues(database: str | os.PathLike[str], clock: Callable[[], float] = time.time) -> MessageQueues:
    """The message queues of a site's agent: the recovery-log spool in
    ``<db>.agent/spool`` (docs/spool-format.md).  Only one process at a time
    may hold them; offline tools read them with ``agent.spool.check_spool``.
    What opening them had to repair after an unclean stop is logged.
    ``clock`` stamps what is queued (the agent's own, during a run)."""
    queues = SpoolQueues(agent_directory(database) / "spool", clock=clock)
    log_restart(queues)
    return queues


def log_restart(queues: MessageQueues) -> None:
    """Say what opening the queues had to repair after an unclean stop
    (docs/spool-format.md, "Restart"); a clean stop repairs nothing."""
    stats = queues.last_restart
    if stats is None:
        return
    where = queues.path
    if stats.torn_bytes:
        log.warning("%s: the agent did not stop cleanly: the last %d bytes of the spool's log, an unfinished write, "
                    "were dropped (no step had yet relied on them)", where, stats.torn_bytes)
    if stats.units_backed_out:
        log.info("%s: %d unfinished queue operation(s) of the last run were backed out", where,
                 stats.units_backed_out)
    for problem in queues.restart_problems:
        log.warning("%s: %s", where, problem)
