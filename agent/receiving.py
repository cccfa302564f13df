"""The receive path: a file at this site's inbox into the inbound queue.

A file's hops (docs/protocol.md, "Receiving"): the transport lists a name
and asks :meth:`Receiver.wanted`, which parses it (once) and says whether
the file is this site's; then :meth:`Receiver.receive_file` checks the
file once (format, sender key, recipient, signature; a control message is
decoded whole), queues a data message durably, acknowledges it and tells
the pair's protocol.  A file that fails is set aside with the reason the
protocol gives.  The apply that follows is agent.applying's.

Rules of this file:
* It takes what it uses (:class:`~agent.contexts.Inbox`) and yields, file
  by file, the protocol's actions; the runner carries them out before the
  next file is taken.
* A data file is applied once the files waiting are queued (every
  RECEIVE_BLOCK files, and at the poll after the receive): consecutive
  messages go in one database transaction (docs/protocol.md, rule 2).
* A file is acknowledged to the transport only once it is durably queued
  (or set aside: the quarantine is evidence, not state).
* A file that is not this site's (not a message name, another recipient)
  is never read or removed: the transport is told not to read it.  One
  the transport refuses to read (too large, a hard link) is left the same
  way; both are warned about once (agent.left_files).
* The signature of a queued file is not checked again when it is applied:
  every pending message went through :meth:`Receiver.receive_file` or
  agent.resuming in this process, with the keys of now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from codec.errors import BadFileName, BadSignature, MessageError
from codec.message import check_message, decode_message
from codec.names import Kind, MessageName
from transports import Incoming, Refusal, Transport, TransportError

from .contexts import Inbox, Step
from .crashpoints import crash_point
from .pairs import Peer
from .protocol import Action
from .run_options import IN_SUMMARY

log = logging.getLogger("fieldsync.agent")
# Parsed names kept between a transport's question and the file's turn; a
# transport that asks and then refuses many files (too large) costs no more.
_NAMES_KEPT = 1024
RECEIVE_BLOCK = 256  # data files queued (in the spool, on disk) before what they made applicable is applied


class _Mismatch(MessageError):
    def __init__(self, name: str) -> None:
        super().__init__(name, "file name does not match the message inside it")


class Receiver:
    """The receive path of one agent."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self._names: dict[str, MessageName] = {}
        self._files = 0  # data files queued (RECEIVE_BLOCK)

    async def receive(self, transport: Transport, address: str) -> AsyncIterator[Step]:
        """Take in every file waiting at ``address``, setting aside what fails;
        yield what each led to (a control message is acknowledged only once
        that is carried out: what it says lives in the pair's state)."""
        inbox = self.inbox
        await asyncio.to_thread(inbox.left.load)
        queued: dict[str, Peer] = {}  # the pairs that queued data files since the last block
        try:
            async for incoming in transport.receive(address, wanted=self.wanted, refused=self.refused):
                taken = await self.receive_file(transport, incoming)
                if taken is not None:
                    peer, actions, control = taken
                    yield peer, actions
                    if control:
                        await self._ack(transport, incoming)
                        continue
                    queued[peer.name] = peer
                    self._files += 1
                    if self._files % RECEIVE_BLOCK == 0:  # apply what a block of files made applicable
                        for peer in queued.values():
                            yield peer, peer.protocol.take_applicable(inbox.clock())
                        queued.clear()
        except TransportError as error:
            inbox.report.transport_errors.append(f"receiving at {address}: {error}")
            log.warning("receiving at %s failed: %s", address, error, extra=IN_SUMMARY)
        else:
            inbox.report.left_in_inbox = inbox.left.met
            await asyncio.to_thread(inbox.left.end_receive)
        finally:
            self._names.clear()
        await self.flush_aside()

    def wanted(self, name_text: str) -> bool:
        """Whether a file at the inbox is this site's to read: a message name
        addressed to it.  Any other is left (and warned about once, see
        agent.left_files) without being read: the transports ask this
        before they download."""
        site, left = self.inbox.site, self.inbox.left
        try:
            name = MessageName.parse(name_text)
        except BadFileName as error:
            left.leave(name_text, f"{error} (is that this site's inbox?)")
            return False
        if name.recipient != site:
            left.leave(name_text, f"addressed to {name.recipient}, not {site} (is that this site's inbox?)")
            return False
        if len(self._names) >= _NAMES_KEPT:
            self._names.clear()
        self._names[name_text] = name
        return True

    def refused(self, refusal: Refusal) -> None:
        """A file the transport will not read: left where it is, warned about once."""
        self._names.pop(refusal.name, None)
        self.inbox.left.leave(refusal.name, refusal.reason, refusal.identity)

    async def receive_file(self, transport: Transport, incoming: Incoming
                           ) -> tuple[Peer, list[Action], bool] | None:
        """Check one file; queue a data message, decode a control message;
        return the pair, what its protocol made of it, and whether the file
        is still to be acknowledged (None: nothing to carry out)."""
        inbox = self.inbox
        name_text, data = incoming.name, incoming.data
        if inbox.keep and await asyncio.to_thread(inbox.aside.store.contains, data):
            # Left in the message system and set aside at an earlier poll.  (A
            # file put back in the inbox without --keep is read afresh.)
            log.debug("%s is in the quarantine already", name_text)
            return None
        name = self._names.pop(name_text, None)
        if name is None:
            if not self.wanted(name_text):
                return None  # a transport that reads what it was told to leave: left all the same
            name = self._names.pop(name_text)
        peer = inbox.peers.get(name.sender) or await asyncio.to_thread(inbox.load_peer, name.sender)
        if peer is None:
            await self.set_aside(transport, incoming, None, f"from {name.sender}, which is not a peer of {inbox.site}")
            return None
        now = inbox.clock()
        try:
            if name.kind is Kind.CONTROL:
                message = decode_message(data, source=name_text, keyring=inbox.keyring, recipient=inbox.site,
                                         recipient_keys=inbox.keys)
            else:
                message = check_message(data, source=name_text, keyring=inbox.keyring, recipient=inbox.site)
            if message.header != name.header or message.sender != name.sender or message.kind is not name.kind:
                raise _Mismatch(name_text)
        except MessageError as error:
            claimed = error.claimed_incarnation if isinstance(error, BadSignature) else None
            reason = peer.protocol.message_rejected(now, name_text, str(error), claimed_incarnation=claimed)
            await self.set_aside(transport, incoming, peer.name, reason)
            return None
        if (inbox.keep and message.kind is not Kind.CONTROL
                and peer.protocol.already_taken(name_text, message.header, message.incarnation)):
            return None  # kept in the message system, and taken in at an earlier poll
        inbox.report.received += 1
        if message.kind is Kind.CONTROL:
            assert message.control is not None
            return peer, peer.protocol.control_received(now, message.control, message.incarnation), True
        await asyncio.to_thread(inbox.queues.put_inbound, peer.name, name_text, data)
        crash_point("receive.after-queue")
        await self._ack(transport, incoming)
        return peer, peer.protocol.message_queued(now, name_text, message.header, message.incarnation,
                                                  size=len(data), apply=False), False

    async def _ack(self, transport: Transport, incoming: Incoming) -> None:
        """Let the transport remove a file that is durably stored or set aside,
        unless ``--keep`` leaves every file in the message system."""
        if not self.inbox.keep:
            await transport.ack(incoming)

    # -- the quarantine ------------------------------------------------------------------

    async def set_aside(self, transport: Transport, incoming: Incoming, peer: str | None, reason: str) -> None:
        """Set aside a file refused on receipt, then acknowledge it."""
        self.inbox.report.quarantined += 1
        if self.inbox.aside.add(peer, incoming.name, incoming.data, reason):
            await self.flush_aside()
        await self._ack(transport, incoming)

    async def flush_aside(self) -> None:
        aside = self.inbox.aside
        block = aside.take()
        if block:
            await asyncio.to_thread(aside.write, block)
            self.inbox.report.quarantine_dropped = aside.store.dropped
