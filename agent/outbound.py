"""Packing the due sends of one send phase on this machine (the local engine).

Rules of this file:
* One pass over the log serves every send (``Site.read_logs``):
  each subscriber's transactions go to its own push packer
  (``codec.packing.MessagePacker``) as they are read, and each message goes
  to ``put`` as soon as it is made, so memory holds a few messages' worth
  per subscriber (the one being filled, and its look-ahead), whatever the
  backlog.  The loop that does it, :class:`PackingPass`, is the Spark
  job's too (contrib/spark/job.py, with payload packers and its own pass
  over an export): one loop, so both make the same files.  Sends are packed in groups whose packers fit in
  ``PACKING_MEMORY``: one pass at the default ``-l``, a pass per few
  subscribers at a very large one.
* The files are byte for byte those ``pack_messages(read_log(...))`` makes
  for each send on its own: the same selection, the same packer; a send
  whose range holds nothing for its subscriber makes no file at all
  (docs/protocol.md, rule 5: no message without news).  Each send's log
  is read from its ``read_start``: what lies before held nothing for it.
* One send failing (its range, its packer, its put) does not stop the
  others.  What it put before failing stays put: the caller does not move
  its ``log_sent``, so those files are sent again in the next send and the
  receiver drops what it already has.
* No queue, clock or asyncio here: the caller puts, waits for durability
  and records each send.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Generic, Iterable, Iterator, Protocol, Sequence, TypeVar

from codec.collector import collector_paused
from codec.errors import CodecError
from codec.keys import PublicKeys, SiteKeys
from codec.message import DATA_VERSION, EncodedMessage
from codec.ops import PartialTransaction, Transaction
from codec.packing import MessagePacker

from .errors import AgentError
from .site import Site
from .site.errors import SiteError

# What stops one send and not the others while it is packed: a message that
# cannot be made (codec), a queue that refuses a file (agent, OS).  A range
# the log cannot serve (a SiteError) is found before the pass, for its send
# alone too.
SEND_ERRORS = (CodecError, AgentError, OSError)

# Memory for the packers of one pass: at the default -l one pass serves
# about 1,300 subscribers; at -l 16 MiB, four.
PACKING_MEMORY = 256 * 2**20
# Operations of one log transaction handed to a packer at a time: a larger
# one comes in pieces (docs/message-format.md, "Large transactions").
READ_PIECE = 5_000
# What a packer holds, in multiples of -l (its message being filled, and the
# serialized look-ahead it compresses from): measured 1.7 at -l 16 MiB.
PACKER_MEMORY_FACTOR = 4


@dataclass(frozen=True, slots=True)
class BatchSend:
    """One due send: the subscriber's log in ``(start, end]`` at epoch
    ``resend_count``, sealed to ``seal_to`` when given, read from
    ``read_from`` (None: ``start``; ``(start, read_from]`` held nothing for
    the subscriber, docs/protocol.md rule 5)."""

    subscriber: str
    start: int
    end: int
    resend_count: int
    seal_to: PublicKeys | None = None
    read_from: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise AgentError(f"send to {self.subscriber}: range ({self.start}, {self.end}] is empty")
        if self.read_from is not None and not self.start <= self.read_from < self.end:
            raise AgentError(f"send to {self.subscriber}: read from {self.read_from} is outside "
                                  f"[{self.start}, {self.end})")

    @property
    def read_start(self) -> int:
        return self.start if self.read_from is None else self.read_from

    @property
    def backlog(self) -> int:
        return self.end - self.read_start

    def to_json(self) -> dict:
        return {"subscriber": self.subscriber, "start": self.start, "end": self.end, "read": self.read_start,
                "resend_count": self.resend_count,
                "seal_to": None if self.seal_to is None else self.seal_to.to_line()}



@dataclass(frozen=True, slots=True)
class Packed:
    """What became of one send: how many messages were put, and the error
    that stopped it (None: every message of ``(start, end]`` was put)."""

    messages: int
    error: Exception | None = None


_Made = TypeVar("_Made", covariant=True)
_Output = TypeVar("_Output")


class StreamPacker(Protocol[_Made]):
    """A push packer: ``codec.packing.MessagePacker`` (files) or ``PayloadPacker`` (payloads)."""

    def add(self, transaction: Transaction) -> list[_Made]: ...

    def close(self) -> list[_Made]: ...


class PackingPass(Generic[_Output]):
    """The packing loop of one pass over the log that feeds many streams
    (a subscriber's send each), for the agent and the Spark job alike:
    :meth:`run` takes ``(position, transaction)`` pairs, each stream's in
    commit order, hands each to its stream's packer and yields ``(position,
    output)`` for every message or payload made, as soon as it is made;
    then it closes the packers, in position order.  A stream's packer is
    made by ``packer_for(position)`` at its first transaction, so a stream
    that nothing was read for makes no packer and no file (docs/protocol.md,
    rule 5: no message without news).

    An error of a type in ``isolate``, from making, feeding or closing a
    stream's packer, stops that stream alone: it is kept in :attr:`failed`
    and the stream's later transactions are passed over.  The caller does
    the same for an output it could not take (:meth:`fail`): the stream
    yields nothing more.  Any other error, and any error of the pairs
    themselves (reading the log), is raised.  :attr:`transactions` counts
    the whole transactions each stream's packer took (not the pieces of a
    large one).
    """

    __slots__ = ("failed", "transactions", "_packer_for", "_isolate", "_packers")

    def __init__(self, streams: int, packer_for: Callable[[int], StreamPacker[_Output]], *,
                 isolate: tuple[type[Exception], ...] = ()) -> None:
        self.failed: dict[int, Exception] = {}
        self.transactions = [0] * streams
        self._packer_for = packer_for
        self._isolate = isolate
        self._packers: dict[int, StreamPacker[_Output]] = {}

    def fail(self, position: int, error: Exception) -> None:
        """Stop stream ``position``: its caller could not take an output."""
        self.failed[position] = error
        self._packers.pop(position, None)

    def run(self, pairs: Iterable[tuple[int, Transaction]]) -> Iterator[tuple[int, _Output]]:
        for position, transaction in pairs:
            made = self._add(position, transaction)
            # A huge transaction is not held while the next one is read.
            del transaction
            yield from self._hand_over(position, made)
        for position in sorted(self._packers):
            packer = self._packers.pop(position, None)
            if packer is None:
                continue  # its caller failed it meanwhile
            try:
                made = packer.close()
            except self._isolate as error:
                self.failed[position] = error
                continue
            yield from self._hand_over(position, made)

    def _add(self, position: int, transaction: Transaction) -> list[_Output]:
        if position in self.failed:
            return []
        try:
            packer = self._packers.get(position)
            if packer is None:
                packer = self._packers[position] = self._packer_for(position)
            made = packer.add(transaction)
        except self._isolate as error:
            self.fail(position, error)
            return []
        if type(transaction) is not PartialTransaction:
            self.transactions[position] += 1
        return made

    def _hand_over(self, position: int, made: list[_Output]) -> Iterator[tuple[int, _Output]]:
        for output in made:
            if position in self.failed:
                return  # its caller could not take an earlier one
            yield position, output


def pack_sends(db: Site, keys: SiteKeys, sends: Sequence[BatchSend],
               put: Callable[[int, EncodedMessage], None], *, max_size: int,
               version: int = DATA_VERSION, packing_memory: int | None = None) -> list[Packed]:
    """Make the messages of ``sends`` (at most one per subscriber; the due
    sends, as a Spark batch takes them too) and hand each to ``put(index
    into sends, message)``, each send's in order, in message format
    ``version``; return what became of each send.  An error reading the log itself (not one send's range) is
    raised.  ``packing_memory``: what the packers of one pass may hold
    (default ``PACKING_MEMORY``; a packing worker gets its share of it)."""
    incarnation = db.identity.incarnation
    errors: dict[int, Exception] = {}
    counts = [0] * len(sends)
    # Most due sends share their range (every idle peer was read to the
    # same log end): each distinct range is checked once.
    checked: dict[tuple[int, int], Exception | None] = {}
    chosen = []
    for index, send in enumerate(sends):
        key = (send.read_start, send.end)
        if key not in checked:
            try:
                db.check_log_range(*key)
                checked[key] = None
            except (SiteError, *SEND_ERRORS) as error:
                checked[key] = error
        if checked[key] is not None:
            errors[index] = checked[key]  # type: ignore[assignment]
        else:
            chosen.append(index)

    def packer_for(group: list[int], position: int) -> MessagePacker:
        send = sends[group[position]]
        return MessagePacker(keys=keys, recipient=send.subscriber, incarnation=incarnation,
                             resend_count=send.resend_count, start=send.start, max_size=max_size, end=send.end,
                             seal_to=send.seal_to, version=version)

    for group in _groups(chosen, max_size, PACKING_MEMORY if packing_memory is None else packing_memory):
        reads = [(sends[index].subscriber, sends[index].read_start, sends[index].end) for index in group]
        packing: PackingPass[EncodedMessage] = PackingPass(len(group), partial(packer_for, group),
                                                           isolate=SEND_ERRORS)
        with collector_paused():  # codec.collector
            for position, message in packing.run(db.read_logs(reads, piece=READ_PIECE, runs=True)):
                index = group[position]
                try:
                    put(index, message)
                except SEND_ERRORS as error:
                    packing.fail(position, error)
                else:
                    counts[index] += 1
        errors.update((group[position], error) for position, error in packing.failed.items())
    return [Packed(counts[index], errors.get(index)) for index in range(len(sends))]


def _groups(indexes: list[int], max_size: int, memory: int) -> list[list[int]]:
    """The sends packed together in one pass: as many as keep the packers'
    memory (a message being filled and its look-ahead, a few times
    ``max_size`` each) within ``memory``; one pass for all of them at the
    default ``-l`` and ``PACKING_MEMORY``."""
    size = max(1, memory // (PACKER_MEMORY_FACTOR * max_size))
    return [indexes[start:start + size] for start in range(0, len(indexes), size)]
