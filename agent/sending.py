"""The send path: this site's log into the outbound queue.

A send phase (docs/protocol.md, rule 5) goes in three steps, which the
runner takes in turn, carrying out what each hands back: :meth:`Sender.due`
scans the log and asks each pair for its send (everything up to the log
end when its schedule is due, else only a resend asked for);
:meth:`Sender.make` makes the due sends' files together (agent.preparing:
on Spark or packed here in one pass) and records them together;
:meth:`Sender.controls` names the control messages due (rule 3), queued
once the pairs are saved.  A phase costs a few worker-thread hops and
fsyncs whatever the number of peers.  A send handed out outside a phase
(a resend acted on later) is made alone: :meth:`Sender.send_one`.

Rules of this file:
* It takes what it uses (:class:`~agent.contexts.Outbox`) and returns the
  protocol's actions; the runner carries them out, saves the pairs, and
  gives back a send not recorded (cancelled, failed).
* ``log_sent`` never moves before the files of its range are durable in
  the outbound queue: they are queued in one group commit, then recorded
  in one database transaction; one send failing fails that peer alone.
* The times it records are the agent's clock's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from .contexts import Outbox, stamp
from .controls import control_timers
from .crashpoints import crash_point
from .errors import AgentError
from .pairs import Peer
from .preparing import Prepared, Preparer
from .protocol import Action, SendControl, SendData
from .schedule import SendSchedule
from .spark.errors import SparkBatchError

log = logging.getLogger("fieldsync.agent")


@dataclass(frozen=True, slots=True)
class Due:
    """A pair asked for its send: the actions first (a resend's purge), and the send, if any."""

    peer: Peer
    actions: list[Action]
    send: SendData | None


class Sender:
    """The send path of one agent."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.preparer = Preparer(outbox)
        self.schedule = SendSchedule()

    # -- a send phase ---------------------------------------------------------------------

    async def due(self, now: float) -> list[Due]:
        """Step 1: scan the log; ask every pair for its send."""
        outbox = self.outbox
        db = outbox.db
        log_end, log_start, rows = await asyncio.to_thread(
            lambda: (db.scan(), db.log_start(), () if outbox.batch else db.remotes()))
        remotes = {row.name: row for row in rows}
        due = []
        for peer in outbox.peers.values():
            scheduled = self.schedule.due(now, peer.name, remotes.get(peer.name))
            actions = peer.protocol.send_due(now, log_end, log_start, scheduled=scheduled)
            # A SendData is always the last action (after a resend's purge).
            send = actions.pop() if actions and isinstance(actions[-1], SendData) else None
            due.append(Due(peer, actions, send))
        return due

    async def make(self, sends: list[tuple[Peer, SendData]]) -> list[list[Action]]:
        """Step 2: make the sends' files together and record them; tell each
        pair's protocol what became of its send; return what follows, per send."""
        prepared, failed, batch = await self.preparer.prepare(sends)
        try:
            if failed:
                outcomes: list[int | BaseException] = [SparkBatchError("the Spark batch failed")] * len(sends)
            else:
                outcomes = await asyncio.to_thread(self._record_all, sends, prepared)
        finally:
            if batch is not None:  # its files were read as the sends were recorded
                await asyncio.to_thread(batch.close)
        return [self._done(peer, send, outcome, quiet=failed) for (peer, send), outcome in zip(sends, outcomes)]

    async def send_one(self, peer: Peer, send: SendData) -> list[Action]:
        """A send handed out outside a send phase: made and recorded alone."""
        [outcome] = await asyncio.to_thread(self._record_all, [(peer, send)], {})
        return self._done(peer, send, outcome)

    def _record_all(self, sends: list[tuple[Peer, SendData]], prepared: dict[str, Prepared]
                    ) -> list[int | BaseException]:
        """Blocking: make sure each send's files are queued (:meth:`Preparer.queued`),
        then record every send that made files in one transaction.  Returns,
        per send, how many messages it queued (0: none) or what stopped it."""
        outbox = self.outbox
        outcomes: list[int | BaseException] = []
        try:
            with outbox.queues.group_commit():
                for peer, send in sends:
                    outcomes.append(self.preparer.queued(peer, send, prepared.get(peer.name)))
        except (AgentError, OSError) as error:
            # The block's wait for durability failed: none of its puts counts as queued.
            return [error for _ in sends]
        crash_point("send.after-queue")
        outbox.db.record_sends([(peer.name, send.end, 0) for (peer, send), outcome in zip(sends, outcomes)
                                if isinstance(outcome, int) and outcome > 0], now=stamp(outbox.clock()))
        return outcomes

    def _done(self, peer: Peer, send: SendData, outcome: int | BaseException, *, quiet: bool = False
              ) -> list[Action]:
        """Tell the protocol what became of a send; return what follows."""
        now = self.outbox.clock()
        if isinstance(outcome, BaseException):
            if not quiet:
                # A range the log cannot serve (its remote row disagrees with
                # the log) fails this peer's send and no other.
                log.error("preparing messages for %s failed: %s", peer.name, outcome)
                self.outbox.report.local_errors.append(f"preparing messages for {peer.name}: {outcome}")
            return peer.protocol.send_aborted(now)
        if outcome == 0:
            # Nothing for the peer in the range: no message (rule 5); only
            # log_read moves, saved with the pair's state.
            return peer.protocol.send_done(now, send.end, empty=True)
        peer.recorded(log_sent=send.end)  # queued; counted as sent once a transport accepts it (flush)
        return peer.protocol.send_done(now, send.end)

    # -- control messages ---------------------------------------------------------------------

    def controls(self, now: float, peers: list[Peer], *, force: bool) -> list[tuple[Peer, SendControl]]:
        """Step 3: the control messages due to ``peers`` (rule 3), with each
        one's heartbeat and confirm timeout in force (agent.controls)."""
        options = self.outbox.options
        controls: list[tuple[Peer, SendControl]] = []
        for peer in peers:
            heartbeat, confirm_timeout = control_timers(peer.heartbeat, peer.confirm_timeout,
                                                        run_heartbeat=options.heartbeat,
                                                        run_confirm_timeout=options.probe_after)
            controls += [(peer, action) for action in peer.protocol.send_controls(
                now, heartbeat=heartbeat, confirm_timeout=confirm_timeout, force=force)]
        return controls

    async def queue_controls(self, controls: list[tuple[Peer, SendControl]]) -> None:
        """Queue control messages, in one worker-thread hop and one group commit."""
        report = self.outbox.report
        failed = await asyncio.to_thread(self.preparer.queue_controls, controls)
        for peer, error in failed:  # e.g. the peer's sealing key is another site's
            log.error("preparing a control message for %s failed: %s", peer.name, error)
            report.local_errors.append(f"preparing a control message for {peer.name}: {error}")
        failed_peers = {peer.name for peer, _ in failed}
        report.resend_requests += sum(1 for peer, action in controls
                                      if action.reason == "resend request" and peer.name not in failed_peers)
