"""Packing the due sends of one send phase on this machine (the local engine).

Rules of this file:
* One pass over the log serves every send (``SiteDatabase.read_logs``):
  each subscriber's transactions go to its own push packer
  (``codec.packing.MessagePacker``) as they are read, and each message goes
  to ``put`` as soon as it is made, so memory holds a few messages' worth
  per subscriber (the one being filled, and its look-ahead), whatever the
  backlog.  Sends are packed in groups whose packers fit in
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
from typing import Callable, Sequence

from codec.errors import CodecError
from codec.keys import PublicKeys, SiteKeys
from codec.message import DATA_VERSION, EncodedMessage
from codec.packing import MessagePacker

from .errors import AgentError
from .site import SiteDatabase
from .site.errors import SiteError

# What stops one send and not the others while it is packed: a message that
# cannot be made (codec), a queue that refuses a file (agent, OS).  A range
# the log cannot serve (a SiteError) is found before the pass, for its send
# alone too.
SEND_ERRORS = (CodecError, AgentError, OSError)

# Memory for the packers of one pass.  A packer holds about this many times
# -l (its message being filled, and the serialized look-ahead it compresses
# from): measured 1.7 at -l 16 MiB.  At the default -l one pass serves
# about 1,300 subscribers; at -l 16 MiB, four.
PACKING_MEMORY = 256 * 2**20
# Operations of one log transaction handed to a packer at a time: a larger
# one comes in pieces (docs/message-format.md, "Large transactions").
READ_PIECE = 5_000
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


def pack_sends(db: SiteDatabase, keys: SiteKeys, sends: Sequence[BatchSend],
               put: Callable[[int, EncodedMessage], None], *, max_size: int,
               version: int = DATA_VERSION) -> list[Packed]:
    """Make the messages of ``sends`` (at most one per subscriber; the due
    sends, as a Spark batch takes them too) and hand each to ``put(index
    into sends, message)``, each send's in order, in message format
    ``version``; return what became of each send.  An error reading the log itself (not one send's range) is
    raised."""
    incarnation = db.identity.incarnation
    packers: dict[int, MessagePacker] = {}
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

    def packer_for(index: int) -> MessagePacker:
        # Made at a send's first transaction: a send whose range holds
        # nothing for its subscriber costs no packer (and makes no file).
        packer = packers.get(index)
        if packer is None:
            send = sends[index]
            packer = packers[index] = MessagePacker(
                keys=keys, recipient=send.subscriber, incarnation=incarnation, resend_count=send.resend_count,
                start=send.start, max_size=max_size, end=send.end, seal_to=send.seal_to, version=version)
        return packer

    def deliver(index: int, messages: list[EncodedMessage]) -> None:
        for message in messages:
            put(index, message)
            counts[index] += 1

    for group in _groups(chosen, max_size):
        reads = [(sends[index].subscriber, sends[index].read_start, sends[index].end) for index in group]
        for position, transaction in db.read_logs(reads, piece=READ_PIECE, runs=True):
            index = group[position]
            if index not in errors:  # else this send failed earlier
                try:
                    deliver(index, packer_for(index).add(transaction))
                except SEND_ERRORS as error:
                    errors[index] = error
                    packers.pop(index, None)
            # A huge transaction is not held while the next one is read.
            del transaction
        for index in group:
            packer = packers.pop(index, None)
            if packer is None:
                continue  # failed, or nothing for the subscriber: no message (docs/protocol.md, rule 5)
            try:
                deliver(index, packer.close())
            except SEND_ERRORS as error:
                errors[index] = error
    return [Packed(counts[index], errors.get(index)) for index in range(len(sends))]


def _groups(indexes: list[int], max_size: int) -> list[list[int]]:
    """The sends packed together in one pass: as many as keep the packers'
    memory (a message being filled and its look-ahead, a few times
    ``max_size`` each) within ``PACKING_MEMORY``; one pass for all of them
    at the default ``-l``."""
    size = max(1, PACKING_MEMORY // (PACKER_MEMORY_FACTOR * max_size))
    return [indexes[start:start + size] for start in range(0, len(indexes), size)]
