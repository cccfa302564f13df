"""The last hop: queued outbound files out through the transports.

:meth:`Deliverer.flush` hands the files queued for each peer to the
transport its remote row names, oldest first, in blocks (at most
``FLUSH_FILES`` files or ``FLUSH_BYTES`` bytes, read in one worker-thread
hop); a block's files leave the queue in one group commit once the
transports took them.

Rules of this file:
* Sent means accepted by the transport (SMTP 250, a rename done), data
  and control messages alike; only then does a file leave the queue.  A
  crash before that commit sends it again: the receiver drops what it
  already has.
* A peer whose transport fails keeps its queue, its error is recorded on
  its remote row, and it is tried again at the next flush; the others go on.
* It takes what it uses (:class:`~agent.contexts.Outbox`); the times it
  records are the agent's clock's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from transports import TransportError

from .contexts import Outbox, stamp
from .crashpoints import crash_point
from .pairs import Peer
from .run_options import IN_SUMMARY

log = logging.getLogger("fieldsync.agent")


class Deliverer:
    """The outbound queues of one agent, on to the transports."""

    FLUSH_FILES = 256
    FLUSH_BYTES = 16 * 1024 * 1024

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    async def flush(self) -> None:
        """Hand queued outbound files to the transports, oldest first; a
        failing peer keeps its queue and is retried at the next flush."""
        outbox = self.outbox
        depths = await asyncio.to_thread(outbox.queues.depths)
        waiting = [outbox.peers[depth.peer] for depth in depths if depth.outbound and depth.peer in outbox.peers]
        failed: set[str] = set()
        for peer in waiting:
            if not peer.address:
                outbox.report.transport_errors.append(f"{peer.name} has no address; messages stay queued")
                failed.add(peer.name)
        waiting = [peer for peer in waiting if peer.name not in failed]
        position = 0
        while position < len(waiting):
            block, position = await asyncio.to_thread(self._read_block, waiting, position, frozenset(failed))
            sent: list[tuple[str, str]] = []
            try:
                for peer, name, data in block:
                    if peer.name in failed:
                        continue
                    assert peer.address is not None
                    try:
                        transport = outbox.transports.transport_for(peer.transport, peer.name)
                        await transport.send(peer.address, name, data)
                    except TransportError as error:
                        failed.add(peer.name)
                        message = f"sending to {peer.name} at {peer.address}: {error}"
                        log.warning("%s", message, extra=IN_SUMMARY)
                        outbox.report.transport_errors.append(message)
                        await asyncio.to_thread(outbox.db.record_transport_error, peer.name, str(error),
                                                now=stamp(outbox.clock()))
                        continue
                    crash_point("flush.after-send")
                    sent.append((peer.name, name))
            finally:
                if sent:
                    await asyncio.to_thread(self._delete_sent, sent)
                    outbox.report.sent += len(sent)
                    counts = Counter(peer_name for peer_name, _ in sent)
                    await asyncio.to_thread(outbox.db.record_delivered, counts, now=stamp(outbox.clock()))

    def _read_block(self, peers: list[Peer], position: int, failed: frozenset[str]
                    ) -> tuple[list[tuple[Peer, str, bytes]], int]:
        """Blocking: the next block of queued files, whole peers' queues
        from ``position`` on (a large queue is read in several blocks, in
        order), skipping the peers that ``failed``; return it and the
        position to go on from."""
        queues = self.outbox.queues
        block: list[tuple[Peer, str, bytes]] = []
        size = 0
        while position < len(peers) and len(block) < self.FLUSH_FILES and size < self.FLUSH_BYTES:
            peer = peers[position]
            if peer.name in failed:
                position += 1
                continue
            names = queues.outbound(peer.name)
            taken = 0
            for name in names:
                if block and (len(block) >= self.FLUSH_FILES or size >= self.FLUSH_BYTES):
                    break
                data = queues.read_outbound(peer.name, name)
                block.append((peer, name, data))
                size += len(data)
                taken += 1
            if taken == len(names):
                position += 1  # this peer's queue is all in the block
            else:
                break  # the rest of it comes in the next block
        return block, position

    def _delete_sent(self, sent: list[tuple[str, str]]) -> None:
        queues = self.outbox.queues
        with queues.group_commit():
            for peer, name in sent:
                queues.delete_outbound(peer, name)
