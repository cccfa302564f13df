"""Queued inbound messages read for an apply (agent.applying): one message,
a group of parts read part by part (codec.payloads.read_group), or
consecutive messages (docs/protocol.md, rule 2), each read and decoded as
the apply reaches it.

Rules of this file:
* Blocking: called in a worker thread.  Memory holds one message (one part
  of a group) being decoded, whatever the apply holds.
* A message's signature is not checked again: it was when the message was
  received (agent.receiving) or at the start (agent.resuming).
"""

from __future__ import annotations

from itertools import chain
from typing import Iterable, Iterator

from codec.message import Message, decode_message
from codec.ops import Transaction
from codec.payloads import read_group

from .contexts import Applier
from .site import MessageChain


def load_transactions(applier: Applier, peer: str, message_ids: tuple[str, ...],
                      following: tuple[tuple[str, int], ...] = ()) -> Iterable[Transaction] | MessageChain:
    """Blocking: the transactions of the messages, decoded (their signatures
    were checked on receipt: agent.receiving), a version-2 message's with
    its runs as they are (the apply path binds their rows).  A group's one
    transaction reads its parts as its operations are taken
    (codec.payloads.read_group).  Consecutive messages (docs/protocol.md,
    rule 2; ``following``: those after the first, with their ``last``) are
    a MessageChain, each after the first read and decoded as the apply
    reaches it, so memory holds one message."""
    def decoded(message_id: str) -> Message:
        return decode_message(applier.queues.read_inbound(peer, message_id), source=message_id,
                              keyring=applier.keyring, recipient=applier.site, recipient_keys=applier.keys,
                              verified=True, runs=True)

    first = decoded(message_ids[0])
    if first.is_part:
        parts = chain((first,), map(decoded, message_ids[1:]))
        return [read_group(parts, source=message_ids[0], runs=True)]
    if len(message_ids) == 1:
        return list(first.transactions or ())

    def transactions(message_id: str) -> Iterator[Transaction]:
        yield from decoded(message_id).transactions or ()

    return MessageChain(((first.transactions or (), first.header.last),
                         *((transactions(message_id), last) for message_id, last in following)))
