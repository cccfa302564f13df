"""The interface of the agent's durable message queues: inbound per
publisher, outbound per destination.  agent/queues.py opens them, the
recovery-log spool (agent/spool/) implements them.

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
* Only values, the error and the interface live here, below the spool and
  everything that opens queues, so that none of them imports the other.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Protocol

from .errors import AgentError


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
    requeued: tuple[str, ...] = ()  # it did not: queued again


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

    def at_rest(self) -> None:
        """The agent is about to wait (a poll ended): bring up to date what
        readers of the queues use, such as the spool's summary for ``agent
        status``.  Nothing to do for queues that keep no such thing."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources.  Idempotent."""
