"""Making the files of a send phase's sends and queueing them durably: on
Spark for a large backlog (docs/spark.md), else packed here in one pass
over the log (agent.outbound), on packing workers from their threshold on
(agent.pack_workers); and the control messages.  The send path
(agent.sending) records the sends afterwards.

Rules of this file:
* The policy decides (agent.spark.policy): whether the sends go to Spark
  (``SparkOptions.uses_spark``), and what becomes of them when the batch
  gives no files (``spark_fallback``: packed here, or left for the next
  run, quietly or as a local error); this file asks and carries it out.
* Every put is durable when a send counts as queued; a block whose wait
  for durability failed counts none of its puts.
* A send made for another state of the protocol than the one it is
  recorded in (or none) is packed alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, replace

from codec.errors import CodecError
from codec.keys import PublicKeys
from codec.message import EncodedMessage, encode_control_message

from .contexts import Outbox
from .errors import AgentError
from .outbound import SEND_ERRORS, BatchSend, Packed
from .pack_workers import pack_due_sends
from .pairs import Peer
from .protocol import SendControl, SendData
from .site import Role
from .site.errors import LogOffsetError
from .spark.engine import SparkBatch, run_spark_batch
from .spark.errors import SparkBatchCancelled, SparkBatchError
from .spark.policy import spark_fallback
from .spark.take import TakenFile

log = logging.getLogger("fieldsync.agent")


@dataclass(frozen=True, slots=True)
class Prepared:
    """A due send made and queued: the files a Spark batch made for it (to
    be queued when it is recorded), or what packing it here did."""

    send: SendData
    files: list[TakenFile] | None = None
    packed: Packed | None = None


_NOTHING = Packed(0, None)  # a range that holds nothing for its peer: no message (rule 5)


class Preparer:
    """Makes the files of sends, for one agent's send path."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    async def prepare(self, sends: list[tuple[Peer, SendData]]
                      ) -> tuple[dict[str, Prepared], bool, SparkBatch | None]:
        """Make the sends' files; return them by peer, whether the sends are
        given up for this run (``--engine spark`` failed), and the Spark
        batch whose files they are, to be closed once recorded."""
        if not sends:
            return {}, False, None
        # A send whose range holds nothing for its peer (most of a fleet's,
        # when a few rows changed) is prepared empty, with no reader or packer.
        chosen = await asyncio.to_thread(self.outbox.db.concerned_reads,
                                         [(peer.name, send.read_start, send.end) for peer, send in sends])
        prepared = {peer.name: Prepared(send, packed=_NOTHING) for peer, send in sends}
        sends = [sends[index] for index in chosen]
        if not sends:
            return prepared, False, None
        batch, failed = await self._spark_batch(sends)
        if failed:
            return {}, True, None
        if batch is not None:
            prepared.update((peer.name, Prepared(send, files=batch.files[peer.name])) for peer, send in sends)
            return prepared, False, batch
        packed = await asyncio.to_thread(self._pack_local, sends)
        prepared.update((peer.name, Prepared(send, packed=outcome)) for (peer, send), outcome in zip(sends, packed))
        return prepared, False, None

    def queued(self, peer: Peer, send: SendData, prepared: Prepared | None) -> int | BaseException:
        """Blocking: make sure the files of ``send`` are queued (a Spark
        batch's are queued now; a send prepared for another state, or not
        at all, is packed alone); return how many (0: nothing for the
        peer in its range) or what stopped it."""
        try:
            if prepared is not None and prepared.send == send and prepared.files is not None:
                return self._queue_files(peer, send, prepared.files)
            if prepared is None or prepared.send != send or prepared.packed is None:
                [outcome] = self._pack_local([(peer, send)])
            else:
                outcome = prepared.packed
            if outcome.error is not None:
                raise outcome.error  # at the peer's turn, as packing on its own would
            return outcome.messages
        except (LogOffsetError, *SEND_ERRORS) as error:
            return error

    async def _spark_batch(self, sends: list[tuple[Peer, SendData]]) -> tuple[SparkBatch | None, bool]:
        """Run the sends as one Spark batch when the policy says so; return
        the batch and whether the sends are given up for this run."""
        outbox = self.outbox
        spark = outbox.options.spark
        backlog = sum(send.end - send.start for _, send in sends)
        if not spark.uses_spark(backlog):
            return None, False
        log.info("preparing %d sends (backlog %d log offsets) on Spark (%s)", len(sends), backlog, spark.master)
        # The job's own stop event: cancelling this task stops this job (it
        # would run on in its thread) and no later one; the agent's event
        # (options.spark.cancel, stop_spark) stops every job.
        job = threading.Event()
        try:
            batch = await asyncio.to_thread(run_spark_batch, outbox.db, outbox.keys, self._batch_sends(sends),
                                            max_size=outbox.options.max_message_size,
                                            version=outbox.options.message_format, options=spark,
                                            work=spark.work or outbox.directory / "spark", stop=job)
        except asyncio.CancelledError:
            job.set()
            raise
        except SparkBatchError as error:
            decision = spark_fallback(spark.engine, "cancelled" if isinstance(error, SparkBatchCancelled) else "failed")
            if decision.pack_here:
                log.warning("the Spark batch of %d sends failed, so they are packed here: %s", len(sends), error)
            elif decision.error:
                log.error("the Spark batch of %d sends failed; they are left for the next run: %s", len(sends), error)
                outbox.report.local_errors.append(f"Spark batch of {len(sends)} sends: {error}")
            else:
                log.warning("the Spark batch of %d sends was stopped; they are left for the next run", len(sends))
            return None, not decision.pack_here
        outbox.report.spark_batches += 1
        return batch, False

    def seal_to(self, peer: Peer) -> PublicKeys | None:
        return peer.public if (self.outbox.options.seal and peer.public is not None) else None

    def _batch_sends(self, sends: list[tuple[Peer, SendData]]) -> list[BatchSend]:
        return [BatchSend(peer.name, send.start, send.end, send.resend_count, self.seal_to(peer),
                          read_from=send.read_from)
                for peer, send in sends]

    def _queue_files(self, peer: Peer, send: SendData, files: list[TakenFile]) -> int:
        """Blocking: queue the checked files a Spark batch made for ``send``."""
        queues = self.outbox.queues
        with queues.group_commit():
            for file in files:
                queues.put_outbound(peer.name, file.name, file.read(), send.resend_count)
        return len(files)

    def _pack_local(self, sends: list[tuple[Peer, SendData]]) -> list[Packed]:
        """Blocking: pack ``sends`` here, in one pass over the log, and queue
        their messages as they are made; every put is durable on return.
        The files of a send that failed stay queued: its log_sent does not
        move, so they are sent again."""
        outbox = self.outbox
        batch_sends = self._batch_sends(sends)

        def put(index: int, message: EncodedMessage) -> None:
            send = batch_sends[index]
            outbox.queues.put_outbound(send.subscriber, message.name, message.data, send.resend_count)

        options = outbox.options
        try:
            with outbox.queues.group_commit():
                return pack_due_sends(outbox.db, outbox.keys, batch_sends, put, max_size=options.max_message_size,
                                      version=options.message_format, workers=options.pack_workers,
                                      workers_from=options.pack_workers_from)
        except (AgentError, OSError) as error:
            # The block's wait for durability failed: none of its puts counts as queued.
            return [Packed(0, error) for _ in sends]

    def queue_controls(self, controls: list[tuple[Peer, SendControl]]) -> list[tuple[Peer, CodecError]]:
        """Blocking: make and queue control messages in one group commit;
        return those that could not be made (e.g. the peer's sealing key
        is another site's)."""
        outbox = self.outbox
        failed = []
        identity = outbox.db.identity
        # A remote tells its consolidated its schema version once it has one
        # (docs/protocol.md, "Schema versions"): read once for the phase.
        schema_version = outbox.db.schema_version() if controls and identity.role is Role.REMOTE else None
        with outbox.queues.group_commit():
            for peer, action in controls:
                state = action.state if schema_version is None else replace(action.state,
                                                                             schema_version=schema_version)
                try:
                    message = encode_control_message(state, keys=outbox.keys, recipient=peer.name,
                                                     incarnation=identity.incarnation, seal_to=self.seal_to(peer))
                except CodecError as error:
                    failed.append((peer, error))
                    continue
                outbox.queues.put_outbound(peer.name, message.name, message.data, None)
        return failed
