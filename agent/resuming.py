"""The inbound messages already queued: after a restart (and after the
remotes change), told to the protocol again, as queued earlier (the core
keeps no state of its own across runs); and set aside when they can never
be applied.

Rules of this file:
* A dequeue left in doubt by an unclean stop (the process died between
  the database commit of an apply and the dequeue's commit) is settled
  first, by the database's ``log_received``.
* Each queued message is checked again with the keys of now (the peer's
  key may have changed since it was queued); one that no longer passes is
  set aside, and counts as missing.
* It takes what it uses (:class:`~agent.contexts.Inbox`) and yields the
  protocol's actions, message by message, for the runner to carry out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from codec.errors import MessageError
from codec.message import check_message

from .contexts import Inbox, Step
from .crashpoints import crash_point
from .pairs import Peer
from .protocol import Quarantine

log = logging.getLogger("fieldsync.agent")


class Resumer:
    """The queued inbound messages of one agent."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    async def tell_queued(self) -> AsyncIterator[Step]:
        """Tell each pair's protocol about the inbound messages still queued
        from earlier runs, read in one worker-thread hop for every peer;
        yield what each led to."""
        inbox = self.inbox
        found = await asyncio.to_thread(self._settle_and_read, list(inbox.peers.values()))
        for peer, settled, queued in found:
            if settled.dequeued or settled.requeued:
                log.info("after an unclean stop, %d message(s) from %s were in doubt: %d had been applied "
                         "(now dequeued), %d had not (queued again)", len(settled.dequeued) + len(settled.requeued),
                         peer.name, len(settled.dequeued), len(settled.requeued))
            for name, message, size in queued:
                crash_point("restart.pending")
                yield peer, peer.protocol.message_queued(inbox.clock(), name, message.header, message.incarnation,
                                                         queued_earlier=True, size=size, apply=False)
            if queued:  # all told: consecutive ones are applied together (rule 2)
                yield peer, peer.protocol.take_applicable(inbox.clock())

    def quarantine(self, peer: str, action: Quarantine) -> None:
        """Blocking: carry out a :class:`Quarantine` (a message that can never
        be applied leaves the inbound queue for the quarantine)."""
        queues = self.inbox.queues
        if action.message_id in queues.inbound(peer):
            self._set_aside(peer, action.message_id, queues.read_inbound(peer, action.message_id), action.reason)

    def _set_aside(self, peer: str, name: str, data: bytes, reason: str) -> None:
        """Blocking: move a queued message into the quarantine, counted."""
        inbox = self.inbox
        inbox.aside.store.put(peer, name, data, reason)
        inbox.report.quarantined += 1
        inbox.report.quarantine_dropped = inbox.aside.store.dropped
        inbox.queues.delete_inbound(peer, [name])

    def _settle_and_read(self, peers: list[Peer]) -> list[tuple[Peer, Any, list[tuple[str, Any, int]]]]:
        """Blocking: settle each peer's dequeues in doubt, then read the
        headers of what is queued."""
        found = []
        for peer in peers:
            settled = self.inbox.queues.resolve_in_doubt(peer.name, peer.protocol.state.log_received)
            queued = self._queued_headers(peer)
            if settled.dequeued or settled.requeued or queued:
                found.append((peer, settled, queued))
        return found

    def _queued_headers(self, peer: Peer) -> list[tuple[str, Any, int]]:
        """Blocking: the checked headers of ``peer``'s queued messages, with
        their sizes; one that no longer passes is set aside."""
        inbox = self.inbox
        found = []
        for name in inbox.queues.inbound(peer.name):
            data = inbox.queues.read_inbound(peer.name, name)
            try:
                found.append((name, check_message(data, source=name, keyring=inbox.keyring, recipient=inbox.site),
                              len(data)))
            except MessageError as error:
                self._set_aside(peer.name, name, data, str(error))
        return found
