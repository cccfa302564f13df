"""The asyncio agent: drives one :class:`~agent.protocol.PairProtocol` per peer
with the site database, the message queues and the transports.

A thin adapter: the rules live in the protocol core (agent.protocol) and
in one module per hop of a message: agent.receiving (inbox to inbound
queue), agent.applying (inbound queue to database), agent.sending (log to
outbound queue, and on to the transports); agent.pairs owns each pair's
persisted state, agent.quarantine the files set aside.  This file opens
and closes them, runs the phases of a batch or continuous run, and carries
out the protocol's actions.

Rules of this file:
* Blocking work (sqlite3, file queues, packing) runs in threads via
  ``asyncio.to_thread``; nothing blocking runs on the event loop.
* Events are handled one at a time, in one task: the protocol core sees a
  strictly sequential history, and actions are carried out in order.
* A pair's state is persisted before the actions that follow a change are
  carried out, and again after them.
* A file is acknowledged to the transport only once it is durably queued
  (or durably quarantined).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from codec.keys import Keyring
from transports import Transport, TransportError

from . import applying
from .errors import AgentError
from .keyfiles import agent_directory, load_site_keys, open_site
from .left_files import LeftFiles
from .pairs import PairStore, Peer
from .protocol import Apply, DeleteInbound, PurgeOutbound, Quarantine, SendControl, SendData, StreamStopped
from .quarantine import QuarantineStore, SetAside
from .queues import MessageQueues, log_restart, open_queues
from .run_options import Problems, RunOptions, RunReport
from .receiving import Receiver
from .restore import check_restored
from .schedule import TruncationSchedule
from .sending import Sender
from .transport_options import TransportOptions

log = logging.getLogger("fieldsync.agent")

__all__ = ["Agent", "Problems", "RunOptions", "RunReport", "agent_directory", "open_queues", "run_agent"]


class Agent:
    """One site's agent.  Use as ``async with Agent(path, options) as agent``.

    ``clock`` is the agent's only clock (seconds since the epoch): the
    protocol's timers, the send schedules and the times it records read it.
    """

    def __init__(self, database: str | os.PathLike[str], options: RunOptions | None = None, *,
                 batch: bool = True, clock: Callable[[], float] = time.time,
                 queues: MessageQueues | None = None) -> None:
        self.path = Path(database)
        options = options or RunOptions()
        if options.spark.cancel is None:
            # A Spark job runs in a worker thread that cancelling the agent's
            # task does not reach: the agent needs its own event to stop it.
            options = replace(options, spark=replace(options.spark, cancel=threading.Event()))
        self.options = options
        self.batch = batch
        self.clock = clock
        self.directory = agent_directory(self.path)
        self._queues = queues
        self._transports: dict[str, Transport] = {}
        self.peers: dict[str, Peer] = {}
        self.report = RunReport()
        self._wait_failures = 0
        self._wait_failing_until = 0.0
        self._closed = False
        self._restored = False
        self._truncation = TruncationSchedule()
        self.quarantine = QuarantineStore(self.directory / "quarantine", options.quarantine, clock=clock)
        self.aside = SetAside(self.quarantine)
        self.receiver = Receiver(self)
        self.sender = Sender(self)

    # -- life cycle ------------------------------------------------------------------

    async def __aenter__(self) -> "Agent":
        try:
            await asyncio.to_thread(self._open)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _open(self) -> None:
        if not self.path.exists():
            raise AgentError(f"{self.path}: no such site database (create one with `agent init`)")
        self.db = open_site(self.path)
        identity = self.db.identity
        self.name = identity.name
        self.keys = load_site_keys(self.db)
        self.address = self.options.address or identity.address
        self.stored_options = self.db.all_transport_options()
        self.left = LeftFiles(self.directory / "state" / "left.json", self.address)
        for table in self.db.missing_tables():
            log.warning("published table %r is no longer in %s (renamed or dropped?): give it back its name, or "
                        "stop publishing it with `agent publication remove %s %s`", table, self.path, self.path, table)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "state").mkdir(exist_ok=True)
        self.quarantine.secure()
        # The spool first: a run refused because another agent holds it
        # (or it cannot be read) must not count as a run.
        if self._queues is None:
            self._queues = open_queues(self.path)
        else:
            log_restart(self._queues)
        old = check_restored(self.db, self.directory)
        if old is not None:
            log.error("%s was restored from an older copy: it now has a new incarnation id; its peers will "
                      "stop its streams until it is extracted again", self.path)
            self.report.stopped_streams.append(f"{self.name} was restored from an older copy (new incarnation "
                                               f"{self.db.identity.incarnation.hex()[:8]})")
        self.keyring = Keyring()
        self.pairs = PairStore(self.db, self.directory / "state", self.keyring)
        self.pairs.load(self.peers, self.options.settings(self.batch))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(10):
                for transport in self._transports.values():
                    await transport.aclose()
        finally:
            if self._queues is not None:
                await asyncio.to_thread(self._queues.close)
            db = getattr(self, "db", None)
            if db is not None:
                await asyncio.to_thread(db.close)

    @property
    def transports(self) -> dict[tuple[str, str | None], Transport]:
        """The transports this agent opened, by (spec, peer with options of its own) (tests and tools)."""
        return self._transports

    @property
    def queues(self) -> MessageQueues:
        assert self._queues is not None
        return self._queues

    def transport_for(self, name: str | None, peer: str | None = None) -> Transport:
        """The transport to ``peer`` whose remote row names ``name`` (``None``:
        this site's own, which it receives on); ``--transport`` overrides
        both.  One per spec (and per peer that has options of its own),
        built with the options that are its: stored with the site, stored
        for the peer, then the run's -O (agent.transport_options)."""
        spec = self.options.transport or name or "folder"
        own_options = self.stored_options.get(peer, {}) if peer is not None else {}
        key = (spec, peer) if own_options else (spec, None)
        transport = self._transports.get(key)
        if transport is None:
            from transports.registry import parse_transport_spec

            run = TransportOptions(self.options.transport_options, self.options.named_options)
            stored = TransportOptions.from_stored(self.stored_options.get("", {}))
            if own_options:
                plugin = parse_transport_spec(spec).inner
                stored = TransportOptions.from_stored(own_options, plugin=plugin).over(stored)
            transport = run.over(stored).create(spec, own=self.own_transport)
            self._transports[key] = transport
        return transport

    @property
    def own_transport(self) -> str:
        """The spec of the transport this site receives on."""
        return self.options.transport or self.db.identity.transport or "folder"

    def stop_spark(self) -> None:
        """Stop a running Spark job (its processes killed, its folder
        deleted) and keep new ones from starting: the agent is stopping.
        Safe from any thread."""
        assert self.options.spark.cancel is not None
        self.options.spark.cancel.set()

    # -- running ------------------------------------------------------------------------

    async def _refresh(self) -> None:
        """Pick up remotes added, removed or extracted again; at the first
        call, and after such a change, tell the protocols what is queued."""
        settings = self.options.settings(self.batch)
        if await asyncio.to_thread(self.pairs.load, self.peers, settings):
            self._restored = False
        if not self._restored:
            self._restored = True
            await self.receiver.restore_pending()

    async def run_once(self) -> RunReport:
        """Batch mode: receive and apply everything available, send what is
        due, confirm, flush the outbound queues."""
        await self._refresh()
        if self.options.receive:
            await self.receive_phase()
        if self.options.send:
            await self.send_phase(force_controls=False)
        await self.flush_outbound()
        await asyncio.to_thread(self.db.truncate_log)
        return self.report

    async def run_forever(self, stop: asyncio.Event) -> RunReport:
        """Continuous mode until ``stop`` is set: receive every receive delay
        (sooner when the transport signals new files), send every send delay."""
        if not self._restored:
            self._restored = True
            await self.receiver.restore_pending()
        next_receive = next_send = self.clock()
        while not stop.is_set():
            now = self.clock()
            if self.options.receive and now >= next_receive:
                await self._refresh()
                await self.receive_phase()
                next_receive = now + self.options.receive_delay
            if self.options.send and now >= next_send:
                await self.send_phase(force_controls=False)
                next_send = now + self.options.send_delay
            await self._timers()
            await self.flush_outbound()
            horizon = await self._truncate_when_due()
            deadline = min(next_receive if self.options.receive else float("inf"),
                           next_send if self.options.send else float("inf"))
            for timer in (self._next_timer(), self._truncation.deadline(horizon)):
                if timer is not None:
                    deadline = min(deadline, timer)
            if await self._wait(stop, max(0.0, deadline - self.clock())):
                next_receive = self.clock()  # the transport says files arrived: receive them now
        await self.flush_outbound()
        return self.report

    async def _wait(self, stop: asyncio.Event, timeout: float) -> bool:
        """Wait until ``stop``, the timeout, or the transport's word that files
        arrived (True).  A transport that cannot wait (its server is gone) is
        one warning line, then plain sleeps until it can again."""
        if timeout <= 0:
            return False
        waiter = asyncio.ensure_future(stop.wait())
        arrived = False
        try:
            if self.options.receive and self.address and self._wait_failing_until <= self.clock():
                incoming = asyncio.ensure_future(
                    self.transport_for(self.own_transport).wait_incoming(self.address, timeout))
                try:
                    await asyncio.wait({waiter, incoming}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    incoming.cancel()
                    try:
                        arrived = await incoming
                        self._wait_failures = 0
                    except asyncio.CancelledError:
                        pass
                    except TransportError as error:
                        self._wait_failed(error)
            if not arrived and not waiter.done():
                await asyncio.wait({waiter}, timeout=max(0.0, min(timeout, self._wait_failing_until - self.clock())))
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        return arrived

    def _wait_failed(self, error: TransportError) -> None:
        """Back off 5 s, 10 s ... 5 min before waiting on the transport again; warn once per outage."""
        self._wait_failures += 1
        delay = min(300.0, 5.0 * 2 ** (self._wait_failures - 1))
        self._wait_failing_until = self.clock() + delay
        if self._wait_failures == 1:
            log.warning("%s; receiving on schedule and trying again with backoff", error)
        else:
            log.debug("%s; trying again in %.0f s", error, delay)

    async def _truncate_when_due(self) -> int | None:
        """Rule 8 in continuous mode: truncate the log once a confirmation
        (or a range read with nothing for a peer) moved the smallest horizon,
        at most every TRUNCATE_EVERY seconds; return that horizon."""
        horizon = min((peer.protocol.state.horizon for peer in self.peers.values()), default=None)
        now = self.clock()
        if self._truncation.due(now, horizon):
            assert horizon is not None
            log_start = await asyncio.to_thread(self.db.truncate_log)
            for peer in self.peers.values():
                peer.protocol.log_truncated(log_start)
            self._truncation.truncated(now, horizon)
        return horizon

    def _next_timer(self) -> float | None:
        timers = [t for p in self.peers.values() if (t := p.protocol.get_timer()) is not None]
        return min(timers, default=None)

    async def _timers(self) -> None:
        now = self.clock()
        for peer in self.peers.values():
            timer = peer.protocol.get_timer()
            if timer is not None and timer <= now:
                await self.execute(peer, peer.protocol.handle_timer(now))

    async def receive_phase(self) -> None:
        """Take in the files at this site's inbox (agent.receiving), then
        poll every pair: apply what became applicable, look for gaps."""
        if not self.address:
            raise AgentError(f"site {self.name} has no inbox address; set one with --address")
        await self.receiver.receive(self.transport_for(self.own_transport), self.address)
        for peer in self.peers.values():
            await self.execute(peer, peer.protocol.poll(self.clock()))
        await self.save_all()  # what only the files' arrival changed (heard_at)

    async def send_phase(self, *, force_controls: bool) -> None:
        """Send what is due and confirm (agent.sending)."""
        await self.sender.send_phase(force_controls=force_controls)

    async def flush_outbound(self) -> None:
        """Hand queued outbound files to the transports (agent.sending)."""
        await self.sender.flush()

    # -- carrying out actions ------------------------------------------------------------

    async def execute(self, peer: Peer, actions: Iterable[Any]) -> None:
        """Carry out ``actions`` in order, with what each leads to; the
        pair's state is saved before each action and after the last."""
        work = deque(actions)
        try:
            await self._carry_out(peer, work)
        except BaseException:
            # Cancelled or failed half-way: the Apply or SendData the protocol
            # handed out and this did not finish (work[0] is the one under
            # way) are given back to it, so that the agent's next poll or
            # send phase starts them again.
            self.release(peer, work)
            raise

    def release(self, peer: Peer, actions: Iterable[Any]) -> None:
        """Give back to the protocol the Apply and SendData of ``actions``,
        which will not be carried out; the other actions are dropped (their
        effects are derived again: duplicates are deleted at the next
        restart, confirmations go out at the next send phase)."""
        now = self.clock()
        for action in actions:
            if isinstance(action, Apply) and peer.protocol.applying == action:
                peer.protocol.apply_aborted(now)
            elif isinstance(action, SendData) and peer.protocol.sending == action:
                peer.protocol.send_aborted(now)

    async def apply(self, peer: Peer, action: Apply) -> list[Any]:
        """Carry out one Apply as one unit (agent.applying)."""
        return await applying.apply(self, peer, action)

    async def save_all(self) -> None:
        """Persist every pair whose state changed: one hop, one transaction."""
        dirty = [peer for peer in self.peers.values() if self.pairs.dirty(peer)]
        if dirty:
            await asyncio.to_thread(self.pairs.save_many, dirty)

    async def _save(self, peer: Peer) -> None:
        """Persist a pair's state when it changed (an idle poll costs no
        thread hop); a new ``heard_at`` alone waits for the phase's end
        (:meth:`save_all`)."""
        if self.pairs.dirty(peer, heard=False):
            await asyncio.to_thread(self.pairs.save, peer)

    async def _carry_out(self, peer: Peer, work: deque[Any]) -> None:
        while work:
            action = work[0]
            await self._save(peer)
            more: list[Any] = []
            if isinstance(action, Apply):
                more = await self.apply(peer, action)
            elif isinstance(action, DeleteInbound):
                await asyncio.to_thread(self.queues.delete_inbound, peer.name, action.message_ids)
            elif isinstance(action, Quarantine):
                await asyncio.to_thread(self._quarantine_queued, peer.name, action)
            elif isinstance(action, SendData):
                more = await self.sender.send_one(peer, action)
            elif isinstance(action, PurgeOutbound):
                await asyncio.to_thread(self.queues.purge_outbound, peer.name, action.below_resend_count)
            elif isinstance(action, SendControl):
                await self.sender.queue_control(peer, action)
            elif isinstance(action, StreamStopped):
                message = (f"{peer.name} changed its incarnation id ({action.expected.hex()[:8]} -> "
                           f"{action.received.hex()[:8]}): its stream is stopped; re-extract the remote "
                           "or re-add it")
                log.error("%s", message)
                self.report.stopped_streams.append(message)
                await asyncio.to_thread(self.db.record_stream_stopped, peer.name, message)
            else:  # pragma: no cover - the protocol has no other actions
                raise AgentError(f"unknown action {action!r}")
            work.popleft()
            work.extendleft(reversed(more))
        await self._save(peer)

    def _quarantine_queued(self, peer: str, action: Quarantine) -> None:
        if action.message_id in self.queues.inbound(peer):
            data = self.queues.read_inbound(peer, action.message_id)
            self.set_aside_now(peer, action.message_id, data, action.reason)
            self.queues.delete_inbound(peer, [action.message_id])

    def set_aside_now(self, peer: str | None, name: str, data: bytes, reason: str) -> None:
        """Blocking: put a queued message that can never be applied into the quarantine, counted."""
        self.quarantine.put(peer, name, data, reason)
        self.report.quarantined += 1
        self.report.quarantine_dropped = self.quarantine.dropped


async def run_agent(database: str | os.PathLike[str], options: RunOptions, *, once: bool,
                    on_open: Callable[[Agent], None] | None = None) -> RunReport:
    """Run an agent in batch or continuous mode.  ``on_open(agent)`` is
    called on the event loop once the agent is open, before it runs (the
    metrics endpoint reads the agent it is given).

    In continuous mode SIGINT or SIGTERM stop the agent cleanly after the
    current step, and stop a running Spark job at once (its sends are left
    for the next run); a second signal gets the default action.
    """
    async with Agent(database, options, batch=once) as agent:
        if on_open is not None:
            on_open(agent)
        if once:
            return await agent.run_once()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)

        def restore_handlers() -> None:
            for signum in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signum)

        def stopping() -> None:
            stop.set()
            agent.stop_spark()
            restore_handlers()

        for signum in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, stopping)
        try:
            return await agent.run_forever(stop)
        finally:
            restore_handlers()
