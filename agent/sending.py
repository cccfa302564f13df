"""The send path: this site's log into the outbound queue, and the queue
out through the transports.

A send phase (docs/protocol.md, rule 5) goes in three explicit steps:

1. **due**: the log is scanned, and each peer whose schedule is due (batch
   runs: every peer) is asked for its send: :meth:`PairProtocol.send_due`
   hands out a :class:`~agent.protocol.SendData`, or nothing;
2. **prepare**: the due sends are made together: on Spark for a large
   backlog (docs/spark.md), else packed here in one pass over the log
   (agent.outbound), every message queued durably in one group commit;
3. **record**: the prepared sends are recorded together (``log_sent``
   moves only now that their files are durable, all in one database
   transaction; one send failing fails that peer alone); then every pair
   the phase changed is saved in one transaction, and the control
   messages due (rule 3: only with news, or a heartbeat) are queued in
   one group commit.

A phase costs a few worker-thread hops and fsyncs whatever the number of
peers; per peer it costs only what that peer has: its messages, its row.

A send handed out outside a send phase (a resend request acted on later,
continuous mode) is prepared and recorded alone: :meth:`Sender.send_one`.
:meth:`Sender.flush` hands queued files to the transports, oldest first.

Rules of this file:
* ``log_sent`` never moves before the files of its range are durable in
  the outbound queue.
* A send handed out and not recorded (cancelled, failed) is given back to
  the protocol, so the next send phase starts it again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from codec.errors import CodecError
from codec.message import EncodedMessage, encode_control_message
from codec.keys import PublicKeys
from transports import TransportError

from .crashpoints import crash_point
from .errors import AgentError
from .outbound import SEND_ERRORS, BatchSend, Packed, pack_sends
from .pairs import PairStore, Peer
from .protocol import SendControl, SendData
from .run_options import IN_SUMMARY
from .schedule import sending_due
from .site.errors import LogOffsetError
from .spark.engine import SparkBatch, run_spark_batch
from .spark.errors import SparkBatchCancelled, SparkBatchError
from .spark.take import TakenFile

if TYPE_CHECKING:
    from .runner import Agent

log = logging.getLogger("fieldsync.agent")


@dataclass(frozen=True, slots=True)
class Prepared:
    """A due send made and queued: the files a Spark batch made for it (to
    be queued when it is recorded), or what packing it here did."""

    send: SendData
    files: list[TakenFile] | None = None
    packed: Packed | None = None


class Sender:
    """The send path of one agent."""

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self._last_scheduled: dict[str, datetime] = {}

    # -- a send phase ---------------------------------------------------------------------

    async def send_phase(self, *, force_controls: bool) -> None:
        """Scan the log; send to every peer whose schedule is due, and confirm."""
        agent = self.agent
        log_end, log_start = await asyncio.to_thread(lambda: (agent.db.scan(), agent.db.log_start()))
        now = agent.clock()
        due = await self._due(now, log_end, log_start)
        try:
            prepared, failed, batch = await self._prepare(due)
            sends = [(peer, send) for peer, send in due if send is not None]
            try:
                if failed:
                    outcomes: list[int | BaseException] = [SparkBatchError("the Spark batch failed")] * len(sends)
                else:
                    outcomes = await asyncio.to_thread(self._record_all, sends, prepared)
            finally:
                if batch is not None:  # its files were read as the sends were recorded
                    await asyncio.to_thread(batch.close)
            for (peer, send), outcome in zip(sends, outcomes):
                actions = self._done(peer, send, outcome, quiet=failed)
                if actions:  # rare (a resend that waited for this send); else the state is saved below
                    await agent.execute(peer, actions)
            controls = []
            for peer, _ in due:
                heartbeat = peer.heartbeat or agent.options.heartbeat
                # A remote's own confirm timeout above the heartbeat in force is capped at it.
                confirm_timeout = min(peer.confirm_timeout or agent.options.probe_after, heartbeat)
                for action in peer.protocol.send_controls(now, heartbeat=heartbeat, confirm_timeout=confirm_timeout,
                                                          force=force_controls):
                    controls.append((peer, action))
            # The pairs' state is durable before the controls it led to leave.
            await agent.save_all()
            if controls:
                await self.queue_controls(controls)
        except BaseException:
            # Cancelled (an application stopping its agent's task) or failed
            # before every send was recorded: the sends handed out and not
            # recorded are given back, so this agent's next send phase starts them.
            for peer, send in due:
                if send is not None:
                    agent.release(peer, [send])
            raise

    async def _due(self, now: float, log_end: int, log_start: int) -> list[tuple[Peer, SendData | None]]:
        """Step 1: ask each peer whose schedule is due for its send; carry out
        the other actions that come with it (a resend's purge)."""
        agent = self.agent
        rows = {} if agent.batch else {row.name: row for row in await asyncio.to_thread(agent.db.remotes)}
        wall = datetime.fromtimestamp(now).astimezone()
        due: list[tuple[Peer, SendData | None]] = []
        try:
            for peer in agent.peers.values():
                row = rows.get(peer.name)
                # The schedule counts from the last scheduled send of this agent
                # (or the last recorded send), whether or not it carried data.
                last = self._last_scheduled.get(peer.name, row.last_sent_at if row is not None else None)
                if row is None or sending_due(wall, last, send_every=row.send_every, send_at=row.send_at):
                    self._last_scheduled[peer.name] = wall
                    actions = peer.protocol.send_due(now, log_end, log_start)
                else:
                    # Not due by its schedule; a resend that was asked for still goes.
                    actions = peer.protocol.handle_timer(now)
                # A SendData is always the last action (after a resend's purge).
                send = actions.pop() if actions and isinstance(actions[-1], SendData) else None
                due.append((peer, send))
                if actions:  # a resend's purge; the state of the others is saved with the phase's
                    await agent.execute(peer, actions)
        except BaseException:
            for peer, send in due:
                if send is not None:
                    agent.release(peer, [send])
            raise
        return due

    async def _prepare(self, due: list[tuple[Peer, SendData | None]]
                       ) -> tuple[dict[str, Prepared], bool, SparkBatch | None]:
        """Step 2: make the due sends' files; return them by peer, whether
        the sends are given up for this run (``--engine spark`` failed), and
        the Spark batch whose files they are, to be closed once recorded."""
        sends = [(peer, send) for peer, send in due if send is not None]
        if not sends:
            return {}, False, None
        batch, failed = await self._spark_batch(sends)
        if failed:
            return {}, True, None
        if batch is not None:
            return {peer.name: Prepared(send, files=batch.files[peer.name]) for peer, send in sends}, False, batch
        packed = await asyncio.to_thread(self._pack_local, sends)
        return {peer.name: Prepared(send, packed=outcome) for (peer, send), outcome in zip(sends, packed)}, False, None

    def _record_all(self, sends: list[tuple[Peer, SendData]], prepared: dict[str, Prepared]
                    ) -> list[int | BaseException]:
        """Blocking, step 3: make sure each send's files are queued (a Spark
        batch's are queued now; a send prepared for an earlier state of the
        protocol, or none, is packed alone), then record every send that
        made files in one transaction.  Returns, per send, how many
        messages it queued (0: nothing for the peer) or what stopped it."""
        agent = self.agent
        outcomes: list[int | BaseException] = []
        try:
            with agent.queues.group_commit():
                for peer, send in sends:
                    outcomes.append(self._queued(peer, send, prepared.get(peer.name)))
        except (AgentError, OSError) as error:
            # The block's wait for durability failed: none of its puts counts as queued.
            return [error for _ in sends]
        crash_point("send.after-queue")
        when = datetime.fromtimestamp(agent.clock()).astimezone()
        agent.db.record_sends([(peer.name, send.end, 0) for (peer, send), outcome in zip(sends, outcomes)
                               if isinstance(outcome, int) and outcome > 0], now=when)
        return outcomes

    def _queued(self, peer: Peer, send: SendData, prepared: Prepared | None) -> int | BaseException:
        try:
            if prepared is not None and prepared.send == send and prepared.files is not None:
                return self._queue_prepared(peer, send, prepared.files)
            if prepared is None or prepared.send != send or prepared.packed is None:
                [outcome] = self._pack_local([(peer, send)])
            else:
                outcome = prepared.packed
            if outcome.error is not None:
                raise outcome.error  # at the peer's turn, as packing on its own would
            return outcome.messages
        except (LogOffsetError, *SEND_ERRORS) as error:
            return error

    def _done(self, peer: Peer, send: SendData, outcome: int | BaseException, *, quiet: bool = False) -> list[Any]:
        """Tell the protocol what became of a send; return what follows."""
        agent = self.agent
        now = agent.clock()
        if isinstance(outcome, BaseException):
            if not quiet:
                # A range the log cannot serve (its remote row disagrees with
                # the log) fails this peer's send and no other.
                log.error("preparing messages for %s failed: %s", peer.name, outcome)
                agent.report.transport_errors.append(f"preparing messages for {peer.name}: {outcome}")
            return peer.protocol.send_aborted(now)
        if outcome == 0:
            # Nothing for the peer in the range: no message (rule 5); only
            # log_read moves, saved with the pair's state.
            return peer.protocol.send_done(now, send.end, empty=True)
        PairStore.sent(peer, send.end)  # queued; counted as sent once a transport accepts it (flush)
        return peer.protocol.send_done(now, send.end)

    async def send_one(self, peer: Peer, send: SendData) -> list[Any]:
        """A send handed out outside a send phase: made and recorded alone."""
        [outcome] = await asyncio.to_thread(self._record_all, [(peer, send)], {})
        return self._done(peer, send, outcome)

    # -- Spark and local packing -------------------------------------------------------------

    async def _spark_batch(self, sends: list[tuple[Peer, SendData]]) -> tuple[SparkBatch | None, bool]:
        """Run the due sends as one Spark batch when the engine says so;
        return the batch and whether the sends are to be given up for this
        run (``--engine spark`` failed)."""
        agent = self.agent
        spark = agent.options.spark
        backlog = sum(send.end - send.start for _, send in sends)
        if not spark.uses_spark(backlog):
            return None, False
        log.info("preparing %d sends (backlog %d log offsets) on Spark (%s)", len(sends), backlog, spark.master)
        # The job's own stop event: cancelling this task stops this job (it
        # would run on in its thread) and no later one; the agent's event
        # (options.spark.cancel, stop_spark) stops every job.
        job = threading.Event()
        try:
            batch = await asyncio.to_thread(run_spark_batch, agent.db, agent.keys, self._batch_sends(sends),
                                            max_size=agent.options.max_message_size,
                                            version=agent.options.message_format, options=spark,
                                            work=spark.work or agent.directory / "spark", stop=job)
        except asyncio.CancelledError:
            job.set()
            raise
        except SparkBatchCancelled:
            # The agent is stopping: neither a failure nor a reason to pack here.
            log.warning("the Spark batch of %d sends was stopped; they are left for the next run", len(sends))
            return None, True
        except SparkBatchError as error:
            if spark.engine == "auto":
                log.warning("the Spark batch of %d sends failed, so they are packed here: %s", len(sends), error)
                return None, False
            log.error("the Spark batch of %d sends failed; they are left for the next run: %s", len(sends), error)
            agent.report.transport_errors.append(f"Spark batch of {len(sends)} sends: {error}")
            return None, True
        agent.report.spark_batches += 1
        return batch, False

    def _seal_to(self, peer: Peer) -> PublicKeys | None:
        return peer.public if (self.agent.options.seal and peer.public is not None) else None

    def _batch_sends(self, sends: list[tuple[Peer, SendData]]) -> list[BatchSend]:
        return [BatchSend(peer.name, send.start, send.end, send.resend_count, self._seal_to(peer),
                          read_from=send.read_from)
                for peer, send in sends]

    def _queue_prepared(self, peer: Peer, send: SendData, files: list[TakenFile]) -> int:
        """Blocking: queue the checked files a Spark batch made for ``send``."""
        queues = self.agent.queues
        with queues.group_commit():
            for file in files:
                queues.put_outbound(peer.name, file.name, file.read(), send.resend_count)
        return len(files)

    def _pack_local(self, sends: list[tuple[Peer, SendData]]) -> list[Packed]:
        """Blocking: pack ``sends`` here, in one pass over the log, and queue
        their messages as they are made; every put is durable on return.
        The files of a send that failed stay queued: its log_sent does not
        move, so they are sent again."""
        agent = self.agent
        batch_sends = self._batch_sends(sends)

        def put(index: int, message: EncodedMessage) -> None:
            send = batch_sends[index]
            agent.queues.put_outbound(send.subscriber, message.name, message.data, send.resend_count)

        try:
            with agent.queues.group_commit():
                return pack_sends(agent.db, agent.keys, batch_sends, put, max_size=agent.options.max_message_size,
                                  version=agent.options.message_format)
        except (AgentError, OSError) as error:
            # The block's wait for durability failed: none of its puts counts as queued.
            return [Packed(0, error) for _ in sends]

    # -- control messages and the transports ----------------------------------------------------

    async def queue_control(self, peer: Peer, action: SendControl) -> None:
        """Queue one control message (a resend request, outside a send phase)."""
        await self.queue_controls([(peer, action)])

    async def queue_controls(self, controls: list[tuple[Peer, SendControl]]) -> None:
        """Queue control messages, in one worker-thread hop and one group commit."""
        agent = self.agent
        failed = await asyncio.to_thread(self._queue_controls, controls)
        for peer, error in failed:  # e.g. the peer's sealing key is another site's
            log.error("preparing a control message for %s failed: %s", peer.name, error)
            agent.report.transport_errors.append(f"preparing a control message for {peer.name}: {error}")
        failed_peers = {peer.name for peer, _ in failed}
        agent.report.resend_requests += sum(1 for peer, action in controls
                                            if action.reason == "resend request" and peer.name not in failed_peers)

    def _queue_controls(self, controls: list[tuple[Peer, SendControl]]) -> list[tuple[Peer, CodecError]]:
        agent = self.agent
        failed = []
        incarnation = agent.db.identity.incarnation
        with agent.queues.group_commit():
            for peer, action in controls:
                try:
                    message = encode_control_message(action.state, keys=agent.keys, recipient=peer.name,
                                                     incarnation=incarnation, seal_to=self._seal_to(peer))
                except CodecError as error:
                    failed.append((peer, error))
                    continue
                agent.queues.put_outbound(peer.name, message.name, message.data, None)
        return failed

    async def flush(self) -> None:
        """Hand queued outbound files to the transports, oldest first; a
        failing peer keeps its queue and is retried at the next flush.

        The files go in blocks (at most ``FLUSH_FILES`` files or
        ``FLUSH_BYTES`` bytes, read in one worker-thread hop); a block's
        files leave the queue in one group commit once the transports took
        them.  A crash before that commit sends them again: the receiver
        drops what it already has."""
        agent = self.agent
        depths = await asyncio.to_thread(agent.queues.depths)
        waiting = [agent.peers[depth.peer] for depth in depths if depth.outbound and depth.peer in agent.peers]
        failed: set[str] = set()
        for peer in waiting:
            if not peer.address:
                agent.report.transport_errors.append(f"{peer.name} has no address; messages stay queued")
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
                        await self.agent.transport_for(peer.transport, peer.name).send(peer.address, name, data)
                    except TransportError as error:
                        failed.add(peer.name)
                        message = f"sending to {peer.name} at {peer.address}: {error}"
                        log.warning("%s", message, extra=IN_SUMMARY)
                        agent.report.transport_errors.append(message)
                        await asyncio.to_thread(agent.db.record_transport_error, peer.name, str(error))
                        continue
                    crash_point("flush.after-send")
                    sent.append((peer.name, name))
            finally:
                if sent:
                    await asyncio.to_thread(self._delete_sent, sent)
                    # Sent means accepted by the transport (SMTP 250, a rename done), data and control alike.
                    agent.report.sent += len(sent)
                    counts = Counter(peer_name for peer_name, _ in sent)
                    when = datetime.fromtimestamp(agent.clock()).astimezone()
                    await asyncio.to_thread(agent.db.record_delivered, counts, now=when)

    FLUSH_FILES = 256
    FLUSH_BYTES = 16 * 1024 * 1024

    def _read_block(self, peers: list[Peer], position: int, failed: frozenset[str]
                    ) -> tuple[list[tuple[Peer, str, bytes]], int]:
        """Blocking: the next block of queued files, whole peers' queues
        from ``position`` on (a large queue is read in several blocks, in
        order), skipping the peers that ``failed``; return it and the
        position to go on from."""
        queues = self.agent.queues
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
        queues = self.agent.queues
        with queues.group_commit():
            for peer, name in sent:
                queues.delete_outbound(peer, name)
