"""The asyncio agent: drives one :class:`~agent.protocol.PairProtocol` per peer
with the site database, the message queues and the transports.

A thin adapter.  The rules live in the sans-I/O core (agent.protocol;
agent.schedule and agent.controls for what is due when) and in one module
per hop: agent.receiving, agent.resuming, agent.applying, agent.sending
(with agent.preparing) and agent.delivering; agent.pairs owns each pair's
persisted state.  This file opens the site, hands each hop its narrow
context (agent.contexts), runs the phases of a batch or continuous run,
asks the core what is due, and carries out what the hops hand back: it
alone executes, releases and saves.

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
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from codec.keys import Keyring
from transports import Transport

from . import applying, working_set
from .contexts import Applier, Inbox, Outbox, Step, stamp
from .delivering import Deliverer
from .errors import AgentError
from .keyfiles import agent_directory, load_site_keys, open_site_database
from .site.locate import is_uri
from .left_files import LeftFiles
from .pairs import PairStore, Peer
from .protocol import Apply, DeleteInbound, PurgeOutbound, Quarantine, SendControl, SendData, StreamStopped
from .quarantine import QuarantineStore, SetAside
from .queues import MessageQueues, log_restart, open_queues
from .receiving import Receiver
from .restore import check_restored
from .resuming import Resumer
from .run_options import Problems, RunOptions, RunReport
from .schedule import PhaseSchedule, TruncationSchedule
from .sending import Sender
from .signals import stop_on_signals
from .transport_pool import TransportPool

log = logging.getLogger("fieldsync.agent")

__all__ = ["Agent", "Problems", "RunOptions", "RunReport", "agent_directory", "open_queues", "run_agent"]


class Agent:
    """One site's agent.  Use as ``async with Agent(path, options) as agent``.

    ``clock`` is the agent's only clock (seconds since the epoch): the
    protocol's timers, the send schedules and every time it records (in
    the database, its state files, the quarantine) read it.
    """

    def __init__(self, database: str | os.PathLike[str], options: RunOptions | None = None, *,
                 batch: bool = True, clock: Callable[[], float] = time.time,
                 queues: MessageQueues | None = None) -> None:
        self.path: str | Path = database if is_uri(database) else Path(database)  # a URI stays its text
        options = options or RunOptions()
        if options.spark.cancel is None:
            # A Spark job runs in a worker thread that cancelling the agent's
            # task does not reach: the agent needs its own event to stop it.
            options = replace(options, spark=replace(options.spark, cancel=threading.Event()))
        self.options = options
        self.batch = batch
        self.settings = options.settings(batch)  # the pairs' protocol settings
        self.clock = clock
        self.directory = agent_directory(self.path)
        self._queues = queues
        self.peers: dict[str, Peer] = {}
        self.report = RunReport()
        self._closed = False
        self._held = contextlib.ExitStack()  # the open site and its agent lock
        self._told_queued = False  # the pairs' protocols know the inbound messages earlier runs queued
        self._truncation = TruncationSchedule()
        self.quarantine = QuarantineStore(self.directory / "quarantine", options.quarantine, clock=clock)
        self.aside = SetAside(self.quarantine)

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
        if isinstance(self.path, Path) and not self.path.exists():
            raise AgentError(f"{self.path}: no such site database (create one with `agent init`)")
        self.db = open_site_database(self.path)
        self._held.callback(self.db.close)  # closed once its agent lock is released (entered next)
        self._held.enter_context(self.db.agent_lock())
        identity = self.db.identity
        self.name = identity.name
        self.keys = load_site_keys(self.db)
        self.address = self.options.address or identity.address
        self._pool = TransportPool(self.options, self.db.all_transport_options(), identity.transport,
                                   clock=self.clock)
        self.left = LeftFiles(self.directory / "state" / "left.json", self.address)
        for table in self.db.missing_tables():
            log.warning("published table %r is no longer in %s (renamed or dropped?): give it back its name, or "
                        "stop publishing it with `agent publication remove %s %s`", table, self.path, self.path, table)
        (self.directory / "state").mkdir(parents=True, exist_ok=True)
        self.quarantine.secure()
        # The spool first: a run refused because another agent holds it
        # (or it cannot be read) must not count as a run.
        if self._queues is None:
            self._queues = open_queues(self.path, self.clock)
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
        if self.batch:  # only the pairs with work (agent.working_set)
            working_set.load_at_start(self.pairs, self.peers, self.settings, self._queues)
        else:
            self.pairs.load(self.peers, self.settings)
        # Each hop is given what it uses, and nothing of the agent itself.
        queues, report, clock = self._queues, self.report, self.clock
        inbox = Inbox(self.name, self.keys, self.keyring, self.peers, queues, self.left, self.aside, report, clock,
                      keep=self.options.keep, load_peer=self._load_peer)
        self.receiver, self.resumer = Receiver(inbox), Resumer(inbox)
        self.applier = Applier(self.name, self.keys, self.keyring, queues, self.db, report, clock)
        outbox = Outbox(self.db, self.keys, self.peers, queues, self._pool, self.options, report, self.directory,
                        clock, batch=self.batch)
        self.sender, self.deliverer = Sender(outbox), Deliverer(outbox)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            pool = getattr(self, "_pool", None)  # made as the agent opens
            if pool is not None:
                await pool.aclose()
        finally:
            if self._queues is not None:
                await asyncio.to_thread(self._queues.close)
            await asyncio.to_thread(self._held.close)  # the site: its agent lock, then its connection

    @property
    def transports(self) -> dict[tuple[str, str | None], Transport]:
        """The transports this agent opened, by (spec, peer with options of its own)."""
        pool = getattr(self, "_pool", None)
        return {} if pool is None else pool.opened

    @property
    def queues(self) -> MessageQueues:
        assert self._queues is not None
        return self._queues

    def transport_for(self, name: str | None, peer: str | None = None) -> Transport:
        """The transport to ``peer`` whose remote row names ``name``; see agent.transport_pool."""
        return self._pool.transport_for(name, peer)

    def stop_spark(self) -> None:
        """Stop a running Spark job and keep new ones from starting: the agent
        is stopping.  Safe from any thread."""
        assert self.options.spark.cancel is not None
        self.options.spark.cancel.set()

    # -- running ------------------------------------------------------------------------

    async def _refresh(self) -> None:
        """Pick up remotes added, removed or extracted again (a batch run: the pairs with queued
        messages); at the first call, and after such a change, tell the protocols what is queued."""
        if self.batch:
            await asyncio.to_thread(working_set.load_at_start, self.pairs, self.peers, self.settings, self.queues)
        elif await asyncio.to_thread(self.pairs.load, self.peers, self.settings):
            self._told_queued = False
        await self._tell_queued()

    def _load_peer(self, name: str) -> Peer | None:
        """Blocking: the peer ``name``, built if it is not yet (a file of it arrived)."""
        self.pairs.load_named(self.peers, [name], self.settings)
        return self.peers.get(name)

    async def _tell_queued(self) -> None:
        """Once (again after a change of remotes): tell the protocols what earlier runs queued (agent.resuming)."""
        if not self._told_queued:
            self._told_queued = True
            await self._carry_out_steps(self.resumer.tell_queued())

    async def run_once(self) -> RunReport:
        """Batch mode: receive and apply everything available, send what is
        due, confirm, flush the outbound queues, truncate the log."""
        await self._refresh()
        if self.options.receive:
            await self.receive_phase()
        if self.options.send:
            await self.send_phase(force_controls=False)
        await self.flush_outbound()
        await self._truncate_when_due(run_ends=True)
        return self.report

    async def run_forever(self, stop: asyncio.Event) -> RunReport:
        """Continuous mode until ``stop`` is set: receive every receive delay
        (sooner when the transport signals new files), send every send delay."""
        await self._tell_queued()
        options = self.options
        phases = PhaseSchedule(self.clock(), receive_every=options.receive_delay if options.receive else None,
                               send_every=options.send_delay if options.send else None)
        while not stop.is_set():
            now = self.clock()
            if phases.receive_due(now):
                await self._refresh()
                await self.receive_phase()
            if phases.send_due(now):
                await self.send_phase(force_controls=False)
            await self._timers()
            await self.flush_outbound()
            horizon = await self._truncate_when_due()
            await asyncio.to_thread(self.queues.at_rest)  # `agent status` reads a current spool summary meanwhile
            deadline = phases.deadline(self._truncation.deadline(horizon),
                                       *(peer.protocol.get_timer() for peer in self.peers.values()))
            address = self.address if options.receive else None  # None: wait without the transport
            if await self._pool.wait_incoming(address, stop, max(0.0, deadline - self.clock())):
                phases.files_arrived(self.clock())  # the transport says files arrived: receive them now
        await self.flush_outbound()
        return self.report

    async def _truncate_when_due(self, *, run_ends: bool = False) -> int | None:
        """Rule 8: truncate the log when the core says so (TruncationSchedule);
        tell the protocols where the log starts now; return the horizon."""
        horizon = min((peer.protocol.state.horizon for peer in self.peers.values()), default=None)
        now = self.clock()
        if self._truncation.due(now, horizon, run_ends=run_ends):  # the database finds the horizon of every row
            log_start = await asyncio.to_thread(self.db.truncate_log)
            for peer in self.peers.values():
                peer.protocol.log_truncated(log_start)
            self._truncation.truncated(now, horizon)
        return horizon

    async def _timers(self) -> None:
        """Fire the protocols' timers that are due (a resend asked for, rule
        7): the one place the runner fires them (a send phase's send_due too)."""
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
        await self._carry_out_steps(self.receiver.receive(self.transport_for(self._pool.own), self.address))
        for peer in self.peers.values():
            await self.execute(peer, peer.protocol.poll(self.clock()))
        await self.save_all()  # what only the files' arrival changed (heard_at)

    async def send_phase(self, *, force_controls: bool) -> None:
        """Send what is due and confirm, in the steps of agent.sending: ask
        every pair for its send, make and record the sends, then queue the
        control messages due once the pairs are saved."""
        now = self.clock()
        if self.batch or force_controls:  # build the pairs with work (every pair: all are confirmed)
            await asyncio.to_thread(working_set.load_for_sends, self.pairs, self.peers, self.settings, self.options,
                                    now=now, everyone=force_controls)
        due = await self.sender.due(now)
        sends = [(item.peer, item.send) for item in due if item.send is not None]
        try:
            for item in due:
                if item.actions:  # a resend's purge; the state of the others is saved with the phase's
                    await self.execute(item.peer, item.actions)
            for (peer, _), actions in zip(sends, await self.sender.make(sends)):
                if actions:  # rare (a resend that waited for this send); else the state is saved below
                    await self.execute(peer, actions)
            controls = self.sender.controls(now, [item.peer for item in due], force=force_controls)
            await self.save_all()  # the pairs' state is durable before the controls it led to leave
            if controls:
                await self.sender.queue_controls(controls)
        except BaseException:
            # Cancelled or failed before every send was recorded: the sends not
            # recorded are given back, so this agent's next send phase starts them.
            for peer, send in sends:
                self.release(peer, [send])
            raise

    async def flush_outbound(self) -> None:
        """Hand queued outbound files to the transports (agent.delivering)."""
        await self.deliverer.flush()

    # -- carrying out actions ------------------------------------------------------------

    async def _carry_out_steps(self, steps: AsyncGenerator[Step, None]) -> None:
        """Carry out what a hop hands back, step by step, before it takes its next."""
        async with contextlib.aclosing(steps):
            async for peer, actions in steps:
                await self.execute(peer, actions)

    async def execute(self, peer: Peer, actions: Iterable[Any]) -> None:
        """Carry out ``actions`` in order, with what each leads to; the
        pair's state is saved before each action and after the last."""
        work = deque(actions)
        try:
            await self._carry_out(peer, work)
        except BaseException:
            # Cancelled or failed half-way: the Apply or SendData not finished (work[0] is
            # the one under way) are given back, for the next poll or send phase to start again.
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
        """Carry out one Apply as one unit (agent.applying, I4): cancelled, it
        is finished first, what it led to given back, and the cancellation goes on."""
        applying_now = asyncio.ensure_future(applying.apply(self.applier, peer, action))
        try:
            return await asyncio.shield(applying_now)
        except asyncio.CancelledError:
            self.release(peer, await applying_now)
            raise

    async def save_all(self) -> None:
        """Persist every pair whose state changed: one hop, one transaction."""
        dirty = [peer for peer in self.peers.values() if self.pairs.dirty(peer)]
        if dirty:
            await asyncio.to_thread(self.pairs.save, dirty)

    async def _save(self, peer: Peer) -> None:
        """Persist a pair's state when it changed (an idle poll costs no thread
        hop); a new ``heard_at`` alone waits for the phase's end (:meth:`save_all`)."""
        if self.pairs.dirty(peer, heard=False):
            await asyncio.to_thread(self.pairs.save, [peer])

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
                await asyncio.to_thread(self.resumer.quarantine, peer.name, action)
            elif isinstance(action, SendData):
                more = await self.sender.send_one(peer, action)
            elif isinstance(action, PurgeOutbound):
                await asyncio.to_thread(self.queues.purge_outbound, peer.name, action.below_resend_count)
            elif isinstance(action, SendControl):
                await self.sender.queue_controls([(peer, action)])
            elif isinstance(action, StreamStopped):
                message = action.describe(peer.name)
                log.error("%s", message)
                self.report.stopped_streams.append(message)
                await asyncio.to_thread(self.db.record_stream_stopped, peer.name, message, now=stamp(self.clock()))
            else:  # pragma: no cover - the protocol has no other actions
                raise AgentError(f"unknown action {action!r}")
            work.popleft()
            work.extendleft(reversed(more))
        await self._save(peer)


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
        with stop_on_signals(stop, agent.stop_spark):
            return await agent.run_forever(stop)
