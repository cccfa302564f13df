"""The apply path: queued inbound messages into the site database.

The protocol hands out an :class:`~agent.protocol.Apply` (one message,
consecutive messages, or a complete group of parts, docs/protocol.md rule
2); this module carries it
out as one unit (I4): the spool's dequeue is begun (durable), the database
applies the transactions and sets ``log_received`` in one transaction, then
the dequeue commits.  A crash in between leaves the dequeue in doubt, and
the database's ``log_received`` settles it at the next start
(agent.resuming).

Rules of this file:
* A message that fails to decode at apply time (its payload, not its
  signature: that was checked when it was received) can never be applied:
  it is set aside and counts as missing, so the peer is asked for it again.
* A group of parts is applied as it is read: its first part is decoded
  before the dequeue begins, the others one at a time from the spool
  while the database applies the operations before them
  (docs/message-format.md, "Large transactions"); a part that fails then
  rolls the whole apply back and is set aside as above.  Consecutive
  messages are read the same way, each after the first as the apply
  reaches it; one that fails rolls the apply back and is set aside alone
  (the protocol's ``culprit``).
* A database that refuses the apply keeps the messages queued; the next
  poll tries again.
* A cancelled apply is finished first, then the cancellation goes on (the
  runner shields it).  Its times are the agent's clock's.
"""

from __future__ import annotations

import asyncio
import logging

from codec.errors import MessageError

from .contexts import Applier, stamp
from .crashpoints import crash_point
from .errors import AgentError
from .inbound import load_transactions
from .pairs import Peer
from .protocol import Action, Apply
from .site.errors import SiteError

log = logging.getLogger("fieldsync.agent")


async def apply(applier: Applier, peer: Peer, action: Apply) -> list[Action]:
    """Carry out ``action`` as one unit (I4): the database transaction, the
    spool's dequeue and the protocol's state go together; return what the
    protocol made of it (for the runner to carry out, or give back)."""
    now = applier.clock()
    queues = applier.queues
    try:
        following = tuple((message_id, peer.protocol.pending_header(message_id).last)
                          for message_id in action.message_ids[1:])
        transactions = await asyncio.to_thread(load_transactions, applier, peer.name, action.message_ids, following)
    except MessageError as error:
        log.warning("cannot apply %s from %s: %s", error.source, peer.name, error)
        return peer.protocol.apply_aborted(now, quarantine=str(error), culprit=error.source)
    # The dequeue is in doubt until the database has committed the apply.
    token = await asyncio.to_thread(queues.begin_dequeue, peer.name, action.message_ids, action.log_received)
    try:
        await asyncio.to_thread(applier.db.apply, peer.name, transactions, log_received=action.log_received,
                                messages=len(action.message_ids), skip_through=action.skip_through,
                                peer_incarnation=peer.protocol.state.peer_incarnation,
                                now=stamp(now))
    except MessageError as error:  # read during the apply (a part, a message after the first): rolled back
        log.warning("cannot apply %s from %s: %s", error.source, peer.name, error)
        await asyncio.to_thread(queues.abort_dequeue, token)
        return peer.protocol.apply_aborted(now, quarantine=str(error), culprit=error.source)
    except (SiteError, AgentError) as error:  # refused, or the spool failed: keep the messages, retry at the next poll
        log.error("applying %s from %s failed: %s", action.message_ids[0], peer.name, error)
        applier.report.local_errors.append(f"applying from {peer.name}: {error}")
        await asyncio.to_thread(queues.abort_dequeue, token)
        return peer.protocol.apply_aborted(now)
    crash_point("apply.after-commit")
    await asyncio.to_thread(queues.commit_dequeue, token)
    applier.report.applied_messages += len(action.message_ids)
    peer.recorded(log_received=action.log_received)
    return peer.protocol.apply_done(now, action.log_received)
