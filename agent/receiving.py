"""The receive path: a file at this site's inbox into the inbound queue,
and the queued files back into the protocol after a restart.

A file's hops (docs/protocol.md, "Receiving"): the transport lists a name
and asks :meth:`Receiver.wanted`, which parses it (once: the parsed name is
kept for the file's turn) and says whether the file is this site's; then
:meth:`Receiver.receive_file` checks the file once (format, sender key,
recipient, signature; a control message is decoded whole), queues a data
message durably, acknowledges it to the transport and tells the pair's
protocol.  A file that fails is set aside into the quarantine and counts
as missing.  The apply that follows is agent.applying's.

Rules of this file:
* A file is acknowledged to the transport only once it is durably queued
  (or set aside: the quarantine is evidence, not state).
* A file that is not this site's (not a message name, another recipient)
  is never read or removed: the transport is told not to read it.  One
  the transport refuses to read (too large, a hard link) is left the same
  way; both are warned about once (agent.left_files).
* The signature of a queued file is not checked again when it is applied:
  every pending message went through :meth:`receive_file` or
  :meth:`restore_pending` in this process, with the keys of now.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from codec.errors import BadFileName, BadSignature, MessageError
from codec.message import check_message, decode_message
from codec.names import Kind, MessageName
from transports import Incoming, Refusal, Transport, TransportError

from .crashpoints import crash_point
from .pairs import Peer
from .run_options import IN_SUMMARY

if TYPE_CHECKING:
    from .runner import Agent

log = logging.getLogger("fieldsync.agent")
# Parsed names kept between a transport's question and the file's turn; a
# transport that asks and then refuses many files (too large) costs no more.
_NAMES_KEPT = 1024


class _Mismatch(MessageError):
    def __init__(self, name: str) -> None:
        super().__init__(name, "file name does not match the message inside it")


class Receiver:
    """The receive path of one agent."""

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self._names: dict[str, MessageName] = {}

    # -- one receive ----------------------------------------------------------------------

    async def receive(self, transport: Transport, address: str) -> None:
        """Take in every file waiting at ``address``; set aside what fails."""
        agent = self.agent
        await asyncio.to_thread(agent.left.load)
        try:
            async for incoming in transport.receive(address, wanted=self.wanted, refused=self.refused):
                await self.receive_file(transport, incoming)
        except TransportError as error:
            agent.report.transport_errors.append(f"receiving at {address}: {error}")
            log.warning("receiving at %s failed: %s", address, error, extra=IN_SUMMARY)
        else:
            agent.report.left_in_inbox = agent.left.met
            await asyncio.to_thread(agent.left.end_receive)
        finally:
            self._names.clear()
        await self.flush_aside()

    def wanted(self, name_text: str) -> bool:
        """Whether a file at the inbox is this site's to read: a message name
        addressed to it.  Any other is left (and warned about once, see
        agent.left_files) without being read: the transports ask this
        before they download."""
        agent = self.agent
        try:
            name = MessageName.parse(name_text)
        except BadFileName as error:
            agent.left.leave(name_text, f"{error} (is that this site's inbox?)")
            return False
        if name.recipient != agent.name:
            agent.left.leave(name_text, f"addressed to {name.recipient}, not {agent.name} (is that this site's inbox?)")
            return False
        if len(self._names) >= _NAMES_KEPT:
            self._names.clear()
        self._names[name_text] = name
        return True

    def refused(self, refusal: Refusal) -> None:
        """A file the transport will not read: left where it is, warned about once."""
        self._names.pop(refusal.name, None)
        self.agent.left.leave(refusal.name, refusal.reason, refusal.identity)

    async def receive_file(self, transport: Transport, incoming: Incoming) -> None:
        agent = self.agent
        name_text, data = incoming.name, incoming.data
        if agent.options.keep and await asyncio.to_thread(agent.quarantine.contains, data):
            # Left in the message system and set aside at an earlier poll.  (A
            # file put back in the inbox without --keep is read afresh.)
            log.debug("%s is in the quarantine already", name_text)
            return
        name = self._names.pop(name_text, None)
        if name is None:
            if not self.wanted(name_text):
                return  # a transport that reads what it was told to leave: left all the same
            name = self._names.pop(name_text)
        peer = agent.peers.get(name.sender)
        if peer is None:
            await self.set_aside(transport, incoming, None, f"from {name.sender}, which is not a peer of {agent.name}")
            return
        now = agent.clock()
        try:
            if name.kind is Kind.CONTROL:
                message = decode_message(data, source=name_text, keyring=agent.keyring, recipient=agent.name,
                                         recipient_keys=agent.keys)
            else:
                message = check_message(data, source=name_text, keyring=agent.keyring, recipient=agent.name)
            if message.header != name.header or message.sender != name.sender or message.kind is not name.kind:
                raise _Mismatch(name_text)
        except MessageError as error:
            claimed = error.claimed_incarnation if isinstance(error, BadSignature) else None
            if claimed is not None and claimed in peer.protocol.superseded:
                # Late mail from a copy of the peer that was extracted again
                # (with new keys): no message of the peer's current stream,
                # so not counted as a rejected one.  The claim is unverified;
                # it only explains why the file is set aside.
                reason = (f"{error}: it names {peer.name}'s incarnation {claimed.hex()[:8]}, a copy that was "
                          f"extracted again since (late mail from a database that no longer exists)")
                await self.set_aside(transport, incoming, peer.name, reason)
                return
            await self.set_aside(transport, incoming, peer.name, str(error))
            await agent.execute(peer, peer.protocol.message_rejected(now, name_text, str(error)))
            return
        if (agent.options.keep and message.kind is not Kind.CONTROL
                and peer.protocol.already_taken(name_text, message.header, message.incarnation)):
            return  # kept in the message system, and taken in at an earlier poll
        agent.report.received += 1
        if message.kind is Kind.CONTROL:
            assert message.control is not None
            await agent.execute(peer, peer.protocol.control_received(now, message.control, message.incarnation))
            await self._ack(transport, incoming)
            return
        await asyncio.to_thread(agent.queues.put_inbound, peer.name, name_text, data)
        crash_point("receive.after-queue")
        await self._ack(transport, incoming)
        await agent.execute(peer, peer.protocol.message_queued(now, name_text, message.header,
                                                               message.incarnation))

    async def _ack(self, transport: Transport, incoming: Incoming) -> None:
        """Let the transport remove a file that is durably stored or set aside,
        unless ``--keep`` leaves every file in the message system."""
        if not self.agent.options.keep:
            await transport.ack(incoming)

    # -- the quarantine ------------------------------------------------------------------

    async def set_aside(self, transport: Transport, incoming: Incoming, peer: str | None, reason: str) -> None:
        """Set aside a file refused on receipt, then acknowledge it."""
        agent = self.agent
        agent.report.quarantined += 1
        if agent.aside.add(peer, incoming.name, incoming.data, reason):
            await self.flush_aside()
        await self._ack(transport, incoming)

    async def flush_aside(self) -> None:
        agent = self.agent
        block = agent.aside.take()
        if block:
            await asyncio.to_thread(agent.aside.write, block)
            agent.report.quarantine_dropped = agent.quarantine.dropped

    # -- after a restart -----------------------------------------------------------------------

    async def restore_pending(self) -> None:
        """Tell each pair's protocol about the inbound messages still queued
        from earlier runs (the core keeps no state of its own across runs):
        one worker-thread hop for every peer."""
        agent = self.agent
        found = await asyncio.to_thread(self._restore_blocking, list(agent.peers.values()))
        for peer, settled, queued in found:
            if settled.dequeued or settled.restored:
                log.info("after an unclean stop, %d message(s) from %s were in doubt: %d had been applied "
                         "(now dequeued), %d had not (queued again)", len(settled.dequeued) + len(settled.restored),
                         peer.name, len(settled.dequeued), len(settled.restored))
            for name, message in queued:
                crash_point("restart.pending")
                await agent.execute(peer, peer.protocol.message_queued(agent.clock(), name, message.header,
                                                                       message.incarnation, restored=True))

    def _restore_blocking(self, peers: list[Peer]) -> list[tuple[Peer, Any, list[tuple[str, Any]]]]:
        """Blocking: settle each peer's dequeues in doubt (the process died
        between the database commit of an apply and the dequeue's commit:
        the database decides), then read the headers of what is queued."""
        agent = self.agent
        found = []
        for peer in peers:
            settled = agent.queues.resolve_in_doubt(peer.name, peer.protocol.state.log_received)
            queued = self._queued_headers(peer)
            if settled.dequeued or settled.restored or queued:
                found.append((peer, settled, queued))
        return found

    def _queued_headers(self, peer: Peer) -> list[tuple[str, Any]]:
        """Blocking: the checked headers of ``peer``'s queued messages; one
        that no longer passes (the peer's key changed since) is set aside."""
        agent = self.agent
        found = []
        for name in agent.queues.inbound(peer.name):
            data = agent.queues.read_inbound(peer.name, name)
            try:
                found.append((name, check_message(data, source=name, keyring=agent.keyring, recipient=agent.name)))
            except MessageError as error:
                agent.set_aside_now(peer.name, name, data, str(error))
                agent.queues.delete_inbound(peer.name, [name])
        return found
