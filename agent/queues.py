"""The agent's durable message queues: inbound per publisher, outbound per destination.

Rules of this file:
* :class:`MessageQueues` is the whole interface the runner uses, declared
  as a ``typing.Protocol`` (implementations subclass it, so a missing
  method is an error at construction); keep it narrow so the recovery-log
  spool can stand behind it.  The runner probes nothing with ``getattr``:
  the transactional dequeue and the group commit are part of it.
* Every method is blocking (file I/O): the runner calls them in a thread.
* ``put_*`` returns only when the message is durable; putting a name that is
  already queued keeps one copy.
* Inbound messages are keyed by file name; outbound ones by file name and
  carry their epoch (``resend_count``; control messages have none) so a
  resend can purge older epochs that were never sent.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Protocol

from codec.atomic import write_file_atomically
from codec.errors import BadFileName
from codec.names import Kind, MessageName, check_site_name

from .errors import AgentError

log = logging.getLogger("fieldsync.agent")


class QueueError(AgentError):
    """A queue cannot be read or written."""


@dataclass(frozen=True, slots=True)
class QueueDepth:
    peer: str
    inbound: int
    outbound: int


@dataclass(frozen=True, slots=True)
class Settled:
    """What settling a peer's in-doubt dequeues decided (see
    :meth:`MessageQueues.resolve_in_doubt`)."""

    dequeued: tuple[str, ...] = ()  # their database transaction committed: gone
    restored: tuple[str, ...] = ()  # it did not: queued again


class MessageQueues(Protocol):
    """Durable inbound and outbound message queues of one site.

    ``path`` is where they live; ``last_restart`` and ``restart_problems``
    say what opening them had to repair (None and () for queues that
    never need repair)."""

    path: Path
    last_restart: Any
    restart_problems: tuple[str, ...]

    @abc.abstractmethod
    def put_inbound(self, peer: str, name: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def inbound(self, peer: str) -> list[str]:
        """Names of the queued inbound messages from ``peer``, in name order."""

    @abc.abstractmethod
    def read_inbound(self, peer: str, name: str) -> bytes: ...

    @abc.abstractmethod
    def delete_inbound(self, peer: str, names: tuple[str, ...] | list[str]) -> None: ...

    @abc.abstractmethod
    def put_outbound(self, peer: str, name: str, data: bytes, resend_count: int | None) -> None: ...

    @abc.abstractmethod
    def outbound(self, peer: str) -> list[str]:
        """Names of the queued outbound messages to ``peer``, oldest first."""

    @abc.abstractmethod
    def read_outbound(self, peer: str, name: str) -> bytes: ...

    @abc.abstractmethod
    def delete_outbound(self, peer: str, name: str) -> None: ...

    @abc.abstractmethod
    def purge_outbound(self, peer: str, below_resend_count: int) -> int:
        """Drop queued data messages of epochs below ``below_resend_count``;
        return how many were dropped."""

    @abc.abstractmethod
    def depths(self) -> list[QueueDepth]: ...

    # -- the transactional dequeue (docs/spool-format.md, "In-doubt dequeues") --

    @abc.abstractmethod
    def begin_dequeue(self, peer: str, names: tuple[str, ...] | list[str], log_received: int) -> Any:
        """Start dequeuing inbound messages that the database transaction
        about to run applies (setting ``log_received``); durable on return.
        Returns a token for :meth:`commit_dequeue` or :meth:`abort_dequeue`."""

    @abc.abstractmethod
    def commit_dequeue(self, token: Any) -> None:
        """The database transaction committed: the messages are gone."""

    @abc.abstractmethod
    def abort_dequeue(self, token: Any) -> None:
        """The database transaction failed: the messages stay queued."""

    @abc.abstractmethod
    def resolve_in_doubt(self, peer: str, log_received: int) -> Settled:
        """After a restart: settle ``peer``'s dequeues whose transaction's
        fate is unknown, by the database's ``log_received``."""

    @abc.abstractmethod
    def group_commit(self) -> ContextManager[None]:
        """A block whose puts are made durable together, at its end."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources.  Idempotent."""


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
        _fsync_directory(directory)

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
        _fsync_directory(path.parent)

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
            _fsync_directory(self._dir("out", peer))
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


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_queues(database: str | os.PathLike[str]) -> MessageQueues:
    """The message queues of a site's agent: the recovery-log spool in
    ``<db>.agent/spool`` (docs/spool-format.md).  Only one process at a time
    may hold them; offline tools read them with ``agent.spool.check_spool``.
    What opening them had to repair after an unclean stop is logged."""
    from .keyfiles import agent_directory
    from .spool import SpoolQueues

    queues = SpoolQueues(agent_directory(database) / "spool")
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
